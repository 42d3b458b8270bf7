"""Samples -> update: the node's local learner and what it writes to disk.

* ``batch``      -- batch -> samples: re-tokenize peers' text once, advantages computed once, behaviour hints clamped
* ``losses``     -- pure loss functions (GRPO family, truncated IS, MNPO, DPO) and their registry keyed by ``type``
* ``learner``    -- the one owner of the weights: optimizer, micro-batching, importance weights, policy version
* ``checkpoint`` -- atomic safetensors checkpoints and resume

Layers, top to bottom: ``checkpoint`` -> ``learner`` -> ``losses``; ``batch`` beside them (it uses the seams only).
Public names resolve lazily (torch is imported on first use).
"""

from protocol.lazy import lazy_exports

__all__ = ["LOSSES", "Learner", "SampleBuilder", "TrainBatch", "advantages_for", "load_latest", "save_checkpoint"]
__getattr__ = lazy_exports(
    __name__,
    {
        "SampleBuilder": "batch",
        "TrainBatch": "batch",
        "LOSSES": "losses",
        "advantages_for": "losses",
        "Learner": "learner",
        "load_latest": "checkpoint",
        "save_checkpoint": "checkpoint",
    },
)
