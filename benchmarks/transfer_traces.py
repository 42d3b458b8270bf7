"""``python benchmarks/transfer_traces.py RUN_DIR --family lab_sub``: how much of each node's right working is the
generator's trace word for word, and its held-out exact by problem shape (``sim.report.traces``, docs/transfer.md)."""

from sim.report.traces import main

if __name__ == "__main__":
    main()
