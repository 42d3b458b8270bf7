"""The sharing comparison's driver (``benchmarks/controls.py``): its interval arithmetic, and a quick run of the
heterogeneous setting end to end (two specialised real-policy nodes, four arms, two seeds) whose report pairs
the arms by seed and reads the pre-registered verdict off the intervals."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks.common.multirun import read_evals  # noqa: E402
from benchmarks.controls import parse_seeds, t975, t_interval, verdict  # noqa: E402


def test_t_interval_matches_student_t() -> None:
    assert t975(9) == pytest.approx(2.262, abs=1e-3) and t975(60) == pytest.approx(2.000, abs=2e-3)
    m, lo, hi = t_interval([0.1, 0.2, 0.3, 0.4])  # mean 0.25, sd 0.1291, t(3) 3.182
    assert m == pytest.approx(0.25) and hi - m == pytest.approx(3.182 * 0.129099 / 2, rel=1e-3) and lo < m
    assert math.isnan(t_interval([0.5])[1])
    assert parse_seeds("0-3,7") == [0, 1, 2, 3, 7]


def test_verdict_needs_all_three_controls_beaten() -> None:
    def c(arm: str, ctl: str, beats: str) -> dict:
        return {"arm": arm, "control": ctl, "beats": beats}

    two = {
        "comparisons": [c("receiver", "alone", "yes"), c("receiver", "labels", "yes"), c("receiver", "answers", "no")]
    }
    assert "not met" in verdict(two, "het")
    three = {"comparisons": [*two["comparisons"][:2], c("receiver", "answers", "yes"), c("labels", "alone", "yes")]}
    assert "Target met** by receiver" in verdict(three, "het")
    # the SmolLM2 setting runs (a), (b) and (d) only: its pre-registered target is (d) over (a) and (b)
    assert "Target met** by receiver" in verdict(two, "smol")
    assert "not met" in verdict({"comparisons": two["comparisons"][:1]}, "smol")


@pytest.mark.timeout(900)
def test_quick_het_run_reports_paired_differences(tmp_path: Path) -> None:
    args = [
        "--setting",
        "het",
        "--quick",
        "--seeds",
        "0-1",
        "--workers",
        "2",
        "--only",
        "alone,labels,receiver,answers",
    ]
    args += ["--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    args += ["--set", f"node.model.cache_dir={tmp_path / 'cache'}"]
    subprocess.run([sys.executable, "benchmarks/controls.py", *args], check=True, cwd=ROOT, capture_output=True)
    text = (tmp_path / "out" / "controls_het_quick.md").read_text()
    for arm in ("alone", "labels", "receiver", "answers"):
        assert f"| {arm} | 2 |" in text
    assert "| receiver | alone | 2 |" in text and "| receiver | answers | 2 |" in text
    assert "| share |" not in text  # an arm that did not run is not reported
    assert "Target" in text
    # the majority-answer baseline of the lacking families' problems, as the nodes' evaluations computed it
    evs = [json.loads((tmp_path / "work" / "alone" / "seed0" / f"node{i}" / "eval.jsonl").read_text().splitlines()[-1])
           for i in (0, 1)]  # fmt: skip
    lacking = (
        evs[0]["families"]["lab_sub"]["majority_baseline"] + evs[1]["families"]["lab_add"]["majority_baseline"]
    ) / 2
    assert f"lacking {lacking:.3f}" in text.split("Majority-answer baseline")[1].splitlines()[0]
    data = json.loads((tmp_path / "out" / "controls_het_quick.json").read_text())
    comp = {(c["arm"], c["control"]): c for c in data["comparisons"]}
    ra = comp[("receiver", "alone")]
    assert ra["seeds"] == [0, 1] and len(ra["diff"]) == 2
    ends = data["arms"]
    assert ra["diff"][0] == pytest.approx(ends["receiver"]["end"][0] - ends["alone"]["end"][0])
    # a later session without the run directory: the report's JSON keeps the finished pairs, nothing runs again
    shutil.rmtree(tmp_path / "work")
    (tmp_path / "out" / "controls_het_quick_reading.md").write_text("## Reading\n\nWritten by hand.\n")
    res = subprocess.run([sys.executable, "benchmarks/controls.py", *args], check=True, cwd=ROOT, capture_output=True,
                         text=True)  # fmt: skip
    assert "0 pairs to run" in res.stderr
    assert (tmp_path / "out" / "controls_het_quick.md").read_text().endswith("## Reading\n\nWritten by hand.\n")
    again = json.loads((tmp_path / "out" / "controls_het_quick.json").read_text())
    assert again["comparisons"] == data["comparisons"] and again["arm_keys"] == data["arm_keys"]
    # another experiment (here: more steps) does not reuse them
    res = subprocess.run([sys.executable, "benchmarks/controls.py", *args, "--set", "steps=3", "--analyze"],
                         cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert "its pairs are not reused" in res.stderr and res.returncode == 1


@pytest.mark.timeout(900)
def test_shared_start_is_evaluated_once_with_the_stock_line_and_kept(tmp_path: Path) -> None:
    """``eval.at_start: false`` (the SmolLM2 setting): the initial models and the stock model are evaluated once,
    every pair takes that step 0, and a later session reuses it from the report's JSON."""
    args = ["--setting", "het", "--quick", "--seeds", "0-1", "--workers", "2", "--only", "alone,receiver"]
    args += ["--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    args += ["--set", f"node.model.cache_dir={tmp_path / 'cache'}", "--set", "node.eval.at_start=false"]
    res = subprocess.run([sys.executable, "benchmarks/controls.py", *args], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "shared start evaluated" in res.stderr
    for d in ("start/node0", "start/node1", "stock/node0"):
        assert [e["step"] for e in read_evals(tmp_path / "work" / d)] == [0]
    assert [e["step"] for e in read_evals(tmp_path / "work" / "alone" / "seed0" / "node0")] == [2]  # no own start
    text = (tmp_path / "out" / "controls_het_quick.md").read_text()
    # a built-in recipe has no other stock model: the start alone is reported (its stock record is the start's)
    assert "## The start\n" in text and "Evaluated once for every pair" in text
    assert "the stock model at the same budget" not in text
    data = json.loads((tmp_path / "out" / "controls_het_quick.json").read_text())
    start = data["shared_start"]
    assert data["arms"]["alone"]["start"] == [start["record"]["accuracy"]["lacking"]] * 2
    assert set(start["stock"]) == {"lab_add", "lab_sub"}
    shutil.rmtree(tmp_path / "work")
    res = subprocess.run([sys.executable, "benchmarks/controls.py", *args], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and "shared start evaluated" not in res.stderr and "0 pairs to run" in res.stderr
    assert json.loads((tmp_path / "out" / "controls_het_quick.json").read_text())["shared_start"] == start


def test_a_warm_started_setting_reports_the_stock_model_beside_its_start() -> None:
    """``smol`` warm-starts SmolLM2: its report puts the stock model's line (the same model without its warm start,
    same items and budget) beside the warm-started start, so recovery can be told from new skill."""
    from benchmarks.controls import report, stock_lines
    from sim.config import load_sim_config

    sim = load_sim_config(str(ROOT / "configs" / "sim" / "controls-smol.yaml"), [])
    start = {
        "record": {"accuracy": {"lacking": 0.25, "own": 0.5}, "pass_at_8": {"lacking": 0.5, "own": 0.75}},
        "stock": {
            "lab_add": {"accuracy": 0.125, "pass_at_8": 0.375},
            "lab_sub": {"accuracy": 0.0625, "pass_at_8": None},
        },
        "stock_model": "smollm2-135m",
    }
    text = "\n".join(stock_lines(start, sim))
    assert "## The start, and the stock model at the same budget" in text
    assert "`smollm2-135m` without its warm start" in text and "192 new tokens" in text
    assert "| lab_add | 0.125 | 0.375 |" in text and "| lab_sub | 0.062 | n/a |" in text
    assert "lacking exact 0.250 (pass@8 0.500), own exact 0.500 (pass@8 0.750)" in text
    # before any pair has finished, the report keeps the start on its own (a SmolLM2 pair takes an hour or more)
    alone, summary = report({}, sim, "smol", "python benchmarks/controls.py --setting smol", start)
    assert text in alone and alone.rstrip().endswith("No (arm, seed) pair has finished yet.")
    assert summary["arms"] == {} and summary["comparisons"] == []


@pytest.mark.timeout(600)
def test_a_saved_start_is_used_only_with_the_same_initial_models(tmp_path: Path) -> None:
    """A later session (another machine) rebuilds the warm starts: the saved shared start is reused only when the
    rebuilt weights hash the same, or, for a start saved before digests were kept, evaluate the same again."""
    from benchmarks.controls import checked_start, initial_digests, pair_record
    from sim.config import load_sim_config

    sets = [f"node.model.cache_dir={tmp_path / 'cache'}", "node.eval.at_start=false"]
    sim = load_sim_config(str(ROOT / "configs" / "sim" / "controls-het.yaml"), sets, quick=True)
    nodes = [sim.node_config("alone", i, 0) for i in range(sim.nodes)]
    digests = initial_digests(nodes)
    assert len(set(digests)) == 2 and digests == initial_digests(nodes)  # two different models, each reproducible
    saved = {"key": "k", "digests": digests, "record": {"accuracy": {}}}
    assert checked_start(saved, nodes, tmp_path / "work", sim, "het") is saved
    with pytest.raises(SystemExit, match="not the ones the saved shared start was evaluated on"):
        checked_start({**saved, "digests": digests[::-1]}, nodes, tmp_path / "work", sim, "het")
    # saved before digests: the start is evaluated again here, and must come out the same
    old = {"key": "k", "record": {"accuracy": {"lacking": 2.0, "known": 2.0, "all": 2.0}}}
    with pytest.raises(SystemExit, match="not the saved shared start's"):
        checked_start(old, nodes, tmp_path / "work", sim, "het")
    record = json.loads(json.dumps(pair_record(tmp_path / "work" / "start-check", sim, "het")["steps"]["0"]))
    kept = checked_start({**old, "record": record}, nodes, tmp_path / "work2", sim, "het")
    assert kept["digests"] == digests and kept["record"] == record
