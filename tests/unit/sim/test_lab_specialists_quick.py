"""The laboratory specialists experiment in its quick form: the real ``swarm-sim`` CLI on
``configs/sim/lab-specialists.yaml --quick``.

Two specialised laboratory nodes (small recipes) in the three configurations; the report has a row per
configuration, the per-node per-family table and the per-family panels."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(900)
def test_the_demo_runs_and_reports_per_family(tmp_path: Path) -> None:
    exe = shutil.which("swarm-sim")
    cmd = [exe] if exe else [sys.executable, "-m", "sim.cli"]
    out = tmp_path / "demo"
    config = "configs/sim/lab-specialists.yaml"
    args = ["run", config, "--quick", "--out", str(out), "--set", f"node.model.cache_dir={tmp_path}"]
    subprocess.run([*cmd, *args], check=True, cwd=ROOT, capture_output=True, text=True)
    text = (out / "results.md").read_text()
    for config in ("alone", "alone-labels", "sharing"):
        assert f"| {config} |" in text
        for node in (0, 1):
            for fam in ("lab_add", "lab_sub"):
                assert f"| {config} | {node} | {fam} |" in text, (config, node, fam)
    assert (out / "families.png").stat().st_size > 10_000
    # the specialised warm starts are two recipes: one cached model each
    assert len(list(tmp_path.glob("lab-*/rl_swarm_recipe.json"))) == 2
    # the labels control reached the learner of the labelled configuration only
    import json

    def updates(config: str) -> int:
        rows = [json.loads(x) for x in (out / config / "seed0" / "node0" / "metrics.jsonl").read_text().splitlines()]
        return int(rows[-1]["policy_version"])

    assert updates("alone-labels") == 3
