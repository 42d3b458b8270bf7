"""Evaluation: how well the policy answers questions no node trains on, read from one side of the split.

The items are drawn once from the side ``eval.side`` names (``node.tasks``, SPEC 13): ``test`` (the default, for
results that are reported) or ``dev`` (for probes that choose families, sizes and hyper-parameters, so those
choices never read the test side). Both sides are reserved by a hash of the canonical problem (value-level and
family-independent for arithmetic); training never draws them and peers' groups on them are refused, so a gain
here is a gain on unseen problems, not memorization. Every result names its ``side``. Per family the evaluation
reports, from ``eval.samples`` completions per item at the training temperature and one greedy completion:

* ``accuracy``: exact-match accuracy of the sampled completions -- the extracted answer equals the gold answer
  (``node.tasks.extract_answer``; a family without a single gold answer counts a verifier score of 1.0). This is
  the headline: partial credit cannot inflate it;
* ``reward``: the mean reasoning-gym score (partial credit, what training optimises) of the same completions;
* ``majority_baseline``: the accuracy of always giving the most common gold answer of the evaluated items, and
  ``own_majority_baseline``: that of always giving the model's own most common sampled answer. An accuracy at or
  below the majority baseline says the policy may be answering one constant, not solving;
* ``top_answer``/``top_answer_share``: the single most common sampled answer and its share of all samples;
* ``pass_at_1``, ``pass_at_8``: the unbiased pass@k estimator ``1 - C(n-c, k) / C(n, k)`` over the n samples of
  each item with c exact (Chen et al., *Evaluating Large Language Models Trained on Code*, arXiv 2107.03374),
  averaged over items; ``None`` when n < k. pass@1 equals ``accuracy``; pass@8 says whether the right answer is
  still among the policy's guesses (sharpening without new skill lowers it);
* ``greedy_accuracy`` (exact) and ``greedy_reward`` (partial credit) of one greedy completion per item (the policy's
  single best guess);
* ``format_rate``: the share of sampled completions that state an answer in the ``<answer>`` format at all;
* ``mean_length``: mean sampled completion length in tokens;
* ``n``: the number of items;
* ``correct``: per item, in item order, how many of its sampled completions were exact (pairwise comparisons of
  policies on the same items: win rates under the verifier, as B6's real-model section computes them);
* ``items``: per item, in item order, a record for re-analysis: ``key`` (its split key, ``node.tasks.split_key``),
  ``samples_right`` (exact samples), ``n_samples`` and ``greedy_right`` (bool; ``None`` without greedy decoding);
* ``plugin_failures`` (only where there were some): completions a task plug-in's scorer failed on (raised, ran past
  its time limit, returned junk), each scored 0. A family quarantined during or before an evaluation
  (``node.tasks.source``) is left out of it: a faulty plug-in costs its own family's numbers, never the node.

Headline ``accuracy``, ``reward``, ``pass_at_1``, ``pass_at_8`` and ``greedy_accuracy`` are unweighted means over
families; ``at_or_below_baseline`` lists the families whose accuracy does not beat their majority baseline.
Sampling is seeded by ``eval.seed``, so the same weights give the same numbers.

:class:`Evaluator` knows nothing about the swarm, the learner or checkpoints: it takes a policy, an engine and a
task source. :func:`evaluate_run` (``swarm-node eval``) adds a run directory's config and checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.canonical import canonical_problem
from node.config import EvalConfig, RolloutConfig
from node.tasks import (
    PluginError,
    Side,
    TaskItem,
    TaskSource,
    extract_answer,
    is_exact,
    split_key,
    split_wire_family,
)
from protocol.errors import SwarmError
from protocol.types import TaskRef

logger = logging.getLogger(__name__)

EVAL_FILE = "eval.jsonl"


#: The k of the reported pass@k besides pass@1 (needs ``eval.samples >= PASS_K``).
PASS_K = 8


@dataclass
class FamilyResult:
    """Evaluation numbers of one family (see the module docstring)."""

    accuracy: float
    greedy_accuracy: float | None
    format_rate: float
    mean_length: float
    n: int
    reward: float = 0.0
    greedy_reward: float | None = None
    majority_baseline: float | None = None
    own_majority_baseline: float | None = None
    top_answer: str | None = None
    top_answer_share: float = 0.0
    pass_at_1: float = 0.0
    pass_at_8: float | None = None
    correct: list[int] | None = None
    items: list[dict[str, Any]] | None = None
    plugin_failures: int = 0

    def to_dict(self) -> dict[str, Any]:
        extra = {"plugin_failures": self.plugin_failures} if self.plugin_failures else {}
        return {
            **extra,
            "accuracy": self.accuracy,
            "reward": self.reward,
            "majority_baseline": self.majority_baseline,
            "own_majority_baseline": self.own_majority_baseline,
            "top_answer": self.top_answer,
            "top_answer_share": self.top_answer_share,
            "pass_at_1": self.pass_at_1,
            "pass_at_8": self.pass_at_8,
            "greedy_accuracy": self.greedy_accuracy,
            "greedy_reward": self.greedy_reward,
            "format_rate": self.format_rate,
            "mean_length": self.mean_length,
            "n": self.n,
            "correct": self.correct,
            "items": self.items,
        }


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """The unbiased pass@k estimate ``1 - C(n-c, k) / C(n, k)`` of one item with ``c`` of ``n`` samples right;
    ``None`` when ``n < k`` (not estimable)."""
    if n < k or n <= 0:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def score_family(
    tasks: TaskSource,
    items: list[TaskItem],
    sampled: list[list[str]],
    greedy: list[str] | None,
    lengths: list[int] | None = None,
) -> FamilyResult:
    """The numbers of one family from raw completion texts: ``sampled[i]`` are item ``i``'s sampled completions,
    ``greedy[i]`` its greedy one (``None``: not decoded), ``lengths`` the sampled completions' token counts."""
    failures = 0

    def score(item: TaskItem, text: str) -> float:
        nonlocal failures
        try:
            return tasks.score(item, text)
        except PluginError:  # counted here and by the task source; the completion scores 0
            failures += 1
            return 0.0

    answers = [[extract_answer(t) for t in texts] for texts in sampled]
    rewards = [[score(it, t) for t in texts] for it, texts in zip(items, sampled, strict=True)]
    exact = [
        [is_exact(it, a, r) for a, r in zip(ans, rew, strict=True)]
        for it, ans, rew in zip(items, answers, rewards, strict=True)
    ]
    flat_answers = [a for ans in answers for a in ans]
    counts = Counter(a for a in flat_answers if a is not None)
    top = counts.most_common(1)[0] if counts else None
    golds = Counter(it.answer.strip() for it in items if it.answer is not None)
    majority = golds.most_common(1)[0][1] / len(items) if golds else None
    own_majority = None if top is None else _mean([float(is_exact(it, top[0], 0.0)) for it in items])
    per_item_k = [pass_at_k(len(e), sum(e), PASS_K) for e in exact]
    greedy_acc = greedy_rew = None
    greedy_right: list[bool | None] = [None] * len(items)
    if greedy is not None:
        g_rewards = [score(it, t) for it, t in zip(items, greedy, strict=True)]
        greedy_rew = _mean(g_rewards)
        greedy_right = [is_exact(it, extract_answer(t), r) for it, t, r in zip(items, greedy, g_rewards, strict=True)]
        greedy_acc = _mean([float(bool(x)) for x in greedy_right])
    return FamilyResult(
        accuracy=_mean([float(x) for e in exact for x in e]),
        reward=_mean([r for rew in rewards for r in rew]),
        majority_baseline=majority,
        own_majority_baseline=own_majority,
        top_answer=None if top is None else top[0],
        top_answer_share=0.0 if top is None else top[1] / max(1, len(flat_answers)),
        pass_at_1=_mean([_mean([float(x) for x in e]) for e in exact]),
        pass_at_8=None if any(p is None for p in per_item_k) else _mean([p for p in per_item_k if p is not None]),
        greedy_accuracy=greedy_acc,
        greedy_reward=greedy_rew,
        format_rate=_mean([float(a is not None) for a in flat_answers]),
        mean_length=_mean([float(x) for x in lengths or []]),
        n=len(items),
        correct=[sum(e) for e in exact],
        items=[
            {
                "key": split_key(it.ref.family, it.question),
                "samples_right": sum(e),
                "n_samples": len(e),
                "greedy_right": g,
            }
            for it, e, g in zip(items, exact, greedy_right, strict=True)
        ],
        plugin_failures=failures,
    )


