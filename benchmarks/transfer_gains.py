"""``python benchmarks/transfer_gains.py configs/sim/transfer-het.yaml --arm peer-trace``: each node's gain on the
family it lacks against its peer's lead, and what that does to the gap-closed ratio (``sim.report.gains``,
docs/transfer.md)."""

from sim.report.gains import main

if __name__ == "__main__":
    main()
