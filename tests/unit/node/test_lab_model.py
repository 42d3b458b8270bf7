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


def test_a_build_is_pinned_to_avx2_kernels_only_on_a_wider_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    for native, env in (("AVX512", {"ATEN_CPU_CAPABILITY": "avx2"}), ("AVX2", {}), ("DEFAULT", {}), ("NO AVX", {})):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda native=native: native)
        assert lab.pinned_capability_env() == env, native
        assert lab.build_capability() == ("AVX2" if env else native)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")  # the user's choice stands
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert lab.pinned_capability_env() == {} and lab.build_capability() == "AVX512"


_DIGEST = """
import hashlib, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
from node.model import lab
out = lab.ensure_built(Path(sys.argv[1]), lab.recipe_with({spec}))
h = hashlib.sha256()
for k, t in sorted(AutoModelForCausalLM.from_pretrained(str(out)).state_dict().items()):
    h.update(k.encode()); h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
print(torch.backends.cpu.get_cpu_capability(), h.hexdigest())
"""


def _build_digest(cache: Path, capability: str | None) -> tuple[str, str]:
    """(the process's own kernels, the built model's weight digest), built in a fresh process."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env |= {"ATEN_CPU_CAPABILITY": capability} if capability else {}
    code = _DIGEST.replace("{spec}", repr(_SMALL))
    done = subprocess.run([sys.executable, "-c", code, str(cache)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    own, digest = done.stdout.split()[-2:]
    return own, digest


def test_a_build_on_a_wider_processor_is_the_avx2_build(tmp_path: Path) -> None:
    """Where torch runs on AVX-512 (a Zen 4 host), an unpinned build would give another model than an AVX2 host's
    (even this two-step recipe does); the build runs in a process on AVX2 kernels and gives the AVX2 model."""
    own, pinned = _build_digest(tmp_path / "pinned", None)  # a process on the processor's own kernels (``own``)
    if own not in ("AVX512", "AVX2"):  # a processor without AVX2: nothing to pin, the build is its own
        return
    assert _build_digest(tmp_path / "avx2", "avx2") == ("AVX2", pinned)
    if own == "AVX512":  # what the pin is for: the processor's own kernels build another model
        assert _build_digest(tmp_path / "avx512", "avx512")[1] != pinned
