"""Experiments the simulator runs itself (``swarm-sim run`` with an experiment section), beside its plain runs.

* ``mnpo_game`` -- B6: the MNPO population game (non-transitive oracle; win rate and duality gap per method) and
  the per-method table of the real-node MNPO runs

Registered learning experiments run through ``sim.driver``.
"""

from sim.experiments.mnpo_game import run_game, run_mnpo_report

__all__ = ["run_game", "run_mnpo_report"]