class Evaluator:
    """Evaluates a policy on a fixed set of items of one side of the split, ``cfg.side`` (chosen once, at
    construction)."""

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
        self.side: Side = cfg.side
        #: Seconds per item of the last evaluation: the next one's announced duration.
        self._item_s: float | None = None
        n = items_per_family or cfg.items_per_family
        refs = tasks.split_refs(self.side, n, cfg.seed)
        self.items: dict[str, list[TaskItem]] = {}
        for fam, rs in refs.items():
            self.items[fam] = []
            for r in rs:
                try:
                    self.items[fam].append(tasks.materialize(r))
                except PluginError:  # counted by the task source; a quarantined family ends with no items
                    continue
        for fam, items in self.items.items():
            if fam in tasks.quarantined:
                continue
            if len(items) < n:
                logger.warning("%s side of %r has only %d distinct items (asked for %d)", self.side, fam, len(items), n)

    @property
    def refs(self) -> dict[str, list[TaskRef]]:
        """The evaluation refs per family."""
        return {fam: [it.ref for it in items] for fam, items in self.items.items()}

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluate the engine's current policy; returns the summary (see the module docstring). Blocking."""
        t0 = time.perf_counter()
        families: dict[str, FamilyResult] = {}
        total = sum(len(items) for items in self.items.values())
        per_item = self.cfg.samples + (1 if self.cfg.greedy else 0)
        logger.info(
            "step %d: evaluating %d %s items x %d completions (%d families)%s",
            step, total, self.side, per_item, len(self.items),
            "" if self._item_s is None else f", about {self._item_s * total:.0f} s",
        )  # fmt: skip
        done = 0
        first: tuple[int, float] | None = None
        with self._batch_width():
            for offset, (fam, items) in enumerate(self.items.items()):
                if not items or fam in self.tasks.quarantined:  # quarantined: said once, when it happened
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
                greedy = None
                if self.cfg.greedy:
                    best = self.engine.generate(prompts, 1, max_new_tokens=self.max_new_tokens, temperature=0.0)
                    greedy = [comps[0].text for comps in best]
                result = score_family(
                    self.tasks,
                    items,
                    [[c.text for c in comps] for comps in sampled],
                    greedy,
                    [len(c.token_ids) for comps in sampled for c in comps],
                )
                if fam in self.tasks.quarantined:
                    logger.info("evaluation: %s left out (its plug-in was quarantined while scoring it)", fam)
                else:
                    families[fam] = result
                done += len(items)
                elapsed = time.perf_counter() - t0
                if first is None:  # the first family carries the warm-up: the next estimate leaves it out
                    first = (done, elapsed)
                if done < total:
                    logger.info(
                        "evaluation: %s done (%d/%d items, %.0f s); about %.0f s left",
                        fam, done, total, elapsed, elapsed / done * (total - done),
                    )  # fmt: skip
        if first is not None:
            n0, s0 = first
            rest = total - n0
            self._item_s = (time.perf_counter() - t0 - s0) / rest if rest else s0 / max(1, n0)
        return summarize(families, step=step, samples=self.cfg.samples, eval_s=time.perf_counter() - t0, side=self.side)

    @contextlib.contextmanager
    def _batch_width(self) -> Iterator[None]:
        """``eval.batch_size``, for the evaluation only: the engine's decoding batch (the transformers engine's; vLLM
        batches itself)."""
        width = getattr(self.engine, "batch_size", None)
        if self.cfg.batch_size is None or width is None:
            yield
            return
        self.engine.batch_size = self.cfg.batch_size
        try:
            yield
        finally:
            self.engine.batch_size = width


