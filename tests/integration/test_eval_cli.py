"""``swarm-node eval`` on a real run directory: JSON shape, repeatability, --initial, --step and its errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.eval import read_results
from node.telemetry.metrics import read_jsonl

SMALL_EVAL = [
    "--set", "eval.items_per_family=4",
    "--set", "eval.samples=8",
    "--set", "eval.every_steps=2",
    "--set", "rollout.prompts_per_step=4",
    "--set", "rollout.group_size=4",
    "--set", "sapo.local_groups=4",
    "--set", "checkpoint.every=2",
    "--set", "checkpoint.keep=5",
]  # fmt: skip


# The tests share one trained run dir (a module fixture): keep them on one xdist worker so it is trained once.
pytestmark = [pytest.mark.xdist_group("eval_cli_run")]


def cli(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("swarm-node", path=str(Path(sys.executable).parent))
    cmd = [exe, *args] if exe else [sys.executable, "-m", "node.cli.app", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("eval-run") / "run"
    done = cli(
        "join", "--run-dir", str(d), "--max-steps", "4", "--transport", "memory", "--config", "tiny", *SMALL_EVAL
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return d


@pytest.mark.timeout(900)
def test_the_node_evaluates_during_the_run(run_dir: Path) -> None:
    evals = read_results(run_dir)
    assert [e["step"] for e in evals] == [0, 2, 4]  # at the start, every 2 steps; the end coincides with step 4
    for e in evals:
        assert set(e["families"]) == {f for f in evals[0]["families"]} and all(
            f["n"] == 4 for f in e["families"].values()
        )
    rows = {r["step"]: r for r in read_jsonl(run_dir / "metrics.jsonl")}
    assert rows[2]["heldout_accuracy"] == evals[1]["accuracy"]  # headline numbers reach metrics.jsonl
    assert "heldout_accuracy" not in rows[1]


@pytest.mark.timeout(900)
def test_eval_json_is_repeatable_and_matches_the_run(run_dir: Path) -> None:
    a = cli("eval", "--run-dir", str(run_dir), "--json")
    b = cli("eval", "--run-dir", str(run_dir), "--json")
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:]
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert ra["step"] == 4 and 0.0 <= ra["accuracy"] <= 1.0
    assert all(isinstance(f["accuracy"], float) and f["n"] == 4 for f in ra["families"].values())
    assert ra["accuracy"] == pytest.approx(sum(f["accuracy"] for f in ra["families"].values()) / len(ra["families"]))
    for key in ("step", "accuracy", "families"):
        assert ra[key] == rb[key]
    top = {"step", "accuracy", "reward", "pass_at_1", "pass_at_8", "greedy_accuracy", "families"}
    fam_keys = {"accuracy", "reward", "majority_baseline", "top_answer_share", "pass_at_1", "pass_at_8"}
    fam_keys |= {"greedy_accuracy", "format_rate", "n"}
    assert top <= set(ra) and all(fam_keys <= set(f) for f in ra["families"].values())
    for f in ra["families"].values():  # exact accuracy is pass@1; 8 samples give a pass@8 at least as high
        assert f["pass_at_1"] == pytest.approx(f["accuracy"]) and f["pass_at_8"] >= f["accuracy"] - 1e-12
        assert 0.0 <= f["majority_baseline"] <= 1.0 and 0.0 <= f["top_answer_share"] <= 1.0
    in_run = read_results(run_dir)[-1]  # the node's own evaluation of the same weights
    assert in_run["accuracy"] == ra["accuracy"]
    assert ra["side"] == in_run["side"] == "test"  # every result names the side of the split it read
    for f in ra["families"].values():  # per-item records for re-analysis, in item order
        assert [r["samples_right"] for r in f["items"]] == f["correct"] and len(f["items"]) == 4
        assert all(r["n_samples"] == 8 and isinstance(r["greedy_right"], bool) for r in f["items"])
        assert len({r["key"] for r in f["items"]}) == 4


@pytest.mark.timeout(900)
def test_eval_initial_and_step_and_their_errors(run_dir: Path) -> None:
    init = cli("eval", "--run-dir", str(run_dir), "--initial", "--json")
    assert init.returncode == 0, init.stderr[-2000:]
    assert json.loads(init.stdout)["accuracy"] == read_results(run_dir)[0]["accuracy"]  # the step-0 evaluation
    two = cli("eval", "--run-dir", str(run_dir), "--step", "2", "--json", "--items", "2")
    assert two.returncode == 0, two.stderr[-2000:]
    assert json.loads(two.stdout)["step"] == 2 and all(f["n"] == 2 for f in json.loads(two.stdout)["families"].values())
    missing = cli("eval", "--run-dir", str(run_dir), "--step", "3")
    assert missing.returncode == 1 and "no intact checkpoint of step 3" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1 and "Traceback" not in missing.stderr
    dev = cli("eval", "--run-dir", str(run_dir), "--side", "dev", "--json", "--items", "2")
    assert dev.returncode == 0, dev.stderr[-2000:]
    rd, rt = json.loads(dev.stdout), json.loads(two.stdout)
    assert rd["side"] == "dev" and rt["side"] == "test"
    dev_keys = {r["key"] for f in rd["families"].values() for r in f["items"]}
    assert dev_keys and not dev_keys & {r["key"] for f in rt["families"].values() for r in f["items"]}
    bad = cli("eval", "--run-dir", str(run_dir), "--side", "train")
    assert bad.returncode == 1 and "--side must be dev or test" in bad.stderr
    nowhere = cli("eval", "--run-dir", str(run_dir / "nope"))
    assert nowhere.returncode == 1 and "not a run directory" in nowhere.stderr
