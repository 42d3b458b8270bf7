"""``model.warm_start``: a supervised warm start on training items only, built once per recipe and cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from node.config import ModelConfig, TaskConfig, TaskFamily, WarmStartConfig
from node.model import tiny, warm
from node.model.policy import load_policy
from node.tasks import TaskSource, split_key

FAMILY = TaskFamily(name="chain_sum", config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})


def _cfg(**kw) -> WarmStartConfig:
    return WarmStartConfig(families=[FAMILY], **{"examples": 64, "batch_size": 16, "lr": 3e-3, **kw})


def test_examples_come_from_the_training_split_only() -> None:
    cfg = _cfg(examples=300, task_seed=0)
    src = TaskSource(TaskConfig(families=[FAMILY], seed=0))
    chosen = warm.items(cfg)
    assert len(chosen) == 300 and all(it.answer is not None for it in chosen)
    assert all(src.side(it) == "train" for it in chosen)
    # the problems an evaluation of tasks.seed 0 reads on either side never appear (a small space: ~100 sums)
    chosen_keys = {split_key(FAMILY.name, it.question) for it in chosen}
    for side in ("test", "dev"):
        held = {
            split_key(FAMILY.name, src.materialize(r).question)
            for r in src.split_refs(side, 48, 1_000_003)[FAMILY.name]
        }
        assert held and not held & chosen_keys, side


def test_warm_start_is_built_once_records_its_recipe_and_changes_the_weights(
    tiny_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = []
    real = warm.train_sft
    monkeypatch.setattr(warm, "train_sft", lambda *a, **kw: builds.append(1) or real(*a, **kw))
    base_dir = str(tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE))
    base = load_policy(ModelConfig(name=base_dir))
    cfg = ModelConfig(name=base_dir, cache_dir=tmp_path, warm_start=_cfg())
    first = load_policy(cfg)
    assert len(builds) == 1
    path = Path(first.source)
    assert path.parent == tmp_path and path.name.startswith("warm-")
    rec = json.loads((path / warm.RECIPE_FILE).read_text())
    assert rec["base"] == base_dir and rec["warm_start"]["families"][0]["name"] == "chain_sum"
    stats = json.loads((path / "warm_stats.json").read_text())
    assert stats["steps"] == 4 and stats["final_loss"] < stats["first_loss"]  # it learned the targets
    changed = [k for k, v in first.model.state_dict().items() if not torch.equal(v, base.model.state_dict()[k])]
    assert changed, "the warm start left every weight as it was"

    again = load_policy(cfg)
    assert len(builds) == 1  # cached: no second fine-tuning
    assert again.source == first.source and again.name.endswith("+warm")
    for k, v in again.model.state_dict().items():
        assert torch.equal(v, first.model.state_dict()[k])

    other = load_policy(ModelConfig(name=base_dir, cache_dir=tmp_path, warm_start=_cfg(seed=1)))
    assert other.source != first.source  # another recipe, another directory


LAB = TaskFamily(name="lab_sub", config={"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3})


def test_trace_targets_carry_the_working_and_change_the_recipe() -> None:
    bare = WarmStartConfig(families=[LAB], examples=8)
    traced = WarmStartConfig(families=[LAB], examples=8, traces=True)
    src = warm.source(traced)
    chosen = warm.items(traced, src)
    texts = warm.targets(traced, src, chosen)
    for it, text in zip(chosen, texts, strict=True):
        assert text.startswith("<think>") and text.endswith(f"<answer>{it.answer}</answer>")
        assert len(text) > len(f"<answer>{it.answer}</answer>") + 20  # the working, not only the answer
    assert warm.targets(bare, src, chosen) == [f"<answer>{it.answer}</answer>" for it in chosen]

    # an old recipe (no traces) keeps its cache key; a traced one is another recipe
    class P:
        name, source, dtype, tokenizer_id, format_example = "m", "m", torch.float32, "t", True

    assert "traces" not in warm.recipe(P, bare)["warm_start"]
    assert warm.recipe(P, traced)["warm_start"]["traces"] is True


def test_traces_need_a_family_that_writes_working() -> None:
    cfg = _cfg(traces=True, examples=4)
    src = warm.source(cfg)
    with pytest.raises(ValueError, match="chain_sum.*writes no working"):
        warm.targets(cfg, src, warm.items(cfg, src))
