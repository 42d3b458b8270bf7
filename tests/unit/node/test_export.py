"""``swarm-node export``: a run's checkpoint becomes a Hugging Face model directory that loads with plain
transformers and gives exactly the logits of the node's policy at that checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from node.config import LearnerConfig, ModelConfig, NodeConfig
from node.learn.checkpoint import load_latest, restore, save_checkpoint
from node.learn.learner import Learner, TrainSample
from node.model import tiny
from node.model.policy import load_policy
from protocol.config import write_resolved

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def base_path(tiny_cache: Path) -> Path:
    return tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)  # shared by modules


def _export(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "node.cli.app", "export", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)


def test_export_round_trips_the_checkpoint(base_path, tmp_path):
    cfg = NodeConfig.model_validate({"model": {"name": str(base_path), "device": "cpu"}})
    run_dir = tmp_path / "run"
    write_resolved(cfg, run_dir)
    policy = load_policy(cfg.model)
    lrn = Learner(policy.model, LearnerConfig(lr=1e-2), device="cpu", pad_token_id=0, max_tokens=8)
    ids = policy.encode("What is 2 + 3?")
    lrn.step([TrainSample(ids, ids[:4], 1.0), TrainSample(ids, ids[2:6], -1.0)])  # weights now differ from base
    save_checkpoint(run_dir / "checkpoints", lrn, step=7)
    eval_row = {
        "step": 5, "accuracy": 0.25, "greedy_accuracy": 0.5, "time": 0.0,
        "families": {"chain_sum": {"accuracy": 0.25, "greedy_accuracy": 0.5, "format_rate": 1.0,
                                   "mean_length": 6.0, "n": 8}},
    }  # fmt: skip
    (run_dir / "eval.jsonl").write_text(json.dumps(eval_row) + "\n")

    out = tmp_path / "hf"
    res = _export("--run-dir", str(run_dir), "--out", str(out))
    assert res.returncode == 0, res.stderr
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"):
        assert (out / name).is_file(), name
    card = (out / "README.md").read_text()
    assert "step 7" in card and "Held-out evaluation (step 5)" in card and "| chain_sum | 25.0% | 50.0%" in card

    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    exported = AutoModelForCausalLM.from_pretrained(str(out))
    tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    assert tok("What is 2 + 3?", add_special_tokens=False)["input_ids"] == ids

    node_policy = load_policy(cfg.model)  # the node's view of step 7: base model + restored checkpoint
    node_learner = Learner(node_policy.model, LearnerConfig(), device="cpu", pad_token_id=0, max_tokens=8)
    restore(node_learner, load_latest(run_dir / "checkpoints"))
    x = torch.tensor([ids])
    with torch.no_grad():
        want = node_policy.model(input_ids=x).logits
        got = exported(input_ids=x).logits
        base = load_policy(cfg.model).model(input_ids=x).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(base, want, atol=1e-5), "the checkpoint must differ from the base model"


def test_export_errors_are_one_line(base_path, tmp_path):
    res = _export("--run-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert "not a run directory" in res.stderr
    cfg = NodeConfig.model_validate({"model": ModelConfig(name=str(base_path)).model_dump()})
    write_resolved(cfg, tmp_path / "run")
    res = _export("--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "o"), "--step", "3")
    assert res.returncode == 1 and "no intact checkpoint for step 3" in res.stderr and "Traceback" not in res.stderr
