"""The simulator's reports, read back from run directories (no torch).

* ``summary``  -- results.csv / results.md / rewards.png: cumulative and held-out reward per configuration, by seed
* ``html``     -- the self-contained report.html (tables, inline SVG curves, per-node detail)
* ``progress`` -- progress lines (configuration, seed, step k/N, ETA) on stderr
* ``peers``    -- what peers' completions weighed in each node's updates, per family (``benchmarks/transfer_dev.py``)

Layers, top to bottom: ``summary`` -> ``html``; ``progress`` and ``peers`` stand alone.
"""

from sim.report.html import write_html_report
from sim.report.progress import StepProgress
from sim.report.summary import collect, md_table, write_report

__all__ = ["StepProgress", "collect", "md_table", "write_html_report", "write_report"]