def summarize(
    families: dict[str, FamilyResult], *, step: int, samples: int, eval_s: float, side: Side = "test"
) -> dict[str, Any]:
    """One evaluation's summary (an ``eval.jsonl`` line): the side it read, unweighted means over families and the
    families."""
    values = list(families.values())
    greedy_vals = [f.greedy_accuracy for f in values if f.greedy_accuracy is not None]
    pass_k = [f.pass_at_8 for f in values]
    return {
        "step": step,
        "side": side,
        "accuracy": _mean([f.accuracy for f in values]),
        "reward": _mean([f.reward for f in values]),
        "pass_at_1": _mean([f.pass_at_1 for f in values]),
        "pass_at_8": None if not values or any(p is None for p in pass_k) else _mean([p or 0.0 for p in pass_k]),
        "greedy_accuracy": _mean(greedy_vals) if greedy_vals else None,
        "at_or_below_baseline": [fam for fam, f in families.items() if at_or_below_baseline(f)],
        "families": {fam: f.to_dict() for fam, f in families.items()},
        "samples": samples,
        "eval_s": round(eval_s, 3),
        "time": time.time(),
    }


def at_or_below_baseline(family: FamilyResult | dict[str, Any]) -> bool:
    """Whether a family's exact accuracy does not beat its majority baseline (always answering the most common
    gold answer would do as well)."""
    f = family.to_dict() if isinstance(family, FamilyResult) else family
    baseline = f.get("majority_baseline")
    return baseline is not None and float(f["accuracy"]) <= float(baseline)


