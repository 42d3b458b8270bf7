"""Experiments built on the simulator: their own metrics and reports, read from run directories.

* ``mnpo`` -- B6: the MNPO population game (non-transitive oracle; win rate and duality gap per method) and the
  per-method table of the real-node MNPO runs
* ``sapo`` -- B4: SAPO's own-rollout, held-out and training-batch rewards, paired by seed against 8/0; ablations;
  "aha" propagation
"""
