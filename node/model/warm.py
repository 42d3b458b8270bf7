"""Warm-started variants of a model (``model.warm_start``): a short supervised fine-tuning on some families'
training items, built once per recipe and cached as an ordinary model directory.

An example is the node's own prompt for a training-split question (chat template and format example included, so
the warm start teaches exactly the prompts RL will show) and the target ``<answer>gold</answer>`` (or, with
``traces``, the family's written working) followed by EOS.
Items of the dev and test sides of the split are never drawn (``TaskSource.sample`` redraws them), so evaluation
still measures generalization. The directory is ``<cache>/warm-<base>-<hash of recipe>``; its ``rl_swarm_warm.json``
records the recipe (base model, families, examples, learning rate, seeds) and is written last.

Knows nothing about RL or the swarm.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import time
from pathlib import Path
from typing import Any

import torch

from node.config import TaskConfig, WarmStartConfig
from node.model.cache import build_once
from node.model.sft import train_sft
from node.tasks import TaskItem, TaskSource, format_answer

logger = logging.getLogger(__name__)

RECIPE_FILE = "rl_swarm_warm.json"
#: Bump when the warm-start code changes in a way the recipe does not capture.
WARM_CODE_VERSION = 2  # 2: split v2 (SPEC 13: family-independent arithmetic keys, dev and test sides)


def recipe(policy: Any, cfg: WarmStartConfig) -> dict[str, Any]:
    """Everything that determines the warm-started weights: the base model as loaded (its resolved directory, which
    names a built-in recipe or a converted package by hash, or its hub name), dtype, tokenizer and prompt style,
    and the warm start's own settings."""
    source = Path(policy.source).expanduser()
    return {
        "base": policy.name,
        "source": str(source.resolve()) if source.exists() else policy.source,
        "dtype": str(policy.dtype),
        "tokenizer": policy.tokenizer_id,
        "format_example": policy.format_example,
        "warm_start": cfg.model_dump(mode="json", exclude={"traces"} if not cfg.traces else None),
        "code_version": WARM_CODE_VERSION,
    }


def warm_dir(cache_root: Path, base: str, rec: dict[str, Any]) -> Path:
    key = hashlib.sha256(json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(base).name or base).strip("-")[:40] or "model"
    return cache_root / f"warm-{slug}-{key}"


def source(cfg: WarmStartConfig) -> TaskSource:
    """The task source the warm start draws from (its own task seed and split shares)."""
    return TaskSource(
        TaskConfig(
            families=list(cfg.families),
            seed=cfg.task_seed,
            test_fraction=cfg.test_fraction,
            dev_fraction=cfg.dev_fraction,
        )
    )


def items(cfg: WarmStartConfig, src: TaskSource | None = None) -> list[TaskItem]:
    """The warm start's ``cfg.examples`` items, from the training split only, in a seeded order."""
    src = src or source(cfg)
    rng = random.Random(cfg.seed)
    out: list[TaskItem] = []
    for _ in range(100):  # a family whose items all lack a gold answer cannot loop forever
        for ref in src.sample(rng, cfg.examples - len(out)):
            item = src.materialize(ref)
            if item.answer is not None:
                out.append(item)
        if len(out) == cfg.examples:
            return out
    raise ValueError(f"model.warm_start: the families gave only {len(out)} items with a gold answer")


def targets(cfg: WarmStartConfig, src: TaskSource, chosen: list[TaskItem]) -> list[str]:
    """Each item's target text: ``<answer>gold</answer>``, or with ``cfg.traces`` the family's written working
    (a :class:`ValueError` naming the family when it writes none)."""
    if not cfg.traces:
        return [format_answer(str(it.answer)) for it in chosen]
    out = []
    for it in chosen:
        text = src.trace(it)
        if text is None:
            raise ValueError(
                f"model.warm_start.traces: family {it.ref.family!r} writes no working (no trace); use families that "
                "do (lab_add, lab_sub) or traces: false"
            )
        out.append(text)
    return out


def examples(policy: Any, cfg: WarmStartConfig) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) pairs: the node's prompt of each item and its target (:func:`targets`) + EOS."""
    eos = policy.eos_token_ids[0]
    src = source(cfg)
    chosen = items(cfg, src)
    return [
        (policy.encode(policy.format_prompt(it.question)), [*policy.encode(text), eos])
        for it, text in zip(chosen, targets(cfg, src, chosen), strict=True)
    ]


def ensure_built(policy: Any, cfg: WarmStartConfig, cache_root: Path) -> Path:
    """The warm-started model's directory, fine-tuning ``policy.model`` in place and saving it first if this recipe
    is not cached (safe when several processes start at once)."""
    rec = recipe(policy, cfg)
    target = warm_dir(cache_root, policy.name, rec)

    def build(tmp: Path) -> None:
        torch.manual_seed(cfg.seed)
        pairs = examples(policy, cfg)
        pad = policy.tokenizer.pad_token_id if policy.tokenizer.pad_token_id is not None else pairs[0][1][-1]
        t0 = time.perf_counter()

        def progress(step: int, total: int, loss: float, eta: float) -> None:
            logger.info("warm start of %s: step %d/%d (loss %.3f, about %.0fs left)", policy.name, step, total,
                        loss, eta)  # fmt: skip

        losses = train_sft(
            policy.model, pairs, batch_size=cfg.batch_size, lr=cfg.lr, warmup=cfg.warmup, pad_id=pad,
            progress=progress,
        )  # fmt: skip
        policy.model.save_pretrained(str(tmp))
        policy.tokenizer.save_pretrained(str(tmp))
        tail = losses[-10:]
        stats = {"sft_s": round(time.perf_counter() - t0, 2), "steps": len(losses), "first_loss": losses[0],
                 "final_loss": sum(tail) / len(tail)}  # fmt: skip
        (tmp / "warm_stats.json").write_text(json.dumps(stats, indent=1))
        (tmp / RECIPE_FILE).write_text(json.dumps(rec, indent=1, sort_keys=True))  # written last

    return build_once(target, RECIPE_FILE, build, f"a warm start of {policy.name}")
