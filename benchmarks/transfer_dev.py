"""``python benchmarks/transfer_dev.py RUN_DIR``: peers' completions per family in a run's learner updates
(``sim.report.peers``, docs/transfer.md)."""

from sim.report.peers import main

if __name__ == "__main__":
    main()
