"""``swarm-node join`` with no ``--config``: the default node is the laboratory node, started from the weights shipped
in the package (an empty model cache, no build), and it trains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from node.telemetry.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]


def test_join_without_a_config_trains_the_laboratory_node_from_the_shipped_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(run_dir), "--transport", "memory"]
    cmd += ["--max-steps", "3", "--set", "rollout.prompts_per_step=4", "--set", "sapo.local_groups=4"]
    cmd += ["--set", "eval.at_start=false", "--set", "eval.at_end=false", "--set", "eval.every_steps=null"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["model"]["name"] == "builtin:lab"
    assert [f["name"] for f in cfg["tasks"]["families"]] == ["lab_add", "lab_sub"]
    assert "from the weights shipped in the package" in res.stderr, res.stderr[-3000:]
    assert "warm start step" not in res.stderr  # installed, not built
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["gen_tokens"] > 0 for r in rows), rows  # every step rolled out on the laboratory families
    # and trained: a step whose groups are all right or all wrong has nothing to learn from, so not every step need
    assert any(r.get("sequences", 0) > 0 for r in rows), rows
