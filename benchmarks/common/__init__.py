"""What the benchmark drivers share.

* ``machine`` -- the machine line every results file starts with (cores, RAM, GPU, versions, date)
* ``harness`` -- the B1 gossip benchmarks' launch side: synthetic records, peer processes (exec'd, forked or from a
  zygote), the run and the sweep over sizes and repeats, the command line
* ``summary`` -- the B1 gossip benchmarks' statistics: per-run metrics, medians, ratios, the Markdown table

Layers, top to bottom: ``summary`` -> ``harness`` -> ``machine``. Imports neither hivemind nor libp2p.
"""
