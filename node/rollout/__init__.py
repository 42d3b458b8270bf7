"""Prompt -> completions: the one generation path of a node, from prompt selection to scored own groups.

* ``planner``     -- the only caller of the engine for training rollouts: which prompts (uniform or VADE), how many
  completions each (G or DART), generated plainly or with APRIL; the MNPO phase asks it too
* ``april``       -- APRIL partial rollouts: over-provision, stop when enough groups are complete, buffer the rest
* ``engine``      -- the rollout engine interface, its generation settings, and the transformers backend (batched, KV
  cache, per-token behaviour logprobs)
* ``engine_vllm`` -- the vLLM backend (optional extra), in the node's process or as a rollout server
* ``groups``      -- rollout -> record: scored own groups and their wire completions, engine tokens kept beside

Layers, top to bottom: ``planner`` -> ``april`` -> ``engine_vllm`` -> ``engine``; ``groups`` stands alone. Public
names resolve lazily (the planner stays importable without torch).
"""

from protocol.lazy import lazy_exports

__all__ = [
    "GenerationSettings",
    "OwnRollouts",
    "Planner",
    "RolloutEngine",
    "RolloutPlanner",
    "TransformersEngine",
    "UniformPlanner",
    "own_rollouts",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "Planner": "planner",
        "RolloutPlanner": "planner",
        "UniformPlanner": "planner",
        "GenerationSettings": "engine",
        "RolloutEngine": "engine",
        "TransformersEngine": "engine",
        "OwnRollouts": "groups",
        "own_rollouts": "groups",
    },
)
