"""The B10 propagation report: per node and configuration, the gain with the peer against the gain alone, what
peers' data weighed, and who each node trained on (named by role from the run's identity files)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from protocol.identity import Identity

ROOT = Path(__file__).resolve().parents[3]


def _family(acc: float) -> dict:
    return {"accuracy": acc, "greedy_accuracy": acc + 0.05, "pass_at_8": min(1.0, acc * 2), "format_rate": 0.9,
            "majority_baseline": 0.125, "top_answer_share": round(0.5 - acc, 3)}  # fmt: skip


def _node(d: Path, before: float, after: float, shares: list[float], weight: float, senders: dict[str, int]) -> str:
    d.mkdir(parents=True)
    peer = Identity.load_or_create(d / "identity.key").peer_id
    evals = [{"step": step, "families": {"basic_arithmetic": _family(acc)}}
             for step, acc in ((0, before), (30, (before + after) / 2), (60, after))]  # fmt: skip
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    rows = [{"step": i + 1, "exact_mean": 0.3, "external_token_share": s,
             "external_is_weight_mean": weight if s else 0.0, "external_by_sender": senders if s else {}}
            for i, s in enumerate(shares)]  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return peer


def _experiment(
    tmp_path: Path, weak_alone: list[float], weak_share: list[float], weak_receiver: list[float] | None = None
) -> Path:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    family = {"name": "basic_arithmetic", "config": {"max_terms": 2}}
    mapping = {"name": "b10-propagation", "nodes": 2, "node": {"tasks": {"families": [family]}}}
    (work / "experiment.yaml").write_text(yaml.safe_dump(mapping))
    (work / "roles.json").write_text(json.dumps({"0": ["strong", "warm-started"], "1": ["weak", "format only"]}))
    for seed, (ga, gs) in enumerate(zip(weak_alone, weak_share, strict=True)):
        runs = [("alone", ga, [0.0, 0.0]), ("share", gs, [0.4, 0.6])]
        if weak_receiver is not None:
            runs.append(("receiver", weak_receiver[seed], [0.3, 0.3]))
        for config, gain, shares in runs:
            run = work / config / f"seed{seed}"
            strong = _node(run / "node0", 0.60, 0.62, shares, 0.9, {})
            _node(run / "node1", 0.10, 0.10 + gain, shares, 0.8, {strong: 3})
    return work


def _report(work: Path, out: Path, *extra: str) -> str:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "b10_propagation.py"), "report", "--work", str(work),
           "--out", str(out), *extra]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    return (out / "b10_propagation.md").read_text()


def test_report_compares_gain_with_the_peer_to_gain_alone(tmp_path: Path) -> None:
    work = _experiment(tmp_path, weak_alone=[0.02, 0.03, 0.01], weak_share=[0.20, 0.22, 0.18])
    text = _report(work, tmp_path / "out")
    assert "| weak | share | 0 | 60 | 0.100 -> 0.300 |" in text
    assert "| 0.900 -> 0.900 | 0.40 -> 0.20 |" in text  # format, then the top answer's share before -> after
    assert "- weak, share: exact gain +0.200 against +0.020 alone (10.00x)" in text
    assert "is beyond 2 sd of the seeds" in text
    # the peer's share of the tokens (mean over steps) and its mean IS weight; the sender named by role
    row = next(line for line in text.splitlines() if line.startswith("| weak | share | 0 |"))
    assert row.endswith("| 0.300 | 0.50 | 0.800 | strong 6 |"), row  # own exact: the mean of exact_mean
    alone = next(line for line in text.splitlines() if line.startswith("| weak | alone | 0 |"))
    assert alone.endswith("| 0.00 | nan | - |"), alone
    assert (tmp_path / "out" / "b10_propagation.png").stat().st_size > 0


def test_report_says_within_the_spread(tmp_path: Path) -> None:
    work = _experiment(tmp_path, weak_alone=[0.02, 0.10, 0.0], weak_share=[0.0, 0.12, 0.05])
    text = _report(work, tmp_path / "out")
    assert "- weak, share: exact gain +0.057 against +0.040 alone (1.42x)" in text
    assert "is within 2 sd" in text


def test_a_budget_cut_short_is_reported_at_a_step_every_run_reached(tmp_path: Path) -> None:
    work = _experiment(tmp_path, weak_alone=[0.02, 0.03, 0.01], weak_share=[0.20, 0.22, 0.18])
    cut = work / "share" / "seed2" / "node1" / "eval.jsonl"  # this run stopped before its last evaluation
    cut.write_text("".join(cut.read_text().splitlines(keepends=True)[:2]))
    text = _report(work, tmp_path / "out")
    assert "| weak | share | 2 | 30 |" not in text  # left out, not averaged with finished runs
    assert "| weak | share | 2 | +0.210 ± 0.014 |" in text  # the two finished seeds
    text = _report(work, tmp_path / "out", "--until", "30", "--machine", "a lent GPU")
    assert text.count("| weak | share | 2 | 30 | 0.100 -> 0.190 |") == 1  # every run, at step 30
    assert "| weak | share | 3 | +0.100 ± 0.010 |" in text
    assert "Machine: a lent GPU." in text


@pytest.mark.network
@pytest.mark.timeout(900)
def test_quick_mode_runs_real_processes_and_resumes(tmp_path: Path) -> None:
    # Two tiny-model `swarm-node join` processes over hivemind, both configurations, then the report; a second
    # `run` finds every (configuration, seed) finished and starts nothing.
    script = [sys.executable, str(ROOT / "benchmarks" / "b10_propagation.py")]
    where = ["--quick", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    subprocess.run([*script, "run", "--seeds", "0", *where], check=True, cwd=ROOT, capture_output=True)
    again = subprocess.run(
        [*script, "run", "--seeds", "0", *where], check=True, cwd=ROOT, capture_output=True, text=True
    )
    assert again.stderr.count(": done") == 2, again.stderr
    subprocess.run([*script, "report", *where], check=True, cwd=ROOT, capture_output=True)
    text = (tmp_path / "out" / "b10_propagation_quick.md").read_text()
    for role in ("tiny-a", "tiny-b"):
        for config in ("alone", "share"):
            assert f"| {role} | {config} | 0 | 2 |" in text
    data = json.loads((tmp_path / "out" / "b10_propagation_quick.json").read_text())
    alone = [r for r in data["rows"] if r["config"] == "alone"]
    assert alone and all(r["peer_token_share"] == 0.0 and not r["senders"] for r in alone)  # 4/0: no peer data


def test_every_configuration_is_compared_with_alone(tmp_path: Path) -> None:
    work = _experiment(tmp_path, weak_alone=[0.10, 0.12], weak_share=[0.0, 0.02], weak_receiver=[0.30, 0.34])
    text = _report(work, tmp_path / "out")
    assert "- weak, share: exact gain +0.010 against +0.110 alone (0.09x)" in text
    assert "- weak, receiver: exact gain +0.320 against +0.110 alone (2.91x)" in text
    assert "receiver = 2 own / 2 peers' groups a step; peers' solved completions credited" in text


def test_a_report_keeps_the_runs_its_work_directory_lost(tmp_path: Path) -> None:
    # A fresh machine has no work directory: the earlier report's rows stay, and the runs done here join them.
    work = _experiment(tmp_path, weak_alone=[0.02, 0.03, 0.01], weak_share=[0.20, 0.22, 0.18])
    out = tmp_path / "out"
    before = _report(work, out)
    fresh = _experiment(tmp_path / "fresh", weak_alone=[0.04, 0.0, 0.0], weak_share=[0.30, 0.0, 0.0])
    for config in ("alone", "share"):
        for seed in (1, 2):  # this machine ran seed 0 again, only
            shutil.rmtree(fresh / config / f"seed{seed}")
    after = _report(fresh, out)
    assert "| weak | share | 0 | 60 | 0.100 -> 0.400 |" in after  # the work directory's run wins
    assert "| weak | share | 2 | 60 | 0.100 -> 0.280 |" in after and "| weak | share | 2 | 60 |" in before
    assert "| weak | share | 3 | +0.233 ± 0.061 |" in after
    # with no work directory at all, the report is the earlier one's runs
    assert _report(tmp_path / "none", out).split("\n", 3)[3] == after.split("\n", 3)[3]


def test_a_report_of_another_experiment_is_not_kept(tmp_path: Path) -> None:
    work = _experiment(tmp_path, weak_alone=[0.02, 0.03, 0.01], weak_share=[0.20, 0.22, 0.18])
    out = tmp_path / "out"
    _report(work, out)
    other = _experiment(tmp_path / "other", weak_alone=[0.0], weak_share=[0.1])
    cfg = other / "experiment.yaml"
    cfg.write_text(cfg.read_text().replace("max_terms: 2", "max_terms: 3"))  # another family setting
    text = _report(other, out)
    assert "| weak | share | 1 | 60 |" not in text and "| weak | share | 1 | +0.100 ± 0.000 |" in text


def test_homogeneous_alone_is_borrowed_from_the_same_runs_and_nodes_are_pooled(tmp_path: Path) -> None:
    # Three identical nodes sharing; B10's node 1 alone is the same run as the homogeneous node 1 alone (same model,
    # settings, index, seed), so its rows stand in for it; nodes 0 and 2 there are other models and are not taken.
    family = {"name": "basic_arithmetic", "config": {"max_terms": 2}}
    weak, strong = {"model": {"name": "smol", "warm_start": "format"}}, {"model": {"name": "smol", "warm_start": "F"}}
    alone = {"name": "alone", "description": "4 own / 0 peers' groups a step",
             "node": {"sapo": {"local_groups": 4, "external_groups": 0}}}  # fmt: skip

    def mapping(name: str, overrides: dict, configs: list[dict]) -> dict:
        return {"name": name, "nodes": 3, "steps": 60, "seeds": [0, 1, 2], "node": {"tasks": {"families": [family]}},
                "configurations": configs, "heterogeneity": {"node_overrides": overrides}}  # fmt: skip

    b10 = tmp_path / "b10"
    b10.mkdir()
    (b10 / "experiment.yaml").write_text(
        yaml.safe_dump(mapping("b10-propagation", {0: strong, 1: weak, 2: {"model": {"name": "tiny"}}}, [alone]))
    )
    for seed, gain in enumerate([0.10, 0.20, 0.15]):
        for i in range(3):
            _node(b10 / "alone" / f"seed{seed}" / f"node{i}", 0.1, 0.1 + gain if i == 1 else 0.9, [0.0], 0.0, {})
    out = tmp_path / "out"
    _report(b10, out)
    share = {"name": "share", "description": "2 own / 2 peers' groups a step", "node": {"sapo": {"x": 1}}}
    work = tmp_path / "homo"
    work.mkdir()
    (work / "experiment.yaml").write_text(yaml.safe_dump(mapping("b10-homogeneous", dict.fromkeys(range(3), weak),
                                                                 [share])))  # fmt: skip
    roles = {str(i): [f"smol-{i}", "SmolLM2 with a format warm start"] for i in range(3)}
    (work / "roles.json").write_text(json.dumps(roles))
    for i, gain in enumerate([0.30, 0.40, 0.35]):
        _node(work / "share" / "seed0" / f"node{i}", 0.1, 0.1 + gain, [0.5], 0.7, {})
    cmd = [sys.executable, str(ROOT / "benchmarks" / "b10_propagation.py"), "report", "--population", "homogeneous",
           "--work", str(tmp_path), "--out", str(out)]  # fmt: skip
    (tmp_path / "homogeneous").symlink_to(work)
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    text = (out / "b10_homogeneous.md").read_text()
    assert "| smol-1 | alone† | 2 | 60 | 0.100 -> 0.250 |" in text
    assert "| smol-0 | alone" not in text and "| smol-2 | alone" not in text
    assert "† From `b10_propagation.json`, the same runs: node 1 alone" in text
    assert "| all nodes | share | 3 | +0.350 ± 0.050 |" in text and "| all nodes | alone | 3 | +0.150 ± 0.050 |" in text
    assert "- all nodes, share: exact gain +0.350 against +0.150 alone (2.33x)" in text
    assert "beyond 2 sd of the node runs (0.100)" in text
