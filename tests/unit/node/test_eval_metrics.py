"""Honest held-out metrics (``node.eval``): exact-match accuracy, partial-credit reward, majority baselines,
top-answer share, pass@k and greedy accuracy agree with an independent scorer written here from the raw
completions, on scripted completions (where every number is far from trivial) and on a real checkpoint."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from node.config import EvalConfig, ModelConfig, RolloutConfig, TaskConfig
from node.eval import Evaluator, at_or_below_baseline, headline, pass_at_k, summary_line
from node.model import tiny
from node.rollout.engine import GeneratedCompletion
from node.tasks import PLAIN_TEMPLATE, TaskSource


def test_pass_at_k_is_the_enumerated_probability() -> None:
    """1 - C(n-c, k)/C(n, k) is the chance that k of the n samples, drawn without replacement, hold a right one."""
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, 10):
                got = pass_at_k(n, c, k)
                if k > n:
                    assert got is None
                    continue
                right = [True] * c + [False] * (n - c)
                subsets = list(itertools.combinations(range(n), k))
                want = sum(any(right[i] for i in s) for s in subsets) / len(subsets)
                assert got == pytest.approx(want, abs=1e-12), (n, c, k)


# ---------------------------------------------------------------- an independent scorer, from raw completions


def own_extract(text: str) -> str | None:
    """SPEC 13 read afresh: the last <answer> that a </answer> follows, up to the first </answer> after it."""
    close = text.rfind("</answer>")
    if close < 0:
        return None
    opening = text.rfind("<answer>", 0, close)
    if opening < 0:
        return None
    start = opening + len("<answer>")
    return text[start : text.find("</answer>", start)].strip()


def independent_scores(
    tasks: TaskSource, items: list[Any], sampled: list[list[str]], greedy: list[str] | None
) -> dict[str, Any]:
    """Every per-family number, computed from scratch (reasoning-gym's scorer called directly for partial credit)."""
    import reasoning_gym

    def partial(item: Any, text: str) -> float:
        answer = own_extract(text)
        if answer is None:
            return 0.0
        ds = reasoning_gym.create_dataset(item.ref.family, size=10**9, **item.ref.config, seed=item.ref.seed)
        try:
            value = float(
                ds.score_answer(answer, {"question": item.question, "answer": item.answer, "metadata": item.metadata})
            )
        except Exception:
            return 0.0
        return min(1.0, max(0.0, value))

    right = [[own_extract(t) == item.answer for t in texts] for item, texts in zip(items, sampled, strict=True)]
    all_answers = [own_extract(t) for texts in sampled for t in texts]
    given = [a for a in all_answers if a is not None]
    top, top_count = Counter(given).most_common(1)[0] if given else (None, 0)
    gold_top_count = Counter(item.answer for item in items).most_common(1)[0][1]

    def pass_k(n: int, c: int, k: int) -> float:
        return 1.0 - math.comb(n - c, k) / math.comb(n, k)

    out = {
        "accuracy": sum(map(sum, right)) / sum(map(len, right)),
        "reward": sum(partial(i, t) for i, texts in zip(items, sampled, strict=True) for t in texts)
        / sum(map(len, sampled)),
        "majority_baseline": gold_top_count / len(items),
        "own_majority_baseline": None if top is None else sum(item.answer == top for item in items) / len(items),
        "top_answer_share": top_count / len(all_answers),
        "pass_at_1": sum(sum(r) / len(r) for r in right) / len(right),
        "pass_at_8": sum(pass_k(len(r), sum(r), 8) for r in right) / len(right) if len(right[0]) >= 8 else None,
        "format_rate": len(given) / len(all_answers),
        "n": len(items),
        "correct": [sum(r) for r in right],
    }
    if greedy is not None:
        out["greedy_accuracy"] = sum(own_extract(t) == i.answer for i, t in zip(items, greedy, strict=True)) / len(
            items
        )
    return out


class RecordingEngine:
    """Passes generation to ``inner`` (or scripts it) and records every completion text per prompt and mode."""

    def __init__(self, inner: Any = None, gold: dict[str, str] | None = None):
        self.inner, self.gold = inner, gold or {}
        self.sampled: dict[str, list[str]] = {}
        self.greedy: dict[str, str] = {}

    def generate(self, prompts: list[str], n: int, **kw: Any) -> list[list[GeneratedCompletion]]:
        if self.inner is not None:
            outs = self.inner.generate(prompts, n, **kw)
        else:
            outs = [[self._scripted(p, j, kw.get("temperature", 1.0)) for j in range(n)] for p in prompts]
        for p, comps in zip(prompts, outs, strict=True):
            if kw.get("temperature", 1.0) == 0.0:
                self.greedy[p] = comps[0].text
            else:
                self.sampled[p] = [c.text for c in comps]
        return outs

    def _scripted(self, prompt: str, j: int, temperature: float) -> GeneratedCompletion:
        """A mix every metric can see: right answers, one constant, near misses, nested and broken tags."""
        gold = self.gold[prompt]
        rng = random.Random(f"{prompt}|{j}|{temperature}")
        skill = (sum(map(ord, prompt)) % 5) / 5  # items differ in how often they are solved
        pick = rng.random()
        if temperature == 0.0:
            text = f"<answer>{gold}</answer>" if skill >= 0.4 else "<answer>1</answer>"
        elif pick < skill * 0.6:
            text = rng.choice([f"<answer>{gold}</answer>", f"<answer>x<answer> {gold} </answer>"])
        elif pick < 0.6:
            text = "<answer>1</answer>"
        elif pick < 0.75:
            text = f"<answer>{gold[:-1] or 'z'}</answer>"  # a prefix: partial credit for words, wrong number
        elif pick < 0.85:
            text = f"<answer>{gold}"  # unclosed: no answer
        else:
            text = f"the answer is {gold}"  # no tag: no answer
        return GeneratedCompletion(
            text=text, prompt_ids=[], token_ids=[1] * (1 + j % 3), logprobs=[], finish_reason="stop", policy_version=0
        )


def check_against_independent(tasks: TaskSource, evaluator: Evaluator, engine: RecordingEngine, result: dict) -> None:
    for fam, items in evaluator.items.items():
        prompts = [evaluator.policy.format_prompt(it.question) for it in items]
        sampled = [engine.sampled[p] for p in prompts]
        greedy = [engine.greedy[p] for p in prompts] if engine.greedy else None
        want = independent_scores(tasks, items, sampled, greedy)
        got = result["families"][fam]
        for key, value in want.items():
            if value is None:
                assert got[key] is None, (fam, key)
            elif isinstance(value, list):
                assert got[key] == value, (fam, key)
            else:
                assert got[key] == pytest.approx(value, abs=1e-12), (fam, key, got[key], value)
        assert (fam in result["at_or_below_baseline"]) == (want["accuracy"] <= want["majority_baseline"])
    fams = list(result["families"].values())
    for key in ("accuracy", "reward", "pass_at_1", "greedy_accuracy"):
        assert result[key] == pytest.approx(sum(f[key] for f in fams) / len(fams), abs=1e-12)


class _PlainPolicy:
    def format_prompt(self, question: str) -> str:
        return PLAIN_TEMPLATE.format(question=question)


def _scripted_evaluator(cfg: EvalConfig) -> tuple[TaskSource, Evaluator, RecordingEngine]:
    """An evaluator over the default tasks whose engine answers from a scripted mix (gold answers by prompt)."""
    tasks = TaskSource(TaskConfig())
    policy = _PlainPolicy()
    refs = tasks.split_refs(cfg.side, cfg.items_per_family, cfg.seed)
    gold = {
        policy.format_prompt(tasks.materialize(r).question): tasks.materialize(r).answer or ""
        for rs in refs.values()
        for r in rs
    }
    engine = RecordingEngine(gold=gold)
    evaluator = Evaluator(tasks, policy, engine, cfg, RolloutConfig())
    return tasks, evaluator, engine


def test_metrics_match_an_independent_scorer_on_scripted_completions() -> None:
    tasks, evaluator, engine = _scripted_evaluator(EvalConfig(items_per_family=16, samples=8))
    result = evaluator.evaluate(3)
    check_against_independent(tasks, evaluator, engine, result)

    # the scripted mix makes every number informative: none is trivially 0 or 1, and they tell different stories
    for name, f in result["families"].items():
        assert 0.0 < f["accuracy"] < f["pass_at_8"] < 1.0, name
        assert f["top_answer_share"] > 0.2 and 0.0 < f["format_rate"] < 1.0, name
        assert f["reward"] >= f["accuracy"], name  # partial credit only adds
    assert result["families"]["letter_counting"]["own_majority_baseline"] > 0.3  # "1" is often right there
    assert result["families"]["spell_backward"]["reward"] > result["families"]["spell_backward"]["accuracy"] + 0.05
    assert "letter_counting" in result["at_or_below_baseline"]
    line = summary_line(result)
    assert "at or below the majority baseline" in line and "letter_counting" in line
    assert headline(result)["heldout_accuracy"] == result["accuracy"]
    assert headline(result)["heldout_reward"] == result["reward"]
    bases = [f["majority_baseline"] for f in result["families"].values()]
    assert headline(result)["heldout_majority_baseline"] == pytest.approx(sum(bases) / len(bases))


def test_pass_at_8_is_null_below_8_samples() -> None:
    _, evaluator, _ = _scripted_evaluator(EvalConfig(items_per_family=4, samples=4, greedy=False))
    result = evaluator.evaluate(0)
    assert result["pass_at_8"] is None and result["greedy_accuracy"] is None
    assert all(f["pass_at_8"] is None and f["pass_at_1"] == f["accuracy"] for f in result["families"].values())
    assert "pass@8 n/a" in summary_line(result)


def test_baseline_flag_reads_old_and_new_lines() -> None:
    assert at_or_below_baseline({"accuracy": 0.7, "majority_baseline": 0.7})
    assert not at_or_below_baseline({"accuracy": 0.71, "majority_baseline": 0.7})
    assert not at_or_below_baseline({"accuracy": 0.1})  # an eval.jsonl line from before the baselines
    old = {"step": 5, "accuracy": 0.3, "greedy_accuracy": None, "families": {"a": {"accuracy": 0.3, "n": 4}}}
    assert "held-out exact accuracy 0.300" in summary_line(old) and "baseline" not in summary_line(old)


def test_metrics_match_an_independent_scorer_on_a_real_checkpoint(tiny_cache: Path) -> None:
    """The same check on the reduced built-in model's own completions (sampled and greedy)."""
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine

    path = tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)
    policy = load_policy(ModelConfig(name=str(path), device="cpu"))
    tasks = TaskSource(TaskConfig())
    engine = RecordingEngine(inner=TransformersEngine(policy, batch_size=64))
    cfg = EvalConfig(items_per_family=6, samples=8, max_new_tokens=12)
    evaluator = Evaluator(tasks, policy, engine, cfg, RolloutConfig())
    result = evaluator.evaluate(0)
    assert sum(len(v) for v in engine.sampled.values()) == 4 * 6 * 8 and len(engine.greedy) == 4 * 6
    check_against_independent(tasks, evaluator, engine, result)
