"""The laboratory model's recipe and build (node.model.lab)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.model import lab

_SMALL = {"sft_steps": 2, "sft_batch_size": 4, "hidden_size": 32, "intermediate_size": 64, "num_layers": 1,
          "num_heads": 2, "num_kv_heads": 1, "tokenizer_items": 40}  # fmt: skip


def test_recipes_name_their_families_and_hash_apart() -> None:
    add_only = lab.recipe_with({"families": [{"name": "lab_add"}]})
    assert [f.name for f in add_only.families] == ["lab_add"]
    assert len({add_only.key(), lab.DEFAULT_LAB_RECIPE.key(), lab.recipe_with({"trace": False}).key()}) == 3
    with pytest.raises(ValueError, match="warm-starts on"):
        lab.recipe_with({"families": [{"name": "chain_sum"}]})
    with pytest.raises(ValueError, match="unknown laboratory recipe field"):
        lab.recipe_with({"sft_clean_steps": 3})


def test_the_warm_start_draws_train_side_items_of_its_families_only() -> None:
    recipe = lab.recipe_with({"families": [{"name": "lab_sub"}]})
    pairs = lab.training_examples(recipe, recipe.families, 50, 1, trace=True)
    assert all(" - " in p and c.startswith("<think>") and c.endswith("</answer>") for p, c in pairs)
    from node.config import TaskConfig
    from node.tasks import split_side

    assert {split_side("lab_sub", p.split("\n")[0], TaskConfig()) for p, _ in pairs} == {"train"}


def test_builtin_lab_builds_and_loads_offline(tmp_path: Path) -> None:
    from node.config import ModelConfig
    from node.model.policy import load_policy

    policy = load_policy(ModelConfig(name="builtin:lab", device="cpu", cache_dir=tmp_path, builtin=_SMALL))
    ids = policy.encode("<think>12+3\n2+3=5 1 r5</think><answer>15</answer>")
    assert policy.tokenizer.convert_ids_to_tokens(ids[:1]) == ["<think>"]
    assert len(policy.encode("12345")) == 5  # digits one per token
    assert (lab.model_dir(tmp_path, lab.recipe_with(_SMALL)) / "rl_swarm_recipe.json").exists()
