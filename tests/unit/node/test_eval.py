"""Evaluation on the dev and test sides: the sides are stable shares of problem space and disjoint from training
draws, peers cannot feed dev or test items to the learner, every result names its side and carries per-item
records, and evaluating the same weights twice gives the same numbers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from node.config import EvalConfig, ModelConfig, RolloutConfig, TaskConfig, TaskFamily
from node.eval import Evaluator, append_result, headline, read_results
from node.model import tiny
from node.tasks import TaskError, TaskSource, side_of_hash, split_key, split_side

FAMILIES = [
    TaskFamily(name="chain_sum", config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    TaskFamily(name="spell_backward", config={"min_word_len": 3, "max_word_len": 6}),
    TaskFamily(name="basic_arithmetic"),
]


@pytest.fixture(scope="module")
def source() -> TaskSource:
    return TaskSource(TaskConfig(families=FAMILIES, seed=3))


def test_sides_are_stable_shares_of_question_space() -> None:
    questions = [f"Question number {i}?" for i in range(20_000)]
    shares = TaskConfig(test_fraction=0.1, dev_fraction=0.15)
    sides = [split_side("x", q, shares) for q in questions]
    assert 0.09 < sides.count("test") / len(sides) < 0.11
    assert 0.135 < sides.count("dev") / len(sides) < 0.165
    assert sides[:100] == [split_side("x", q, shares) for q in questions[:100]]
    tiny_shares = TaskConfig(test_fraction=1e-9, dev_fraction=1e-9)
    assert all(split_side("x", q, tiny_shares) == "train" for q in questions)


def test_side_boundaries_are_exact() -> None:
    """SPEC 13: ``hash64 < t * 2**64`` and ``hash64 < (t + d) * 2**64``, compared exactly (no rounding of the hash)."""
    t = 0.1
    bound = int(t * 2**64)  # t * 2**64 is a binary64 integer here: the bound itself is not below it
    assert side_of_hash(bound - 1, t, 0.1) == "test" and side_of_hash(bound, t, 0.1) == "dev"
    upper = int((t + 0.1) * 2**64)
    assert side_of_hash(upper - 1, t, 0.1) == "dev" and side_of_hash(upper, t, 0.1) == "train"
    assert side_of_hash(0, t, 0.1) == "test" and side_of_hash(2**64 - 1, t, 0.1) == "train"


def test_training_draws_and_evaluation_sides_are_disjoint_on_problems(source: TaskSource) -> None:
    train = {split_key(r.family, source.materialize(r).question) for r in source.sample(random.Random(0), 3000)}
    for side in ("test", "dev"):
        refs = source.split_refs(side, 40, seed=1_000_003)
        assert set(refs) == {f.name for f in FAMILIES}
        keys = set()
        for fam, fam_refs in refs.items():
            assert len(fam_refs) == 40, (side, fam)
            items = [source.materialize(r) for r in fam_refs]
            fam_keys = [split_key(fam, it.question) for it in items]
            assert len(set(fam_keys)) == len(fam_keys)  # distinct problems
            assert all(source.side(it) == side for it in items)
            keys |= set(fam_keys)
        # chain_sum has ~20k questions: 3000 training draws of a third of them hit every common one, so a
        # disjoint result is only possible because the split is on the problem, not on seeds or indices
        assert keys and not (keys & train), side
    test_keys = {
        split_key(r.family, source.materialize(r).question)
        for rs in source.split_refs("test", 40, 9).values()
        for r in rs
    }
    dev_keys = {
        split_key(r.family, source.materialize(r).question)
        for rs in source.split_refs("dev", 40, 9).values()
        for r in rs
    }
    assert not test_keys & dev_keys


def test_training_draws_from_a_tiny_family_still_avoid_dev_and_test() -> None:
    small = TaskSource(
        TaskConfig(
            families=[
                TaskFamily(name="chain_sum", config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
            ],
            test_fraction=0.3,
            dev_fraction=0.2,
        )
    )
    questions = {small.materialize(r).question for r in small.sample(random.Random(1), 2000)}
    keys = {split_key("chain_sum", q) for q in questions}
    test = {
        split_key("chain_sum", small.materialize(r).question) for r in small.split_refs("test", 500, 9)["chain_sum"]
    }
    dev = {split_key("chain_sum", small.materialize(r).question) for r in small.split_refs("dev", 500, 9)["chain_sum"]}
    assert test and dev and len(test) + len(dev) < 100  # a family of ~100 problems cannot yield 500 of either
    assert not (keys & test) and not (keys & dev) and not (test & dev)


def test_peers_groups_on_dev_and_test_items_are_refused(source: TaskSource) -> None:
    for side in ("test", "dev"):
        ref = source.split_refs(side, 1, seed=5)["spell_backward"][0]
        with pytest.raises(TaskError, match=f"{side} side"):
            source.materialize_for_training(ref)
    train_ref = source.sample(random.Random(2), 1)[0]
    assert source.materialize_for_training(train_ref).question


def test_old_heldout_fraction_is_refused_with_its_replacement_named() -> None:
    with pytest.raises(ValueError, match="test_fraction and tasks.dev_fraction"):
        TaskConfig.model_validate({"heldout_fraction": 0.1})
    with pytest.raises(ValueError, match="less than 0.01"):
        TaskConfig(test_fraction=0.5, dev_fraction=0.5)


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
    assert a["step"] == 7 and a["side"] == "test" and set(a["families"]) == {f.name for f in FAMILIES}
    for name, fam in a["families"].items():
        assert fam["n"] == 6
        keys = [split_key(it.ref.family, it.question) for it in ev.items[name]]
        assert [r["key"] for r in fam["items"]] == keys
        assert [r["samples_right"] for r in fam["items"]] == fam["correct"]
        assert all(r["n_samples"] == 2 and isinstance(r["greedy_right"], bool) for r in fam["items"])
        assert sum(r["greedy_right"] for r in fam["items"]) / 6 == pytest.approx(fam["greedy_accuracy"])
        assert 0.0 <= fam["accuracy"] <= 1.0 and 0.0 <= fam["greedy_accuracy"] <= 1.0
        assert 0.0 <= fam["format_rate"] <= 1.0 and 0 < fam["mean_length"] <= 8
    assert a["accuracy"] == pytest.approx(sum(f["accuracy"] for f in a["families"].values()) / 3)
    strip = lambda r: {k: v for k, v in r.items() if k not in ("time", "eval_s")}  # noqa: E731
    assert strip(a) == strip(b)
    other = Evaluator(source, policy, engine, cfg.model_copy(update={"seed": 77}), RolloutConfig())
    assert other.refs != ev.refs  # another scan seed, other items
    dev = Evaluator(source, policy, engine, cfg.model_copy(update={"side": "dev"}), RolloutConfig())
    assert all(source.side(it) == "dev" for items in dev.items.values() for it in items)
    assert dev.evaluate(7)["side"] == "dev"


def test_eval_batch_size_widens_the_engines_batch_for_the_evaluation_only(small_policy, source: TaskSource) -> None:
    policy, engine = small_policy
    widths: list[int] = []
    generate = engine.generate

    def spy(*args, **kwargs):
        widths.append(engine.batch_size)
        return generate(*args, **kwargs)

    cfg = EvalConfig(items_per_family=6, samples=2, max_new_tokens=8, batch_size=5)
    engine.generate = spy
    try:
        wide = Evaluator(source, policy, engine, cfg, RolloutConfig()).evaluate(3)
        plain = Evaluator(source, policy, engine, cfg.model_copy(update={"batch_size": None}), RolloutConfig())
        default = plain.evaluate(3)
    finally:
        del engine.generate
    assert widths == [5] * 6 + [64] * 6 and engine.batch_size == 64  # sampled and greedy, three families each
    for fam in FAMILIES:  # the same items and sizes; the draws may differ with the batch (other samples)
        a, b = wide["families"][fam.name], default["families"][fam.name]
        assert [r["key"] for r in a["items"]] == [r["key"] for r in b["items"]] and a["n"] == b["n"] == 6
        assert a["greedy_accuracy"] == b["greedy_accuracy"]  # greedy decoding does not depend on the batch


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


def test_a_real_models_own_evaluations_are_quick_unless_sized_explicitly() -> None:
    from node.config import EvalConfig

    auto = EvalConfig()
    quick = auto.sized_for("smollm2-135m")
    assert (quick.items_per_family, quick.samples) == (8, 2)
    assert auto.sized_for("builtin:tiny") is auto  # built-in models evaluate in seconds: full size
    explicit = EvalConfig(items_per_family=24)
    assert explicit.sized_for("smollm2-135m") is explicit  # a benchmark that sets a size keeps it
    forced = EvalConfig(quick=True, quick_items_per_family=4, quick_samples=1).sized_for("builtin:tiny")
    assert (forced.items_per_family, forced.samples) == (4, 1)
    assert EvalConfig(quick=False).sized_for("smollm2-135m").items_per_family == 48
