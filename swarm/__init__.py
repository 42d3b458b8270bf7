"""Population logic, model-free: the rollout pool, SAPO mixing of own and peers' groups, trust.

* ``pool`` -- bounded pool of own and peers' groups with age and source
* ``sapo`` -- SAPO sampling: I local + J external groups, re-scored by the receiver, per-peer caps

Never imports torch, transformers or hivemind.
"""
