"""The simulator evaluates identical initial nodes once per run (issue 68): several configurations that start from
the same models share one step-0 evaluation, written into each pair's node directory, and every evaluation record
(step 0 and the last) is the one each pair's own start evaluation gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.config import load_sim_config
from sim.runner import run_experiment

ROOT = Path(__file__).resolve().parents[3]


def records(node_dir: Path) -> list[dict]:
    """A node's evaluations, less when and how long they took."""
    lines = (node_dir / "eval.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in ("time", "eval_s")} for x in lines if x.strip()]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("workers", [1, 2])
def test_identical_initial_nodes_are_evaluated_once_per_run(tmp_path: Path, workers: int) -> None:
    cache = f"node.model.cache_dir={tmp_path / 'cache'}"
    sim = load_sim_config(str(ROOT / "configs" / "sim" / "controls-het.yaml"), [cache, "node.eval.at_start=true"],
                          quick=True).model_copy(update={"workers": workers})  # fmt: skip
    pairs = [("alone", 0), ("receiver", 0)]
    run_experiment(sim, tmp_path / "once", pairs=pairs)
    assert len(list((tmp_path / "once" / "start").iterdir())) == sim.nodes  # two distinct initial nodes, once each
    for pair in pairs:  # each pair on its own evaluates its own start (its two nodes differ: nothing to share)
        run_experiment(sim.model_copy(update={"workers": 1}), tmp_path / "own", pairs=[pair])
    assert not (tmp_path / "own" / "start").exists()
    for arm, seed in pairs:
        for i in range(sim.nodes):
            once = records(tmp_path / "once" / arm / f"seed{seed}" / f"node{i}")
            own = records(tmp_path / "own" / arm / f"seed{seed}" / f"node{i}")
            assert [r["step"] for r in once] == [0, sim.steps] and once == own, (arm, i)
