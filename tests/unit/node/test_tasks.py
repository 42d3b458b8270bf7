"""Task refs regenerate items deterministically; every SAPO family (and chain_sum) scores its gold answer 1.0."""

from __future__ import annotations

import random

import pytest

from node.config import TaskConfig, TaskFamily
from node.tasks import SAPO_FAMILIES, TaskError, TaskSource, extract_answer, format_answer
from protocol.types import TaskRef

ALL_FAMILIES = [*SAPO_FAMILIES, "chain_sum"]


@pytest.fixture(scope="module")
def source() -> TaskSource:
    return TaskSource(TaskConfig(families=[TaskFamily(name=f) for f in ALL_FAMILIES], seed=7))


def _gold(item) -> str:
    return item.answer if item.answer is not None else item.metadata["example_answer"]


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_gold_answer_scores_one_and_wrong_answer_less(source: TaskSource, family: str) -> None:
    for index in (0, 1, 17):
        item = source.materialize(TaskRef(family=family, config={}, seed=7, index=index))
        assert item.question
        assert source.score(item, "Let me think.\n" + format_answer(_gold(item))) == 1.0
        assert source.score(item, format_answer("certainly wrong ###")) < 1.0
        assert source.score(item, "no tags at all") == 0.0
        assert source.score(item, "<answer>unclosed") == 0.0


def test_propositional_logic_is_scored_against_premises(source: TaskSource) -> None:
    item = source.materialize(TaskRef(family="propositional_logic", config={}, seed=7, index=3))
    assert item.answer is None
    assert source.score(item, format_answer(item.metadata["example_answer"])) == 1.0
    assert source.score(item, format_answer("P AND NOT P")) < 1.0


def test_materialize_is_deterministic_across_sources() -> None:
    cfg = TaskConfig(families=[TaskFamily(name=f) for f in ALL_FAMILIES])
    a, b = TaskSource(cfg), TaskSource(cfg, cache_items=1)
    refs = a.sample(random.Random(3), 50)
    for ref in refs:
        ia, ib = a.materialize(ref), b.materialize(ref)
        assert (ia.question, ia.answer) == (ib.question, ib.answer)
    assert a.materialize(refs[0]) is a.materialize(refs[0])  # cached


def test_sample_is_deterministic_weighted_and_in_pool() -> None:
    cfg = TaskConfig(
        families=[TaskFamily(name="chain_sum", weight=3.0), TaskFamily(name="basic_arithmetic", weight=1.0)],
        seed=5,
        pool_size=50,
    )
    src = TaskSource(cfg)
    refs = src.sample(random.Random(0), 400)
    assert refs == src.sample(random.Random(0), 400)
    assert all(r.seed == 5 and 0 <= r.index < 50 for r in refs)
    share = sum(r.family == "chain_sum" for r in refs) / len(refs)
    assert 0.65 < share < 0.85


def test_foreign_family_config_or_index_is_refused() -> None:
    src = TaskSource(TaskConfig(families=[TaskFamily(name="chain_sum", config={"min_terms": 2, "max_terms": 2})]))
    ok = TaskRef(family="chain_sum", config={"min_terms": 2, "max_terms": 2}, seed=0, index=3)
    assert src.accepts(ok) and src.materialize(ok).answer is not None
    with pytest.raises(TaskError):
        src.materialize(TaskRef(family="countdown", config={}, seed=0, index=0))
    with pytest.raises(TaskError):
        src.materialize(TaskRef(family="chain_sum", config={"min_terms": 2, "max_terms": 12}, seed=0, index=0))
    with pytest.raises(TaskError):
        src.materialize(TaskRef(family="chain_sum", config={"min_terms": 2, "max_terms": 2}, seed=0, index=-1))
    with pytest.raises(TaskError):
        src.materialize(TaskRef(family="chain_sum", config={"min_terms": 2, "max_terms": 2}, seed=-3, index=0))


def test_bad_family_configs_fail_at_start() -> None:
    with pytest.raises(TaskError, match="unknown task family"):
        TaskSource(TaskConfig(families=[TaskFamily(name="no_such_dataset")]))
    with pytest.raises(TaskError, match="invalid config"):
        TaskSource(TaskConfig(families=[TaskFamily(name="chain_sum", config={"min_terms": 5, "max_terms": 2})]))
    with pytest.raises(TaskError, match="seed"):
        TaskSource(TaskConfig(families=[TaskFamily(name="chain_sum", config={"seed": 1})]))


def test_size_in_config_bounds_indices() -> None:
    src = TaskSource(TaskConfig(families=[TaskFamily(name="chain_sum", config={"size": 10})]))
    assert src.materialize(TaskRef(family="chain_sum", config={"size": 10}, index=9)).question
    with pytest.raises(TaskError):
        src.materialize(TaskRef(family="chain_sum", config={"size": 10}, index=10))


def test_item_does_not_depend_on_virtual_size() -> None:
    a = TaskSource(TaskConfig(families=[TaskFamily(name="chain_sum", config={"size": 100})]))
    b = TaskSource(TaskConfig(families=[TaskFamily(name="chain_sum")]))
    ia = a.materialize(TaskRef(family="chain_sum", config={"size": 100}, index=42))
    ib = b.materialize(TaskRef(family="chain_sum", config={}, index=42))
    assert (ia.question, ia.answer) == (ib.question, ib.answer)


def test_extract_answer_takes_the_last_closed_tag() -> None:
    assert extract_answer("<answer>1</answer> no, <answer> 2 </answer>") == "2"
    assert extract_answer("<answer>a\nb</answer>") == "a\nb"
    assert extract_answer("<answer>1</answer><answer>2") == "1"
    assert extract_answer("<answer>dar<answer>ro</answer>") == "ro"
    assert extract_answer("") is None


def test_default_task_scores_partial_credit_in_unit_range() -> None:
    src = TaskSource(TaskConfig())
    for ref in src.sample(random.Random(1), 30):
        item = src.materialize(ref)
        for text in (format_answer(item.answer + "0"), format_answer("-" + item.answer), "\x00" * 10):
            assert 0.0 <= src.score(item, text) <= 1.0