def summary_line(result: dict[str, Any]) -> str:
    """The logged headline of one evaluation: exact accuracy, partial-credit reward, pass@k, greedy, and every
    family at or below its majority baseline."""

    def num(value: Any) -> str:
        return "n/a" if value is None else f"{float(value):.3f}"

    fams = result.get("families") or {}
    side = f" ({result['side']} side)" if result.get("side") else ""  # lines before split v2 name no side
    line = (
        f"held-out{side} exact accuracy {num(result.get('accuracy'))} (reward {num(result.get('reward'))}, "
        f"pass@8 {num(result.get('pass_at_8'))}, greedy {num(result.get('greedy_accuracy'))}) over {len(fams)} "
        f"families in {float(result.get('eval_s', 0.0)):.1f}s"
    )
    low = [
        f"{name} {num(f.get('accuracy'))} <= {num(f.get('majority_baseline'))}"
        for name, f in fams.items()
        if isinstance(f, dict) and "accuracy" in f and at_or_below_baseline(f)
    ]
    if low:
        line += "; at or below the majority baseline: " + ", ".join(low)
    return line


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


def eval_table(result: dict[str, Any]) -> str:
    """``swarm-node eval``'s table: the headline line, then one row per family (exact accuracy first)."""

    def num(value: Any) -> str:
        return "    -" if value is None else f"{float(value):.3f}"

    rows = [
        summary_line(result).replace("held-out", f"step {result['step']}: held-out", 1),
        "family                      n  accuracy  reward  majority  own-maj  top-share  pass@8  greedy  format",
    ]
    for fam, r in result["families"].items():
        rows.append(
            f"{fam:24s} {r['n']:4d}     {num(r.get('accuracy'))}   {num(r.get('reward'))}     "
            f"{num(r.get('majority_baseline'))}    {num(r.get('own_majority_baseline'))}      "
            f"{num(r.get('top_answer_share'))}   {num(r.get('pass_at_8'))}   {num(r.get('greedy_accuracy'))}   "
            f"{num(r.get('format_rate'))}"
        )
    return "\n".join(rows)


