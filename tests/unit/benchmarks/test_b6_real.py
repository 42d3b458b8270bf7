"""B6's real-model section: win rates under the verifier from per-item exact counts, the empirical duality gap, the
report's per-arm gains and verdict against DPO, and a smoke run of real processes."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.b6_real import (
    ARMS,
    QUICK_ARMS,
    WINDOWS,
    _node_metrics,
    add_league,
    arms_of,
    diversity_lines,
    league_stats,
    parser,
    rank_correlation,
    sim_mapping,
    win_rate,
)
from node.config import VerifiableOracleConfig
from sim.config import SimConfig

ROOT = Path(__file__).resolve().parents[3]


def test_win_rate_counts_a_tie_as_one_half() -> None:
    # item 1: a always right, b never: a wins; item 2: both always wrong: a tie
    assert win_rate([8, 0], [0, 0], 8) == pytest.approx(0.75)
    assert win_rate([4], [4], 8) == pytest.approx(0.5)  # the same policy: one half
    assert win_rate([2, 6], [5, 1], 8) + win_rate([5, 1], [2, 6], 8) == pytest.approx(1.0)


def test_arms_run_in_the_order_asked() -> None:
    def ns(arms: list[str] | None, quick: bool = False) -> argparse.Namespace:
        return argparse.Namespace(arms=arms, quick=quick)

    assert arms_of(ns(None)) == list(ARMS)
    assert arms_of(ns(["ht_mnpo", "dpo", "ht_mnpo"])) == ["ht_mnpo", "dpo"]  # asked order, each once
    assert arms_of(ns(["grpo"], quick=True)) == QUICK_ARMS  # a smoke run has its own two arms


def test_every_arm_is_a_valid_node_configuration_of_its_kind() -> None:
    cfg = SimConfig.model_validate(sim_mapping(parser().parse_args(["run"])))  # the command line's defaults
    got = {arm: cfg.node_config(arm, 0, 0).mnpo for arm in ARMS}
    assert {a: (m.schedule, m.opponents, m.loss) for a, m in got.items()} == {
        "grpo": ("off", "peers", "mnpo"),  # the MNPO fields are unused when its schedule is off
        "dpo": ("only", "none", "dpo"),
        "dpo_no_length": ("only", "none", "dpo"),
        "ipo": ("only", "none", "mnpo"),  # MNPO's square loss against the reference alone
        "td_mnpo": ("only", "history", "mnpo"),
        "ht_mnpo": ("only", "peers", "mnpo"),
        "grpo_mnpo": ("alternate", "peers", "mnpo"),
    }
    oracles = {a: m.oracle for a, m in got.items() if isinstance(m.oracle, VerifiableOracleConfig)}
    assert len(oracles) == len(got) and all(o.rank == "exact" for o in oracles.values())
    assert [a for a, o in oracles.items() if not o.shorter_wins] == ["dpo_no_length"]  # merged into the oracle


def test_league_win_rate_and_gap_by_hand() -> None:
    finals = {("x", 0): [8, 8], ("x", 1): [0, 0], ("y", 0): [4, 4]}
    got = league_stats(finals, 8)
    # x0 beats x1 always (1) and y0 3/4 of the time; x1 beats x0 never and y0 1/4: x's mean is one half
    assert got["x"]["win_league"] == pytest.approx(0.5)
    assert got["y"]["win_league"] == pytest.approx(0.5)
    # the best response to x's mixture {x0, x1} is x0 (0.5 against itself, 1 against x1): gap 2 * 0.75 - 1
    assert got["x"]["gap"] == pytest.approx(0.5)
    assert got["y"]["gap"] == pytest.approx(0.5)  # x0 beats y0 3/4 of the time
    assert league_stats({("z", 0): [3, 5]}, 8)["z"]["gap"] == pytest.approx(0.0)  # alone in its league


def test_league_is_the_arms_that_finished_the_seed() -> None:
    # seed 0: x, y and z finished; seed 1: x and y (z not run yet) and w, whose evaluation has no per-item counts;
    # seed 2: x alone. Each seed is judged over its own finished arms; a lone arm is not judged.
    def row(arm: str, seed: int, correct: list[int] | None) -> dict[str, object]:
        return {"arm": arm, "seed": seed, "nodes": [{"node": 0, "after": {"correct": correct}}]}

    rows = [row("x", 0, [8, 8]), row("y", 0, [0, 0]), row("z", 0, [4, 4]), row("x", 1, [8, 8]), row("y", 1, [0, 0])]
    rows += [row("w", 1, None), row("x", 2, [8, 8])]
    add_league({"node": {"eval": {"samples": 8}}}, rows)
    got = {(r["arm"], r["seed"]): (r["win_league"], r["gap"], r["league_size"]) for r in rows}
    # x beats y always and z (right half the time) 3/4 of the time; y beats z 1/4 of the time
    assert got[("x", 0)] == (pytest.approx(0.875), 0.0, 3)
    assert got[("y", 0)] == (pytest.approx(0.125), pytest.approx(1.0), 3)
    assert got[("x", 1)] == (1.0, 0.0, 2) and got[("y", 1)] == (0.0, 1.0, 2)  # z's absence leaves x against y
    for key in (("w", 1), ("x", 2)):
        win, gap, size = got[key]
        assert win != win and gap != gap and size == 0, key  # nan: not judged


def _write_node(
    d: Path, before: float, after: float, correct: list[int], mnpo: bool, diagnostics: bool = False
) -> None:
    d.mkdir(parents=True)
    fam = lambda acc, c: {"accuracy": acc, "greedy_accuracy": acc, "pass_at_8": min(1.0, 2 * acc),  # noqa: E731
                          "majority_baseline": 0.125, "correct": c}  # fmt: skip
    evals = [{"step": 0, "families": {"basic_arithmetic": fam(before, [0] * len(correct))}},
             {"step": 4, "families": {"basic_arithmetic": fam(after, correct)}}]  # fmt: skip
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    row = {"step": 4, **({"mnpo_pairs": 12.0, "mnpo_covered_frac": 0.5, "mnpo_peer_opponents": 1.0} if mnpo else {})}
    if diagnostics:  # runs from before the pair diagnostics existed have none: the report shows "-" for them
        row.update(mnpo_exact_pairs=3.0, mnpo_decisive_pull=0.4, mnpo_candidates=20.0, mnpo_ties=5.0,
                   mnpo_distinct_per_prompt=2.5)  # fmt: skip
    (d / "metrics.jsonl").write_text(json.dumps(row) + "\n")


def test_report_compares_mnpo_with_dpo(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    family = {"name": "basic_arithmetic", "config": {"max_terms": 2}}
    arms = {"dpo": [0.02, 0.04, 0.03], "ht_mnpo": [0.20, 0.22, 0.18], "ipo": [0.03, 0.05, 0.01]}
    mapping = {"name": "b6-real", "nodes": 2, "steps": 4, "seeds": [0, 1, 2],
               "node": {"model": {"name": "smollm2-135m"}, "tasks": {"families": [family]}, "eval": {"samples": 8}},
               "configurations": [{"name": a} for a in arms]}  # fmt: skip
    (work / "experiment.yaml").write_text(yaml.safe_dump(mapping))
    for arm, gains in arms.items():
        for seed, g in enumerate(gains):
            for i in range(2):
                correct = [8, 8] if arm == "ht_mnpo" else [0, 0]
                d = work / arm / f"seed{seed}" / f"node{i}"
                _write_node(d, 0.1, 0.1 + g, correct, mnpo=True, diagnostics=arm == "ht_mnpo")
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "b6_real.py"), "report", "--work", str(work), "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    text = (out / "b6_real.md").read_text()
    # ht_mnpo's nodes are always right on both items, dpo's and ipo's never: against the league (one other ht node
    # at one half, four others at 1) an ht node wins 9/10, a dpo node 3/10 (one half against dpo and ipo, 0 against
    # ht); dpo's population is beaten by ht's policies every time (gap 1)
    ht = "| ht_mnpo | 3 | +0.200 ± 0.020 | +0.200 ± 0.020 | +0.400 ± 0.040 | 0.900 ± 0.000 | 0.000 ± 0.000 | 12.0 |"
    assert ht + " 0.50 | 3.0 | 0.40 | 20.0 | 5.0 | 2.5 |" in text
    assert (
        "| dpo | 3 | +0.030 ± 0.010 | +0.030 ± 0.010 | +0.060 ± 0.020 | 0.300 ± 0.000 | 1.000 ± 0.000 | 12.0 | "
        "0.50 | - | - | - | - | - |" in text
    )
    assert "- ht_mnpo: exact gain +0.200 against DPO's +0.030; the difference +0.170 is beyond 2 sd" in text
    assert "- ipo: exact gain +0.030 against DPO's +0.030; the difference +0.000 is within 2 sd" in text
    rows = json.loads((out / "b6_real.json").read_text())["rows"]
    ht0 = next(r for r in rows if r["arm"] == "ht_mnpo" and r["seed"] == 0)
    assert ht0["curve"] == [[0, 0.1, 0.2], [4, pytest.approx(0.3), pytest.approx(0.6)]]  # mean over its nodes
    assert (out / "b6_real.png").stat().st_size > 0
    # a fresh machine lost dpo's runs: the earlier report's rows stay, and the league is still judged from them
    shutil.rmtree(work / "dpo")
    again = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    assert "kept from b6_real.json (not in the work directory): [('dpo', 0), ('dpo', 1), ('dpo', 2)]" in again.stderr
    assert ht in (out / "b6_real.md").read_text()


def test_report_until_a_step_every_run_reached(tmp_path: Path) -> None:
    # A budget cut short (a lent GPU): dpo's nodes reached step 4, ht_mnpo's one node only step 2; --until 2 reports
    # both at step 2, with evaluations and MNPO steps after it left out; without it, ht_mnpo is not finished
    work = tmp_path / "work"
    work.mkdir()
    family = {"name": "basic_arithmetic", "config": {}}
    mapping = {"name": "b6-real", "nodes": 1, "steps": 4, "seeds": [0],
               "node": {"model": {"name": "smollm2-135m"}, "tasks": {"families": [family]}, "eval": {"samples": 8}},
               "configurations": [{"name": "dpo"}, {"name": "ht_mnpo"}]}  # fmt: skip
    (work / "experiment.yaml").write_text(yaml.safe_dump(mapping))
    fam = lambda acc: {"basic_arithmetic": {"accuracy": acc, "greedy_accuracy": acc, "pass_at_8": acc,  # noqa: E731
                                            "majority_baseline": 0.125, "correct": [round(8 * acc)] * 2}}  # fmt: skip
    for arm, accs in {"dpo": [0.0, 0.25, 0.75], "ht_mnpo": [0.0, 0.5]}.items():
        d = work / arm / "seed0" / "node0"
        d.mkdir(parents=True)
        evals = [{"step": 2 * k, "families": fam(a)} for k, a in enumerate(accs)]
        (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
        steps = [{"step": t, "mnpo_pairs": float(t), "mnpo_covered_frac": 0.0} for t in range(1, 2 * len(accs) - 1)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "b6_real.py"), "report", "--work", str(work), "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    assert "| dpo | 1 | +0.750 ± 0.000 |" in (out / "b6_real.md").read_text()
    assert "| ht_mnpo |" not in (out / "b6_real.md").read_text()
    subprocess.run([*cmd, "--until", "2"], check=True, cwd=ROOT, capture_output=True)
    text = (out / "b6_real.md").read_text()
    assert "4 steps (reported at step 2, the last every run here reached)" in text
    assert "| dpo | 1 | +0.250 ± 0.000 |" in text and "| ht_mnpo | 1 | +0.500 ± 0.000 |" in text
    # dpo (2 of 8 right) against ht (4 of 8) at step 2: wins 0.375, gap 2 x 0.625 - 1; MNPO steps 1-2 only (1.5 pairs)
    assert "| +0.250 ± 0.000 | 0.375 ± 0.000 | 0.250 ± 0.000 | 1.5 |" in text
    rows = json.loads((out / "b6_real.json").read_text())["rows"]
    assert {(r["arm"], r["step"]) for r in rows} == {("dpo", 2), ("ht_mnpo", 2)}


def test_rank_correlation_by_hand() -> None:
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    assert rank_correlation([1, 2, 3], [5, 100, 6]) == pytest.approx(0.5)  # ranks (1, 2, 3) against (1, 3, 2)
    # a tie takes the mean rank: x ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): Pearson's r of those, 0.9487
    assert rank_correlation([0, 7, 7, 9], [1, 2, 3, 4]) == pytest.approx(3 / 10**0.5)
    assert rank_correlation([1, 2], [1, 2]) != rank_correlation([1, 2], [1, 2])  # nan: too few runs
    assert rank_correlation([3, 3, 3], [1, 2, 3]) != rank_correlation([3, 3, 3], [1, 2, 3])  # nan: constant


def test_candidates_are_read_per_window_of_steps(tmp_path: Path) -> None:
    assert WINDOWS == ((1, 5), (6, 10), (11, None))
    steps = [{"step": t, "mnpo_pairs": 1.0, "mnpo_candidates": float(t), "mnpo_exact_pairs": 2.0 * t}
             for t in range(1, 15)]  # fmt: skip
    steps.insert(3, {"step": 4, "reward_mean": 0.5})  # a GRPO step: no MNPO figures
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    got = _node_metrics(tmp_path, until=12)  # the steps after until are left out
    assert got["mnpo_steps"] == 12
    assert got["window_candidates"] == [pytest.approx(3.0), pytest.approx(8.0), pytest.approx(11.5)]
    assert got["late_exact_pairs"] == pytest.approx(23.0)  # steps 11 and 12


def test_diversity_lines_order_runs_by_gain_and_correlate() -> None:
    def row(arm: str, seed: int, windows: list[float], decisive: float, gain: float, tops: list[float]) -> dict:
        nodes = [{"mnpo_steps": 40, "window_candidates": windows, "late_exact_pairs": decisive,
                  "after": {"top_answer_share": t}} for t in tops]  # fmt: skip
        return {"arm": arm, "seed": seed, "nodes": nodes, "gain": {"accuracy": gain}}

    rows = [row("dpo", 1, [120.0, 35.0, 15.0], 4.5, 0.046, [0.17, 0.38]),
            row("dpo", 0, [110.0, 117.0, 63.0], 11.8, 0.138, [0.12, 0.18]),
            row("ht_mnpo", 0, [130.0, 72.0, 22.5], 6.1, 0.065, [0.39, 0.48]),
            {"arm": "grpo", "seed": 0, "nodes": [{"mnpo_steps": 0}], "gain": {"accuracy": 0.2}},  # no MNPO step
            {"arm": "td_mnpo", "seed": 0, "nodes": [{"mnpo_steps": 40, "after": {}}],  # from before the figures
             "gain": {"accuracy": 0.5}}]  # fmt: skip
    text = "\n".join(diversity_lines(rows, 40))
    assert (
        "| run | gain | candidates, 1-5 | candidates, 6-10 | candidates, 11-40 | decisive, 11-40 | top answer |" in text
    )
    table = [x for x in text.splitlines() if x.startswith("| ") and "seed" in x]
    assert table == ["| dpo seed 0 | +0.138 | 110.0 | 117.0 | 63.0 | 11.8 | 12%-18% |",
                     "| ht_mnpo seed 0 | +0.065 | 130.0 | 72.0 | 22.5 | 6.1 | 39%-48% |",
                     "| dpo seed 1 | +0.046 | 120.0 | 35.0 | 15.0 | 4.5 | 17%-38% |"]  # fmt: skip
    # steps 1-5 rank the runs (1, 3, 2) against the gains' (3, 2, 1): rho -1/2; the later spans rank them alike: 1
    assert "over these 3 runs: the candidate pairs of steps 1-5 -0.50, 6-10 +1.00, 11-40 +1.00; " in text
    assert "the decisive pairs of steps 11-40 +1.00." in text
    assert diversity_lines(rows[3:], 40) == []  # nothing to read


@pytest.mark.network
@pytest.mark.timeout(900)
def test_quick_mode_runs_real_processes(tmp_path: Path) -> None:
    # Two tiny-model `swarm-node join` processes per arm (DPO and HT-MNPO) over hivemind, 2 steps, then the report:
    # HT-MNPO's nodes receive each other's scores records, DPO's pairs have no opponent. The nodes start their first
    # step together (a start barrier): a tiny node 0 would otherwise finish before node 1 had loaded.
    script = [sys.executable, str(ROOT / "benchmarks" / "b6_real.py")]
    where = ["--quick", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    subprocess.run([*script, "run", "--seeds", "0", *where], check=True, cwd=ROOT, capture_output=True)
    subprocess.run([*script, "report", *where], check=True, cwd=ROOT, capture_output=True)
    data = json.loads((tmp_path / "out" / "b6_real_quick.json").read_text())
    by_arm = {r["arm"]: r for r in data["rows"]}
    assert set(by_arm) == {"dpo", "ht_mnpo"}
    for arm, row in by_arm.items():
        assert len(row["nodes"]) == 2 and row["league_size"] == 4, arm
        assert all(n["mnpo_steps"] == 2 and n["pairs"] > 0 for n in row["nodes"]), arm
        for n in row["nodes"]:  # what limited the signal, recorded by the real nodes (the verifier knows exactness)
            assert n["candidates"] >= n["exact_pairs"] >= 0 and n["distinct_per_prompt"] >= 2, (arm, n)
        assert all(len(n["after"]["correct"]) == 4 for n in row["nodes"]), arm
    for arm in by_arm:  # the bootstrap node stayed up after its last step (--linger) until its peer had finished
        log = (tmp_path / "work" / "quick" / arm / "seed0" / "node0" / "stdout.log").read_text()
        assert "staying in the swarm 60 s more (--linger)" in log, log[-500:]
        for node in ("node0", "node1"):  # and neither began before it had heard the other (runtime.wait_for_peers)
            log = (tmp_path / "work" / "quick" / arm / "seed0" / node / "stdout.log").read_text()
            assert "heard 1 peer(s): starting" in log, (arm, node, log[-500:])
    assert all(n["covered"] == 0.0 and n["peer_opponents"] == 0.0 for n in by_arm["dpo"]["nodes"])
    # HT-MNPO's signed scores records crossed between the processes and were kept (the smoke run polls every 0.1 s,
    # faster than a tiny step). Whether a pair is covered by them within two steps is still timing: the decisive
    # pairs, taken first, may hold responses the peer never scored; tests/integration/test_mnpo_multiprocess.py
    # asserts peer coverage over a longer run.
    kept = []
    for node in ("node0", "node1"):
        rows = (tmp_path / "work" / "quick" / "ht_mnpo" / "seed0" / node / "metrics.jsonl").read_text().splitlines()
        kept.append(max(json.loads(r).get("mnpo_score_peers", 0) for r in rows))
    assert max(kept) == 1, kept
