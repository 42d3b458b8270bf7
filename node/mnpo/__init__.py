"""The node's MNPO phase: multiplayer preference optimization against the swarm's population of policies.

* ``phase``   -- :class:`MnpoPhase`: shared window prompts, responses out in the node's records, cross-scores in and
  out (``scores`` records), preference pairs, opponents (peers or own history), the update through the learner
* ``oracles`` -- preference oracles: the verifier, a reward model, a synthetic non-transitive one (the B6 game)

Layers, top to bottom: ``phase`` -> ``oracles``. The population logic without a model (pairs, opponent choice, score
books) is ``swarm.mnpo``. Public names resolve lazily.
"""

from protocol.lazy import lazy_exports

__all__ = ["MnpoPhase", "PreferenceOracle", "build_oracle"]
__getattr__ = lazy_exports(__name__, {"MnpoPhase": "phase", "PreferenceOracle": "oracles", "build_oracle": "oracles"})
