"""Held-out evaluation: how well the policy answers questions no node trains on.

The items are drawn once from the held-out split of the node's task families (``node.tasks``: a hash of the
canonical problem reserves ``tasks.heldout_fraction`` of every family's problem space; training never draws
these items and peers' groups on them are refused), so a gain here is a gain on unseen questions, not
memorization. Per family the evaluation reports:

* ``accuracy``: the mean reward of ``eval.samples`` completions per item at the training temperature (what
  the policy does when it samples, as it does in training);
* ``greedy_accuracy``: the reward of one greedy completion per item (the policy's single best guess);
* ``format_rate``: the share of sampled completions that state an answer in the ``<answer>`` format at all;
* ``mean_length``: mean sampled completion length in tokens;
* ``n``: the number of items.

Headline ``accuracy`` (and ``greedy_accuracy``) are the unweighted means over families. Sampling is seeded by
``eval.seed``, so the same weights give the same numbers.

:class:`Evaluator` knows nothing about the swarm, the learner or checkpoints: it takes a policy, an engine and a
task source. :func:`evaluate_run` (``swarm-node eval``) adds a run directory's config and checkpoints.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.config import EvalConfig, RolloutConfig
from node.tasks import TaskItem, TaskSource, extract_answer
from protocol.errors import SwarmError
from protocol.types import TaskRef

logger = logging.getLogger(__name__)

EVAL_FILE = "eval.jsonl"


@dataclass
class FamilyResult:
    """Evaluation numbers of one family."""

    accuracy: float
    greedy_accuracy: float | None
    format_rate: float
    mean_length: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "greedy_accuracy": self.greedy_accuracy,
            "format_rate": self.format_rate,
            "mean_length": self.mean_length,
            "n": self.n,
        }


class Evaluator:
    """Evaluates a policy on a fixed set of held-out items (chosen once, at construction)."""

    def __init__(
        self,
        tasks: TaskSource,
        policy: Any,
        engine: Any,
        cfg: EvalConfig,
        rollout: RolloutConfig,
        *,
        items_per_family: int | None = None,
    ) -> None:
        self.tasks, self.policy, self.engine, self.cfg = tasks, policy, engine, cfg
        self.temperature = rollout.temperature
        self.top_p = rollout.top_p
        self.max_new_tokens = cfg.max_new_tokens or rollout.max_new_tokens
        n = items_per_family or cfg.items_per_family
        refs = tasks.heldout_refs(n, cfg.seed)
        self.items: dict[str, list[TaskItem]] = {fam: [tasks.materialize(r) for r in rs] for fam, rs in refs.items()}
        for fam, items in self.items.items():
            if len(items) < n:
                logger.warning("held-out split of %r has only %d distinct items (asked for %d)", fam, len(items), n)

    @property
    def refs(self) -> dict[str, list[TaskRef]]:
        """The evaluation refs per family."""
        return {fam: [it.ref for it in items] for fam, items in self.items.items()}

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluate the engine's current policy; returns the summary (see the module docstring). Blocking."""
        t0 = time.perf_counter()
        families: dict[str, FamilyResult] = {}
        for offset, (fam, items) in enumerate(self.items.items()):
            if not items:
                continue
            prompts = [self.policy.format_prompt(it.question) for it in items]
            sampled = self.engine.generate(
                prompts,
                self.cfg.samples,
                max_new_tokens=self.max_new_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
                seed=self.cfg.seed + offset,
            )
            rewards = [self.tasks.score(it, c.text) for it, comps in zip(items, sampled, strict=True) for c in comps]
            texts = [c.text for comps in sampled for c in comps]
            greedy = None
            if self.cfg.greedy:
                best = self.engine.generate(prompts, 1, max_new_tokens=self.max_new_tokens, temperature=0.0)
                greedy = _mean([self.tasks.score(it, comps[0].text) for it, comps in zip(items, best, strict=True)])
            families[fam] = FamilyResult(
                accuracy=_mean(rewards),
                greedy_accuracy=greedy,
                format_rate=_mean([float(extract_answer(t) is not None) for t in texts]),
                mean_length=_mean([float(len(c.token_ids)) for comps in sampled for c in comps]),
                n=len(items),
            )
        greedy_vals = [f.greedy_accuracy for f in families.values() if f.greedy_accuracy is not None]
        return {
            "step": step,
            "accuracy": _mean([f.accuracy for f in families.values()]),
            "greedy_accuracy": _mean(greedy_vals) if greedy_vals else None,
            "families": {fam: f.to_dict() for fam, f in families.items()},
            "samples": self.cfg.samples,
            "eval_s": round(time.perf_counter() - t0, 3),
            "time": time.time(),
        }


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def append_result(run_dir: Path, result: dict[str, Any]) -> None:
    """Append one evaluation to ``run_dir/eval.jsonl`` (flushed and fsynced: evaluations are expensive)."""
    import os

    path = Path(run_dir) / EVAL_FILE
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(result, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """Every evaluation in ``run_dir/eval.jsonl``, in order (a torn last line is skipped)."""
    path = Path(run_dir) / EVAL_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def headline(result: dict[str, Any]) -> dict[str, float]:
    """The numbers a metrics line carries from an evaluation."""
    out = {"heldout_accuracy": float(result["accuracy"])}
    if result.get("greedy_accuracy") is not None:
        out["heldout_greedy_accuracy"] = float(result["greedy_accuracy"])
    return out


class EvalRunError(SwarmError):
    """``swarm-node eval`` cannot evaluate what was asked (no run, no such checkpoint)."""


def evaluate_run(
    run_dir: Path, *, step: int | None = None, initial: bool = False, items: int | None = None
) -> dict[str, Any]:
    """Evaluate a run's checkpoint (the latest, or ``step``) or, with ``initial``, the run's initial model, on the
    run's held-out split (its resolved ``config.yaml``); the body of ``swarm-node eval``. Blocking."""
    from node.checkpoint import available_steps, load_latest, load_step, load_weights
    from node.config import NodeConfig
    from node.engine import TransformersEngine
    from node.policy import load_policy
    from protocol.config import load_config

    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise EvalRunError(f"{str(run_dir)!r} is not a run directory (no config.yaml); pass the --run-dir of a join")
    cfg = load_config(NodeConfig, config_path)
    ckpt_dir = run_dir / "checkpoints"
    ckpt = None
    if not initial:
        ckpt = load_latest(ckpt_dir) if step is None else load_step(ckpt_dir, step)
        if ckpt is None:
            have = available_steps(ckpt_dir)
            what = "no checkpoint" if step is None else f"no intact checkpoint of step {step}"
            raise EvalRunError(
                f"{what} in {str(ckpt_dir)!r} (steps on disk: {have or 'none'}); use --initial for the initial model"
            )
    policy = load_policy(cfg.model)
    if ckpt is not None:
        load_weights(policy.model, ckpt)
    engine = TransformersEngine(policy, batch_size=cfg.rollout.batch_size)
    tasks = TaskSource(cfg.tasks)
    evaluator = Evaluator(tasks, policy, engine, cfg.eval, cfg.rollout, items_per_family=items)
    return evaluator.evaluate(0 if ckpt is None else ckpt.step)
