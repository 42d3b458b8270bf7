"""The vLLM engine's parts that need no vLLM: the install check's messages, when weights are synced, what a sync
writes for the server. The engine itself runs in ``tests/integration/test_vllm_engine.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from node.rollout import engine_vllm
from node.rollout.engine_vllm import VllmInstallError, _ChunkedEngine, check_install, vllm_dtype, write_weights


class _Tied(torch.nn.Module):
    """A model with a tied LM head, like the built-in model and SmolLM2."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.lm_head = torch.nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.embed.weight

        class _Config:
            def to_json_file(self, path: str) -> None:
                Path(path).write_text('{"model_type": "test"}')

        self.config = _Config()


class _Counting(_ChunkedEngine):
    """The shared engine logic over a backend that only counts loads."""

    def __init__(self, sync_every: int) -> None:
        policy = type("P", (), {"model": _Tied(), "eos_token_ids": [0]})()
        super().__init__(policy, sync_every=sync_every)
        self.loads = 0

    def _complete(self, prompts: Any, max_tokens: Any, temperature: Any, top_p: Any, seed: Any) -> list[Any]:
        raise AssertionError("not used")

    def _load(self) -> None:
        self.loads += 1


def test_missing_vllm_names_both_install_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    check_install.cache_clear()  # an earlier test of this process may have found vLLM working
    with pytest.raises(VllmInstallError) as e:
        check_install()
    assert engine_vllm.INSTALL_CPU in str(e.value) and engine_vllm.INSTALL_GPU in str(e.value)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_weights_are_synced_every_k_updates_and_completions_keep_their_version(k: int) -> None:
    engine = _Counting(sync_every=k)
    for version in range(1, 7):
        engine.set_policy_version(version)
        stats = engine.stats()
        assert stats["engine_version"] == (version // k) * k  # the weights vLLM samples with
        assert stats["engine_lag"] == version % k
    assert engine.loads == 6 // k


def test_restored_weights_are_always_synced() -> None:
    engine = _Counting(sync_every=4)
    engine.sync_weights(2)  # a resume: the learner's weights were replaced whatever the count
    assert engine.loads == 1 and engine.policy_version == 2 and engine.stats()["engine_syncs"] == 1


def test_a_sync_directory_has_every_tied_name_and_the_config(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = _Tied()
    out = write_weights(model, tmp_path / "sync")
    saved = load_file(str(out / engine_vllm.WEIGHTS_FILE))
    # vLLM's in-place reload keeps the old head of a tied model unless the head's name is in the checkpoint
    assert set(saved) == {"embed.weight", "lm_head.weight"}
    assert torch.equal(saved["lm_head.weight"], model.embed.weight.detach())
    assert (out / "config.json").exists() and not list(out.glob(".*.tmp"))


def test_vllm_dtype_follows_the_learner() -> None:
    assert vllm_dtype("auto", torch.float32) == "float32"
    assert vllm_dtype("auto", torch.bfloat16) == "bfloat16"
    assert vllm_dtype("float16", torch.float32) == "float16"