def headline(result: dict[str, Any]) -> dict[str, float]:
    """The numbers a metrics line carries from an evaluation (``heldout_accuracy`` is exact-match)."""
    out = {"heldout_accuracy": float(result["accuracy"])}
    for key in ("greedy_accuracy", "reward", "pass_at_8"):
        if result.get(key) is not None:
            out[f"heldout_{key}"] = float(result[key])
    fams = result.get("families", {}).values()
    base = [f["majority_baseline"] for f in fams if f.get("majority_baseline") is not None]
    if base:  # the accuracy of always giving each family's most common gold answer, mean over families
        out["heldout_majority_baseline"] = math.fsum(base) / len(base)
    return out


class EvalRunError(SwarmError):
    """``swarm-node eval`` cannot evaluate what was asked (no run, no such checkpoint)."""


def evaluate_run(
    run_dir: Path,
    *,
    step: int | None = None,
    initial: bool = False,
    items: int | None = None,
    side: Side | None = None,
) -> dict[str, Any]:
    """Evaluate a run's checkpoint (the latest, or ``step``) or, with ``initial``, the run's initial model, on
    ``side`` of the run's split (default: its ``eval.side``; shares from its resolved ``config.yaml``); the body of
    ``swarm-node eval``. Blocking."""
    from node.config import NodeConfig
    from node.learn.checkpoint import available_steps, load_latest, load_step, load_weights
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine
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
    eval_cfg = cfg.eval if side is None else cfg.eval.model_copy(update={"side": side})
    evaluator = Evaluator(tasks, policy, engine, eval_cfg, cfg.rollout, items_per_family=items)
    for line in split_leak_warnings(tasks, evaluator.items, eval_cfg.seed):
        logger.warning("%s", line)
    return evaluator.evaluate(0 if ckpt is None else ckpt.step)


_NUMBER_RE = re.compile(r"\d+")
#: Train-side items read per family to look for evaluated questions' numbers (enough for families of a few thousand
#: problems; a larger family's leak is rarer and shows on a sample).
LEAK_PROBE_ITEMS = 2000


def _numbers(question: str) -> tuple[str, ...]:
    return tuple(sorted(_NUMBER_RE.findall(question)))


def split_leak_warnings(
    tasks: TaskSource, items: dict[str, list[TaskItem]], seed: int, *, probe: int = LEAK_PROBE_ITEMS
) -> list[str]:
    """One warning per family whose split key is its question text (no ``split_key`` of its own and no built-in
    canonical form) and whose evaluated questions carry the same numbers, in any order, as a train-side question
    with other text: ``gcd(4, 6)`` on the test side and ``gcd(6, 4)`` in training are one problem on two sides
    unless the family says so with a ``split_key`` (docs/tasks.md). Questions with fewer than two numbers are not
    compared (their text is their problem). Reads up to ``probe`` train-side items of each such family."""
    warnings = []
    for family, evaluated in items.items():
        name, _ = split_wire_family(family)
        if tasks.has_split_key(family) or not evaluated:
            continue
        if any(canonical_problem(name, it.question) is not None for it in evaluated):
            continue  # a built-in canonical form (arithmetic, word tasks) already folds such twins together
        wanted = {_numbers(it.question): it.question for it in evaluated if len(_numbers(it.question)) >= 2}
        if not wanted:
            continue
        twins: dict[str, str] = {}
        for ref in tasks.split_refs("train", probe, seed).get(family, []):
            try:
                question = tasks.materialize(ref).question
            except PluginError:
                continue
            key = _numbers(question)
            if key in wanted and question != wanted[key]:
                twins.setdefault(wanted[key], question)
        if twins:
            test_q, train_q = next(iter(twins.items()))
            warnings.append(
                f"task family {family!r} has no split_key, and {len(twins)} of its {len(evaluated)} evaluated "
                f"questions have the same numbers as a training question (e.g. {test_q[:80]!r} evaluated, "
                f"{train_q[:80]!r} trained on): if such questions are one problem, the evaluation side leaks into "
                "training; give the family a split_key (docs/tasks.md, 'The split')"
            )
    return warnings
