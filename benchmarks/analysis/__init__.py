"""Readers of the benchmarks' run directories: the tables, ratios and plots their results files are made of.

* ``sapo_b4`` -- B4: SAPO's own-rollout, held-out and training-batch rewards paired by seed against 8/0, the
  ablations, the learning-rate sweep, the ceiling on what sharing could buy, "aha" propagation

(B6's readers belong to its experiment: ``sim.experiments.mnpo_game``.)
"""
