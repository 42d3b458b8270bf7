"""Held-out evaluation: the split is disjoint from training on question text, peers cannot feed held-out items
to the learner, and evaluating the same weights twice gives the same numbers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from node.config import EvalConfig, ModelConfig, RolloutConfig, TaskConfig, TaskFamily
from node.eval import Evaluator, append_result, headline, read_results
from node.model import tiny
from node.tasks import TaskError, TaskSource, is_heldout_question

FAMILIES = [
    TaskFamily(name="chain_sum", config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    TaskFamily(name="spell_backward", config={"min_word_len": 3, "max_word_len": 6}),
    TaskFamily(name="basic_arithmetic"),
]


@pytest.fixture(scope="module")
def source() -> TaskSource:
    return TaskSource(TaskConfig(families=FAMILIES, seed=3))


def test_split_is_a_stable_share_of_question_space() -> None:
    questions = [f"What is {i} + {i + 1}?" for i in range(20_000)]
    share = sum(is_heldout_question("chain_sum", q, 0.1) for q in questions) / len(questions)
    assert 0.09 < share < 0.11
    assert all(is_heldout_question("x", q, 0.1) == is_heldout_question("x", q, 0.1) for q in questions[:100])
    assert not any(is_heldout_question("x", q, 1e-9) for q in questions)


def test_training_draws_and_heldout_items_are_disjoint_on_question_text(source: TaskSource) -> None:
    train = {source.materialize(r).question for r in source.sample(random.Random(0), 3000)}
    heldout = source.heldout_refs(40, seed=1_000_003)
    assert set(heldout) == {f.name for f in FAMILIES}
    eval_questions = set()
    for fam, refs in heldout.items():
        assert len(refs) == 40, fam
        qs = [source.materialize(r).question for r in refs]
        assert len(set(qs)) == len(qs)  # distinct items
        eval_questions |= set(qs)
    assert eval_questions and not (eval_questions & train)
    # chain_sum has ~20k questions: 3000 training draws of a third of them hit every common one, so a
    # disjoint result is only possible because the split is on the question text, not on seeds or indices
    assert all(source.is_heldout(source.materialize(r)) for refs in heldout.values() for r in refs)


def test_training_draws_from_a_tiny_family_still_avoid_the_heldout_split() -> None:
    small = TaskSource(
        TaskConfig(
            families=[
                TaskFamily(name="chain_sum", config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
            ],
            heldout_fraction=0.3,
        )
    )
    questions = {small.materialize(r).question for r in small.sample(random.Random(1), 2000)}
    held = {small.materialize(r).question for r in small.heldout_refs(500, seed=9)["chain_sum"]}
    assert held and len(held) < 200  # a 200-question family cannot yield 500 distinct held-out items
    assert not (questions & held)
    assert len(questions) + len(held) <= 200


def test_peers_groups_on_heldout_items_are_refused(source: TaskSource) -> None:
    ref = source.heldout_refs(1, seed=5)["spell_backward"][0]
    with pytest.raises(TaskError, match="held-out"):
        source.materialize_for_training(ref)
    train_ref = source.sample(random.Random(2), 1)[0]
    assert source.materialize_for_training(train_ref).question


def test_small_families_are_warned_about_once_per_family(caplog: pytest.LogCaptureFixture) -> None:
    src = TaskSource(
        TaskConfig(
            families=[
                TaskFamily(name="chain_sum", config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
                TaskFamily(name="spell_backward", config={"min_word_len": 3, "max_word_len": 10}),
            ]
        )
    )
    warnings = src.warn_if_small(4000)
    assert len(warnings) == 1 and "chain_sum" in warnings[0] and "distinct questions" in warnings[0]
    assert src.warn_if_small(100) == []  # 50 draws of 200 questions: no warning


@pytest.fixture(scope="module")
def small_policy(tiny_cache: Path):
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine

    path = tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)
    policy = load_policy(ModelConfig(name=str(path), device="cpu"))
    return policy, TransformersEngine(policy, batch_size=64)


def test_evaluator_reports_per_family_numbers_and_repeats_exactly(small_policy, source: TaskSource) -> None:
    policy, engine = small_policy
    cfg = EvalConfig(items_per_family=6, samples=2, max_new_tokens=8)
    ev = Evaluator(source, policy, engine, cfg, RolloutConfig())
    a, b = ev.evaluate(7), ev.evaluate(7)
    assert a["step"] == 7 and set(a["families"]) == {f.name for f in FAMILIES}
    for fam in a["families"].values():
        assert fam["n"] == 6
        assert 0.0 <= fam["accuracy"] <= 1.0 and 0.0 <= fam["greedy_accuracy"] <= 1.0
        assert 0.0 <= fam["format_rate"] <= 1.0 and 0 < fam["mean_length"] <= 8
    assert a["accuracy"] == pytest.approx(sum(f["accuracy"] for f in a["families"].values()) / 3)
    strip = lambda r: {k: v for k, v in r.items() if k not in ("time", "eval_s")}  # noqa: E731
    assert strip(a) == strip(b)
    other = Evaluator(source, policy, engine, cfg.model_copy(update={"seed": 77}), RolloutConfig())
    assert other.refs != ev.refs  # another scan seed, other items


def test_results_file_round_trips_and_headline(tmp_path: Path) -> None:
    r1 = {"step": 0, "accuracy": 0.25, "greedy_accuracy": 0.5, "families": {}}
    append_result(tmp_path, r1)
    append_result(tmp_path, {**r1, "step": 10, "greedy_accuracy": None})
    (tmp_path / "eval.jsonl").open("a").write('{"step": 20, "accu')  # a torn last line
    rows = read_results(tmp_path)
    assert [r["step"] for r in rows] == [0, 10]
    assert headline(rows[0]) == {"heldout_accuracy": 0.25, "heldout_greedy_accuracy": 0.5}
    assert headline(rows[1]) == {"heldout_accuracy": 0.25}
    assert json.loads((tmp_path / "eval.jsonl").read_text().splitlines()[0])["step"] == 0


def test_live_view_keeps_showing_the_latest_heldout_accuracy() -> None:
    from node.telemetry.metrics import LiveView

    view = LiveView(10, enabled=True)
    try:
        view.update({"step": 1, "reward_mean": 0.1})
        assert "held-out" not in view._progress.tasks[0].fields["info"]
        view.update({"step": 2, "reward_mean": 0.2, "heldout_accuracy": 0.25})
        view.update({"step": 3, "reward_mean": 0.3})  # not an evaluation step: the last value stays
        assert "held-out 0.250" in view._progress.tasks[0].fields["info"]
    finally:
        view.close()
