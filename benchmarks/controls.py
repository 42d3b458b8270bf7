"""Controls: does a peer's completion carry something a node cannot get alone? (the sharing comparison)

The registrations are data now: ``configs/sim/controls-{het,homo,smol}.yaml``, each with its ``registration:``
block (arms, seeds, metrics, readout, target; the amendments since), run by the one experiment driver::

    swarm-sim experiment configs/sim/controls-het.yaml --workers 2     # runs what is missing, then reports
    swarm-sim experiment configs/sim/controls-het.yaml --analyze       # re-read the result JSON only

This command is kept so the commands the docs cite still work: ``--setting X`` is that YAML, the rest is passed on.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    from sim.driver.main import main as experiment

    setting = "het"
    if "--setting" in argv:
        at = argv.index("--setting")
        setting, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    return experiment([str(ROOT / "configs" / "sim" / f"controls-{setting}.yaml"), *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
