"""The laboratory model ``builtin:lab``: a small Qwen2-config model that computes with written working, built offline.

The fast stand-in for a real model: it learns in minutes on two CPU cores, so experiments can afford many seeds.
It answers the laboratory families (``node.arith``: ``lab_add``, multi-digit sums; ``lab_sub``, multi-digit
differences) in the form ``<think>`` column working ``</think><answer>x</answer>``, where the working carries the
skill: supervised training on traces reaches high held-out accuracy where the same model trained on bare answers
does not (the capability gate, ``configs/sim/lab-gate.yaml``).

The build (once per recipe, cached like ``builtin:tiny``) has three deterministic parts:

1. a byte-level BPE tokenizer (digits one per token; words of the fixed prompt line merged) trained on prompts and
   traces of *both* laboratory families whatever the recipe's families, so every laboratory recipe shares one
   tokenizer and peers' behaviour hints stay usable between specialised nodes;
2. a randomly initialised Qwen2 model (``node.model.tiny.build_model``);
3. a supervised warm start on the recipe's families: question -> trace + answer, drawn only from the train side of
   the held-out split (``node.tasks``), ``sft_steps`` steps. The default stops early, at a partly trained state
   where RL has room: it writes the working's format nearly always and gets many problems right, not most.

A recipe names the families it warm-starts on (``model.builtin: {families: [...]}``): the laboratory demo's
specialised nodes are each warm-started on one family and must learn the other from the swarm.

Knows nothing about sampling, RL or the swarm; it only turns a :class:`LabRecipe` into a model directory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from node.arith import LAB_FAMILIES, completion_for
from node.config import TaskConfig, TaskFamily
from node.model.sft import train_sft
from node.tasks import PLAIN_TEMPLATE, TaskSource

logger = logging.getLogger(__name__)

LAB_NAME = "builtin:lab"
#: Bump when the build code changes in a way the recipe fields do not capture.
BUILD_CODE_VERSION = 2  # 2: split v2 (train-side draws changed)
SPECIAL_TOKENS = ["<answer>", "</answer>", "<think>", "</think>"]
_RECIPE_FILE = "rl_swarm_recipe.json"

#: The laboratory families at the default difficulty: 2-3 terms of 2-3 digits (sums), two terms of 2-3 digits
#: (differences). Hundreds of thousands of distinct problems each, so a run never sees a repeat it could memorize.
LAB_TASK_FAMILIES: tuple[dict[str, Any], ...] = (
    {"name": "lab_add", "config": {"min_terms": 2, "max_terms": 3, "min_digits": 2, "max_digits": 3}},
    {"name": "lab_sub", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3}},
)


def lab_task_families() -> tuple[TaskFamily, ...]:
    return tuple(TaskFamily.model_validate(f) for f in LAB_TASK_FAMILIES)


@dataclass(frozen=True)
class LabRecipe:
    """Everything that determines a built laboratory model; its hash names the cache directory."""

    seed: int = 0
    families: tuple[TaskFamily, ...] = field(default_factory=lab_task_families)
    """Families (and difficulty knobs) of the warm start; the tokenizer always covers both laboratory families."""
    trace: bool = True
    """Warm-start targets are trace + answer; ``false``: the bare ``<answer>`` only (the capability gate's twin)."""
    vocab_size: int = 320
    tokenizer_items: int = 400
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 1024
    tie_embeddings: bool = True
    sft_task_seed: int = 12345
    """Task seed of the warm-start items (not the default ``tasks.seed``: RL prompts are other items)."""
    sft_steps: int = 300
    sft_batch_size: int = 64
    sft_lr: float = 3e-3
    sft_warmup: int = 50

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["families"] = [f.model_dump() for f in self.families]
        d["build_code_version"] = BUILD_CODE_VERSION
        return d

    def key(self) -> str:
        """16 hex chars of SHA-256 over the canonical JSON of the recipe and the build code version."""
        from node.model.tiny import recipe_key

        return recipe_key(self.to_dict())


DEFAULT_LAB_RECIPE = LabRecipe()


def recipe_with(overrides: dict[str, Any]) -> LabRecipe:
    """:data:`DEFAULT_LAB_RECIPE` with ``overrides`` (``model.builtin``) applied; ``families`` is a list of
    ``{name, config, weight}`` mappings of laboratory families. ``ValueError`` names an unknown field or family."""
    from node.model.tiny import replace_recipe

    recipe = replace_recipe(DEFAULT_LAB_RECIPE, overrides, "laboratory", ("families",))
    bad = sorted({f.name for f in recipe.families} - set(LAB_FAMILIES))
    if bad:
        raise ValueError(f"the laboratory model warm-starts on {list(LAB_FAMILIES)} only, not {bad}")
    return recipe


def model_dir(cache_dir: Path | None, recipe: LabRecipe) -> Path:
    from node.model.tiny import default_cache_root

    return Path(cache_dir or default_cache_root()).expanduser() / f"lab-{recipe.key()}"


def is_built(cache_dir: Path | None = None, recipe: LabRecipe | None = None) -> bool:
    """Whether ``recipe``'s model (default :data:`DEFAULT_LAB_RECIPE`) is built and complete in the cache."""
    return (model_dir(cache_dir, recipe or DEFAULT_LAB_RECIPE) / _RECIPE_FILE).exists()


def ensure_built(cache_dir: Path | None = None, recipe: LabRecipe | None = None) -> Path:
    """The directory of ``recipe``'s model (default :data:`DEFAULT_LAB_RECIPE`), built first if not cached."""
    from node.model import shipped
    from node.model.cache import build_once

    recipe = recipe or DEFAULT_LAB_RECIPE
    src = shipped.shipped_dir(recipe.key())
    what = f"{LAB_NAME} (recipe {recipe.key()}{', from the weights shipped in the package' if src else ''})"
    return build_once(model_dir(cache_dir, recipe), _RECIPE_FILE, lambda tmp: _install_or_build(recipe, tmp, src),
                      what)  # fmt: skip


def _install_or_build(recipe: LabRecipe, out: Path, src: Path | None) -> None:
    """Install ``recipe``'s shipped weights (``node.model.shipped``) into ``out``, or build it there when none are
    shipped or they do not verify."""
    from node.model import shipped

    if src is not None:
        try:
            shipped.install(src, out, recipe.to_dict(), recipe.key())
            return
        except shipped.ShippedMismatch as e:
            logger.warning("the shipped weights in %s are not used: %s; building the recipe instead", src, e)
            shutil.rmtree(out, ignore_errors=True)
    build(recipe, out)


#: The CPU kernels torch runs a laboratory build on (``ATEN_CPU_CAPABILITY``) on any processor that has more: 300
#: warm-start steps turn a kernel's rounding into another model, so one recipe built on AVX-512 kernels and on AVX2
#: kernels gives two models (measured 2026-12-07: a host on which torch picks AVX-512 built het-long seed 17's warm
#: starts with other weights than an AVX2 host had; pinned to AVX2 it rebuilt both of them, and seed 16's node 0, bit
#: for bit). AVX2 is what every x86-64 host these builds ran on has.
BUILD_CPU_CAPABILITY = "AVX2"
_ABOVE_BUILD = frozenset({"AVX512"})  # torch's capabilities that include AVX2's instructions


def build_capability() -> str:
    """The kernels (torch's CPU capability name) a laboratory build in this process runs on."""
    return BUILD_CPU_CAPABILITY if pinned_capability_env() else torch.backends.cpu.get_cpu_capability()


def pinned_capability_env() -> dict[str, str]:
    """The environment a build needs to run on :data:`BUILD_CPU_CAPABILITY`: empty where this process already runs
    on it or on less (a processor without AVX2: setting it there would crash), or where the user set
    ``ATEN_CPU_CAPABILITY`` (their choice stands)."""
    if "ATEN_CPU_CAPABILITY" in os.environ or torch.backends.cpu.get_cpu_capability() not in _ABOVE_BUILD:
        return {}
    return {"ATEN_CPU_CAPABILITY": BUILD_CPU_CAPABILITY.lower()}


def _build_in_child(recipe: LabRecipe, out: Path, env: dict[str, str]) -> None:
    """:func:`build` in a new Python process whose torch starts on ``env``'s kernels (torch reads
    ``ATEN_CPU_CAPABILITY`` once, at its first CPU kernel: this process's is fixed); its log goes to this stderr."""
    spec = {k: v for k, v in recipe.to_dict().items() if k != "build_code_version"}
    code = "import sys; from node.model.lab import _child_build; _child_build(sys.argv[1], sys.argv[2], sys.argv[3])"
    paths = os.pathsep.join(p for p in [*sys.path, os.environ.get("PYTHONPATH", "")] if p)  # this process's imports
    argv = [sys.executable, "-c", code, json.dumps(spec), str(out), recipe.key()]
    logger.info("building %s in a process on %s kernels (this processor: %s)", LAB_NAME, BUILD_CPU_CAPABILITY,
                torch.backends.cpu.get_cpu_capability())  # fmt: skip
    done = subprocess.run(argv, env={**os.environ, **env, "PYTHONPATH": paths}, check=False)
    if done.returncode != 0 or not (out / _RECIPE_FILE).exists():
        raise RuntimeError(f"building {LAB_NAME} (recipe {recipe.key()}) on {BUILD_CPU_CAPABILITY} kernels in a new "
                           f"process failed (exit {done.returncode}); its log is above")  # fmt: skip


def _child_build(spec: str, out: str, key: str) -> None:
    """The child of :func:`_build_in_child`: the recipe (checked against its key), built into ``out``."""
    from transformers.utils import logging as hf_logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    hf_logging.disable_progress_bar()  # the log says what is built, not a loader's bars
    recipe = recipe_with(json.loads(spec))
    if recipe.key() != key:
        raise SystemExit(f"the recipe rebuilt in the build process has key {recipe.key()}, not {key}")
    build(recipe, Path(out))


def prompt_of(question: str) -> str:
    return PLAIN_TEMPLATE.format(question=question)


def training_examples(recipe: LabRecipe, families: tuple[TaskFamily, ...], n: int, salt: int, *,
                      trace: bool) -> list[tuple[str, str]]:  # fmt: skip
    """``n`` deterministic (prompt, completion) pairs of ``families``' train side (never dev or test items)."""
    rng = random.Random(recipe.seed * 1_000_003 + salt)
    src = TaskSource(TaskConfig(families=list(families), seed=recipe.sft_task_seed, pool_size=10**9))
    items = [src.materialize(ref) for ref in src.sample(rng, n)]
    return [(prompt_of(it.question), completion_for(it.metadata, trace=trace)) for it in items]


def build_tokenizer(recipe: LabRecipe) -> Any:
    """Byte-level BPE (digits one per token) over prompts and traces of both laboratory families."""
    from node.model.tiny import train_byte_bpe

    corpus = [p + c for p, c in training_examples(recipe, lab_task_families(), recipe.tokenizer_items, 0, trace=True)]
    return train_byte_bpe(corpus, recipe.vocab_size, SPECIAL_TOKENS)


def build(recipe: LabRecipe, out: Path) -> dict[str, Any]:
    """Build the tokenizer, the model and its warm start into ``out``; returns build statistics.

    The build runs on one torch thread whatever the caller's setting: for a given thread count it is bitwise
    reproducible (the same recipe gave the same weights on transformers 5.19 and 5.24), but CPU kernels reduce in a
    thread-count-dependent order, and 300 warm-start steps turn that rounding into another model (measured: the demo's
    node-0 recipe built on 2 threads scored 0.221 on lab_add against 0.153 on 1, 256 test problems). One thread is
    what the shipped weights were built with, so a rebuild here reproduces them. For the same reason it runs on
    :data:`BUILD_CPU_CAPABILITY`'s kernels: in a new process where this one's torch runs on wider ones."""
    env = pinned_capability_env()
    if env:
        _build_in_child(recipe, out, env)
        return dict(json.loads((out / "build_stats.json").read_text()))
    return _build_here(recipe, out)


def _build_here(recipe: LabRecipe, out: Path) -> dict[str, Any]:
    from node.model.tiny import build_model

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok = build_tokenizer(recipe)
        model = build_model(recipe, tok)
        stats = warm_start(recipe, model, tok)
    finally:
        torch.set_num_threads(threads)
    stats.update(total_s=round(time.perf_counter() - t0, 2), cpu_capability=torch.backends.cpu.get_cpu_capability())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "build_stats.json").write_text(json.dumps(stats, indent=1))
    (out / _RECIPE_FILE).write_text(json.dumps(recipe.to_dict(), indent=1, sort_keys=True))  # written last
    logger.info("built %s in %.1fs (final warm-start loss %.3f)", LAB_NAME, stats["total_s"], stats["final_loss"])
    return stats


