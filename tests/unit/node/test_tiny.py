"""The built-in tiny model: recipe hashing, tokenizer, cached atomic build under a lock, determinism."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from node.config import ModelConfig, TaskConfig
from node.model import tiny
from node.tasks import TaskSource, format_answer


@pytest.fixture(scope="module")
def small_dir(tiny_cache: Path) -> Path:
    return tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)  # shared by modules


def test_recipe_key_is_stable_and_changes_with_the_recipe() -> None:
    assert tiny.DEFAULT_RECIPE.key() == tiny.TinyRecipe().key()
    assert len(tiny.DEFAULT_RECIPE.key()) == 16
    assert dataclasses.replace(tiny.DEFAULT_RECIPE, correct_fraction=0.5).key() != tiny.DEFAULT_RECIPE.key()
    assert tiny.SMALL_RECIPE.key() != tiny.DEFAULT_RECIPE.key()


def test_recipe_overrides_from_the_model_config() -> None:
    assert tiny.recipe_with({}) is tiny.DEFAULT_RECIPE
    subset = [{"name": "chain_sum", "config": {"min_terms": 2}}]
    r = tiny.recipe_with({"sft_families": subset, "correct_fraction": 0.3})
    assert [f.name for f in r.sft_families] == ["chain_sum"] and r.correct_fraction == 0.3
    shared = tiny.recipe_with({"sft_families": subset, "tokenizer_families": subset})
    assert len({r.key(), shared.key(), tiny.DEFAULT_RECIPE.key()}) == 3
    # An empty tokenizer_families is left out of the hash, so the default recipe keeps its cached build.
    assert "tokenizer_families" not in tiny.DEFAULT_RECIPE.to_dict()
    with pytest.raises(ValueError, match="unknown built-in recipe field"):
        tiny.recipe_with({"sft_familys": subset})


def test_a_bad_builtin_recipe_is_a_model_load_error() -> None:
    from node.model.policy import ModelLoadError, load_policy

    with pytest.raises(ModelLoadError, match="model.builtin: unknown built-in recipe field"):
        load_policy(ModelConfig(name="builtin:tiny", device="cpu", builtin={"layers": 3}))


def test_default_cache_root_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tiny.default_cache_root() == tmp_path / "rl-swarm"
    assert tiny.model_dir().parent == tmp_path / "rl-swarm"
    assert tiny.model_dir(tmp_path / "x").parent == tmp_path / "x"


def test_build_writes_a_loadable_model_and_plain_tokenizer(small_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    for f in ("config.json", "model.safetensors", "tokenizer.json", "build_stats.json", "rl_swarm_recipe.json"):
        assert (small_dir / f).exists(), f
    assert json.loads((small_dir / "rl_swarm_recipe.json").read_text())["hidden_size"] == tiny.SMALL_RECIPE.hidden_size
    tok = PreTrainedTokenizerFast.from_pretrained(str(small_dir))
    assert not tok.chat_template
    assert tok.eos_token == tiny.EOS_TOKEN and tok.pad_token_id != tok.eos_token_id
    assert len(tok("<answer>", add_special_tokens=False)["input_ids"]) == 1
    assert tok("123", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(d) for d in "123"]
    text = "State the final answer: 3 - 7 =\n" + format_answer("-4")
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    model = AutoModelForCausalLM.from_pretrained(str(small_dir))
    assert model.config.vocab_size == len(tok)


def test_ensure_built_uses_the_cache(small_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_a, **_k):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(tiny, "build", fail)
    assert tiny.ensure_built(small_dir.parent, tiny.SMALL_RECIPE) == small_dir


def test_concurrent_first_builds_build_once_and_leave_no_temp_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def slow_build(recipe: tiny.TinyRecipe, out: Path) -> dict:
        calls.append(out)
        time.sleep(0.3)
        out.mkdir(parents=True, exist_ok=True)
        (out / "rl_swarm_recipe.json").write_text(json.dumps(recipe.to_dict()))
        return {}

    monkeypatch.setattr(tiny, "build", slow_build)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny.ensure_built(tmp_path, tiny.SMALL_RECIPE)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and (results[0] / "rl_swarm_recipe.json").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(recipe: tiny.TinyRecipe, out: Path) -> dict:
        (out / "half-written").write_text("x")
        raise RuntimeError("boom")

    monkeypatch.setattr(tiny, "build", broken)
    with pytest.raises(RuntimeError):
        tiny.ensure_built(tmp_path, tiny.SMALL_RECIPE)
    assert not tiny.model_dir(tmp_path, tiny.SMALL_RECIPE).exists()
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []


def test_a_killed_builds_temporary_directory_is_removed_by_the_next_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tiny.model_dir(tmp_path, tiny.SMALL_RECIPE)
    killed = tmp_path / f".{target.name}-k1ll3d_8"  # what SIGKILL mid-build leaves: the finally never ran
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"half")
    other = tmp_path / ".another-model-k1ll3d"  # another target's build (it holds its own lock): left alone
    other.mkdir()

    def build(recipe: tiny.TinyRecipe, out: Path) -> dict:
        (out / "rl_swarm_recipe.json").write_text(json.dumps(recipe.to_dict()))
        return {}

    monkeypatch.setattr(tiny, "build", build)
    assert tiny.ensure_built(tmp_path, tiny.SMALL_RECIPE) == target
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [".another-model-k1ll3d", target.name]


def test_build_is_deterministic(small_dir: Path, tmp_path: Path) -> None:
    again = tiny.ensure_built(tmp_path, tiny.SMALL_RECIPE)
    a, b = load_file(str(small_dir / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (small_dir / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()


def test_sft_examples_mix_gold_and_distractors() -> None:
    pairs = tiny.sft_examples(tiny.DEFAULT_RECIPE, 400, 0.35, salt=2)
    assert pairs == tiny.sft_examples(tiny.DEFAULT_RECIPE, 400, 0.35, salt=2)
    clean = tiny.sft_examples(tiny.DEFAULT_RECIPE, 50, 1.0, salt=1)
    assert all(p.endswith("\n") and c.startswith("<answer>") for p, c in clean)
    # gold targets are frequent but not all (some distractors coincide with the gold answer by chance)
    assert len({c for _, c in pairs}) > 5


def test_distractors_come_from_the_same_family() -> None:
    """Every noisy target is an answer of the question's own family: no number answers a spelling question and
    no word answers a sum (with ``correct_fraction=0`` each target is a distractor, most of them not gold)."""
    pairs = tiny.sft_examples(tiny.DEFAULT_RECIPE, 600, 0.0, salt=2)
    spell, other, spell_not_gold = 0, 0, 0
    for prompt, completion in pairs:
        answer = completion.removeprefix("<answer>").removesuffix("</answer>")
        numeric = answer.lstrip("-").isdigit()
        if "Spell this word backward" in prompt:
            spell += 1
            assert not numeric, (prompt, completion)
            word = prompt.splitlines()[0].rsplit(" ", 1)[-1]
            spell_not_gold += answer != word[::-1]
        else:
            other += 1
            assert numeric, (prompt, completion)
    assert spell > 50 and other > 50
    assert spell_not_gold > spell / 2  # the distractors are really drawn, not the gold answer


@pytest.mark.slow
def test_default_build_starts_between_zero_and_one(tmp_path: Path) -> None:
    """The real default model: builds, and starts clearly between 0 and 1 on the default task (its build time is a
    benchmark figure, not an assertion)."""
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine

    path = tiny.ensure_built(tmp_path)
    policy = load_policy(ModelConfig(cache_dir=tmp_path))
    assert policy.model.config.hidden_size == tiny.DEFAULT_RECIPE.hidden_size and path.exists()
    src = TaskSource(TaskConfig())
    items = [src.materialize(r) for r in src.sample(random.Random(123), 64)]
    outs = TransformersEngine(policy).generate(
        [policy.format_prompt(i.question) for i in items], 8, max_new_tokens=32, seed=0
    )
    rewards = [src.score(i, c.text) for i, o in zip(items, outs, strict=True) for c in o]
    success = sum(r == 1.0 for r in rewards) / len(rewards)
    # The recipe starts the model between 0 and 1 so RL has signal from the first step (exact success on training
    # items ~0.14; benchmarks/results/b7_generalization.md has what RL then does): clearly above 0, far below 1.
    assert 0.05 <= success <= 0.6, success
