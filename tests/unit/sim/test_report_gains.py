"""sim.report.gains: each node's gain on its lacking family against its peer's lead, from a synthetic run dir."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sim.report.gains import lines, main, node_gains, summary

LACKING = {0: "lab_sub", 1: "lab_add"}


def _acc(add: float, sub: float) -> dict:
    return {"lab_add": {"accuracy": add}, "lab_sub": {"accuracy": sub}}


def _write(work: Path, seed: int, node: int, end: dict, rates: list[float] | None = None) -> None:
    run = work / "arm" / f"seed{seed}" / f"node{node}"
    run.mkdir(parents=True)
    (run / "eval.jsonl").write_text(json.dumps({"step": 10, "families": end}) + "\n")
    if rates is not None:
        family = LACKING[node]
        rows = [{"step": s, f"receiver_baseline_{family}": r} for s, r in enumerate(rates, start=1)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def results(tmp_path: Path) -> dict:
    # seed 0: node 0 lacks lab_sub (0.1, peer 0.9), node 1 lacks lab_add (0.2, peer 0.4)
    # seed 1: node 0 lacks lab_sub (0.0, peer 0.5), node 1 has no evaluation on disk
    starts = {"0": {"per_node": {"0": _acc(0.4, 0.1), "1": _acc(0.2, 0.9)}},
              "1": {"per_node": {"0": _acc(0.3, 0.0), "1": _acc(0.1, 0.5)}}}  # fmt: skip
    _write(tmp_path, 0, 0, _acc(0.4, 0.3), rates=[0.0] * 3 + [0.1] * 4 + [0.3] * 3)
    _write(tmp_path, 0, 1, _acc(0.5, 0.9))
    _write(tmp_path, 1, 0, _acc(0.3, 0.2))
    return {"seed_starts": starts}


def test_each_node_reads_its_start_its_peers_level_and_its_end(results: dict, tmp_path: Path) -> None:
    rows = node_gains(results, tmp_path, "arm", LACKING, steps=10)
    assert [(r.seed, r.node, r.family) for r in rows] == [(0, 0, "lab_sub"), (0, 1, "lab_add"), (1, 0, "lab_sub")]
    a, b, c = rows
    assert (a.start, a.peer, a.end) == (0.1, 0.9, 0.3)
    assert a.gain == pytest.approx(0.2) and a.width == pytest.approx(0.8) and a.closed == pytest.approx(0.25)
    assert b.gain == pytest.approx(0.3) and b.closed == pytest.approx(1.5)  # passed its weak peer
    assert c.closed == pytest.approx(0.4)
    # the solve rate's tenths: steps 1 (0.0), 5 (0.1), 10 (0.3): +0.1 then +0.2; no metrics, no halves
    assert a.first_half == pytest.approx(0.1) and a.second_half == pytest.approx(0.2)
    assert b.first_half is None


def test_the_summary_separates_the_mean_of_ratios_from_the_ratio_of_means(results: dict, tmp_path: Path) -> None:
    s = summary(node_gains(results, tmp_path, "arm", LACKING, steps=10))
    assert s["nodes"] == 3 and s["passed_peer"] == 1
    assert s["mean_of_ratios"] == pytest.approx((0.25 + 1.5 + 0.4) / 3)
    assert s["ratio_of_means"] == pytest.approx((0.2 + 0.3 + 0.2) / (0.8 + 0.2 + 0.5))
    assert s["first_half"] == pytest.approx(0.1)
    assert not math.isnan(s["corr_gain_width"]) and s["corr_gain_width"] < 0  # the widest gap gained least


def test_the_report_and_the_cli(results: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "\n".join(lines(node_gains(results, tmp_path, "arm", LACKING, steps=10), "arm"))
    assert "| 0 | 1 | lab_add | 0.200 | 0.400 | 0.500 | +0.300 | 0.200 | 1.50 |" in text
    (tmp_path / "r.json").write_text(json.dumps(results))
    cfg = tmp_path / "transfer-het.yaml"  # the registered YAML with this run's 10 steps (its last evaluation)
    text = (Path(__file__).parents[3] / "configs/sim/transfer-het.yaml").read_text()
    cfg.write_text(text.replace("\nsteps: 150\n", "\nsteps: 10\n", 1))
    assert "\nsteps: 10\n" in cfg.read_text()
    main([str(cfg), "--arm", "arm", "--arm", "absent", "--work", str(tmp_path), "--results", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert "3 nodes: gain +0.233" in out and "absent: no node with a start and an evaluation at its last step" in out


def test_a_node_its_peer_does_not_lead_is_shown_and_left_out_of_the_summary(results: dict, tmp_path: Path) -> None:
    # seed 2: node 0 starts at 0.6 on lab_sub, above its peer's 0.3 (the peer's warm start failed): no gap
    results["seed_starts"]["2"] = {"per_node": {"0": _acc(0.9, 0.6), "1": _acc(0.0, 0.3)}}
    _write(tmp_path, 2, 0, _acc(0.9, 0.8))
    rows = node_gains(results, tmp_path, "arm", LACKING, steps=10)
    assert math.isnan(rows[-1].closed) and rows[-1].width == pytest.approx(-0.3)
    s = summary(rows)
    assert s["nodes"] == 3 and s["left_out"] == 1
    assert s["ratio_of_means"] == pytest.approx((0.2 + 0.3 + 0.2) / (0.8 + 0.2 + 0.5))  # as without seed 2
    text = "\n".join(lines(rows, "arm"))
    assert "| 2 | 0 | lab_sub | 0.600 | 0.300 | 0.800 | +0.200 | -0.300 | no gap |" in text
    assert "3 nodes (1 without a gap at the start left out)" in text
    assert summary(rows[-1:]) == {"nodes": 0, "left_out": 1}  # no node with a gap: said, not a crash
    assert lines(rows[-1:], "arm")[-1] == "no node with a gap at the start (1 without a gap at the start left out)."


def test_a_pair_still_running_is_left_out(results: dict, tmp_path: Path) -> None:
    results["seed_starts"]["3"] = {"per_node": {"0": _acc(0.6, 0.0), "1": _acc(0.0, 0.6)}}
    run = tmp_path / "arm" / "seed3" / "node0"
    run.mkdir(parents=True)
    (run / "eval.jsonl").write_text(json.dumps({"step": 5, "families": _acc(0.6, 0.3)}) + "\n")  # halfway
    assert [(r.seed, r.node) for r in node_gains(results, tmp_path, "arm", LACKING, steps=10)][-1] == (1, 0)
    assert [(r.seed, r.node) for r in node_gains(results, tmp_path, "arm", LACKING, steps=5)] == [(3, 0)]


def test_without_the_run_directory_the_finished_pairs_in_the_json_are_read(results: dict, tmp_path: Path) -> None:
    # a later machine: no run directory; the results JSON keeps each finished pair's per-node evaluations by step
    # (seed 0 node 0's JSON record, 0.35, differs from its evaluation on disk, 0.3, to tell which was read)
    results["pairs"] = {"arm": {"0": {"per_node": {"0": {}, "10": {"0": _acc(0.4, 0.35), "1": _acc(0.5, 0.9)}}},
                                "1": {"per_node": {"5": {"0": _acc(0.3, 0.1)}}}}}  # fmt: skip
    rows = node_gains(results, tmp_path / "gone", "arm", LACKING, steps=10)
    assert [(r.seed, r.node, r.end) for r in rows] == [(0, 0, 0.35), (0, 1, 0.5)]  # seed 1 has no step-10 record
    assert rows[0].closed == pytest.approx(0.3125) and rows[0].first_half is None  # the halves need the run dir
    # the run directory, where it is there, comes first (a pair still running has no JSON record)
    on_disk = node_gains(results, tmp_path, "arm", LACKING, steps=10)
    assert [(r.seed, r.node, r.end) for r in on_disk] == [(0, 0, 0.3), (0, 1, 0.5), (1, 0, 0.2)]
