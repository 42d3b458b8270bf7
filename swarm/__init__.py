"""Population logic, model-free: the rollout pool, SAPO mixing of own and peers' groups, MNPO, prompt selection.

* ``pool``   -- bounded pool of own and peers' groups with age and source
* ``sapo``   -- SAPO sampling: I local + J external groups, re-scored by the receiver, per-peer caps
* ``scores`` -- the signed ``scores`` record kind (MNPO cross-scores: a player's logprobs on pooled responses)
* ``evals``  -- the signed ``eval`` record kind (a node's held-out evaluation summary, for dashboards)
* ``mnpo``   -- MNPO windows, response store, peers' scores, opponent and pair choice (TD / HT)
* ``vade``   -- VADE prompt selection: per-prompt Beta posteriors, Thompson sampling, information score

Layers, top to bottom: ``sapo`` | ``mnpo`` | ``vade`` -> ``pool`` | ``scores`` | ``evals``; all on ``protocol``.

Never imports torch, transformers or hivemind. Public names resolve lazily.
"""

from protocol.lazy import lazy_exports

__all__ = [
    "PooledGroup",
    "RolloutPool",
    "SapoBatch",
    "SapoSampler",
    "ScoreBook",
    "VadeSelector",
    "choose_pairs",
    "dart_rollouts",
    "ingest_rollouts",
    "select_opponents",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "ScoreBook": "mnpo",
        "choose_pairs": "mnpo",
        "select_opponents": "mnpo",
        "PooledGroup": "pool",
        "RolloutPool": "pool",
        "SapoBatch": "sapo",
        "SapoSampler": "sapo",
        "ingest_rollouts": "sapo",
        "VadeSelector": "vade",
        "dart_rollouts": "vade",
    },
)
