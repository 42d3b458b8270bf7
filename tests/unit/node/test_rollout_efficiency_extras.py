"""Rollout-efficiency extras: the APRIL and VADE benchmarks' quick modes run; the default path never imports vllm;
the vLLM engine on a GPU (marker ``gpu``: same interface, per-token logprobs, weight sync without a restart)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_b2_april_quick(tmp_path: Path, tiny_cache: Path) -> None:
    assert _load("b2_april").main(["--quick", "--out", str(tmp_path), "--cache-dir", str(tiny_cache)]) == 0
    text = (tmp_path / "b2_april.md").read_text()
    assert "| APRIL 2x |" in text and "without APRIL" in text and "cores" in text


def test_vade_quick(tmp_path: Path) -> None:
    assert _load("vade").main(["--quick", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")]) == 0
    text = (tmp_path / "vade.md").read_text()
    assert "| uniform |" in text and "| vade |" in text and "| vade-dart |" in text


def test_default_path_never_imports_vllm() -> None:
    code = (
        "import sys, node.runtime, node.rollout.engine, node.rollout.planner, node.rollout.april\n"
        "import node.rollout.engine_vllm, swarm.vade\n"
        "print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _gpu_ready() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


@pytest.mark.gpu  # deselected by default; `pytest -m gpu` on a GPU machine runs it (and fails loudly elsewhere)
def test_vllm_engine_logprobs_and_weight_sync(tmp_path: Path) -> None:
    assert _gpu_ready(), "needs a CUDA GPU and vllm installed (pip install -e '.[vllm]')"
    import torch

    from node.config import ModelConfig
    from node.model import tiny
    from node.model.policy import load_policy
    from node.rollout.engine import RolloutRequest, apply_top_p
    from node.rollout.engine_vllm import VllmEngine

    path = tiny.ensure_built(tmp_path / "cache", tiny.SMALL_RECIPE)
    policy = load_policy(ModelConfig(name=str(path), device="cuda", dtype="float32"))
    engine = VllmEngine(policy, str(path), sync_dir=tmp_path / "sync", gpu_memory_utilization=0.3)
    prompts = [policy.format_prompt(q) for q in ("What is 2 + 3?", "Hi")]
    groups = engine.generate(prompts, 4, max_new_tokens=16, temperature=1.0, seed=0)
    assert [len(g) for g in groups] == [4, 4]

    def recompute(c) -> list[float]:
        ids = torch.tensor([c.prompt_ids + c.token_ids], device="cuda")
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
        logp = torch.log_softmax(apply_top_p(logits, 1.0), dim=-1)
        return logp.gather(-1, torch.tensor(c.token_ids, device="cuda")[:, None]).squeeze(-1).tolist()

    for c in groups[0]:
        assert len(c.logprobs) == len(c.token_ids) >= 1
        assert max(abs(a - b) for a, b in zip(c.logprobs, recompute(c), strict=True)) < 2e-2
    # weight sync without a restart: perturb the learner's weights, bump the version, logprobs follow
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.set_policy_version(1)
    c = engine.generate(prompts[:1], 1, max_new_tokens=16, seed=1)[0][0]
    assert c.policy_version == 1
    assert max(abs(a - b) for a, b in zip(c.logprobs, recompute(c), strict=True)) < 2e-2
    # APRIL on vLLM: chunked generation stops early and continues a prefix
    outs = engine.generate_requests(
        [RolloutRequest(c.prompt_ids, 32) for _ in range(8)], seed=2, should_stop=lambda f: sum(f) >= 1
    )
    assert len(outs) == 8 and all(len(o.token_ids) == len(o.logprobs) for o in outs)