def encode_pairs(tok: Any, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """Token ids of (prompt, completion + EOS) pairs."""
    eos = tok.eos_token_id
    return [
        (tok(p, add_special_tokens=False)["input_ids"], tok(c, add_special_tokens=False)["input_ids"] + [eos])
        for p, c in pairs
    ]


def warm_start(recipe: LabRecipe, model: Any, tok: Any) -> dict[str, Any]:
    """``sft_steps`` supervised steps on the recipe's families (completion tokens only); AdamW, linear warm-up
    then cosine decay to 10%."""
    torch.manual_seed(recipe.seed)
    bs = recipe.sft_batch_size
    pairs = training_examples(recipe, recipe.families, recipe.sft_steps * bs, 1, trace=recipe.trace)
    t0 = time.perf_counter()

    def progress(step: int, total: int, loss: float, eta: float) -> None:
        logger.info("building %s: warm start step %d/%d (loss %.3f, about %.0fs left)", LAB_NAME, step, total,
                    loss, eta)  # fmt: skip

    losses = train_sft(
        model, encode_pairs(tok, pairs), batch_size=bs, lr=recipe.sft_lr, warmup=recipe.sft_warmup,
        pad_id=tok.pad_token_id, betas=(0.9, 0.98), progress=progress,
    )  # fmt: skip
    tail = losses[-10:] if losses else [float("nan")]
    return {
        "sft_s": round(time.perf_counter() - t0, 2),
        "final_loss": sum(tail) / len(tail),
        "params": sum(p.numel() for p in model.parameters()),
    }
