"""The SAPO experiment's metrics, from a synthetic run directory (benchmarks.analysis.sapo_b4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.analysis import sapo_b4 as sa


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _node(run: Path, cfg: str, seed: int, node: int, own: float, batch: float, rise_at: int | None) -> None:
    d = run / cfg / f"seed{seed}" / f"node{node}"
    _write(d / "metrics.jsonl", [{"step": s, "reward_mean": own, "batch_reward_mean": batch} for s in range(1, 61)])
    _write(
        d / "eval.jsonl",
        [
            {"step": 0, "accuracy": 0.1, "families": {"gcd": {"accuracy": 0.1}}},
            {"step": 60, "accuracy": 0.1 + own, "families": {"gcd": {"accuracy": 0.1 + own}}},
        ],
    )
    rows = []
    for s in range(1, 61):
        r = 1.0 if rise_at is not None and s >= rise_at else 0.0
        rows.append({"step": s, "task": {"family": "gcd"}, "rewards": [r, 0.0]})
    _write(d / "rollouts.jsonl", rows)


def test_ratios_are_paired_by_seed_with_the_rows_baseline(tmp_path: Path) -> None:
    for seed, scale in ((0, 1.0), (1, 2.0)):
        for node in range(2):
            _node(tmp_path, "het-same-8-0", seed, node, 0.1 * scale, 0.2 * scale, None)
            _node(tmp_path, "het-same-4-4", seed, node, 0.2 * scale, 0.5 * scale, 25 + 10 * node)
    results = sa.collect(tmp_path)
    rows = {r["config"]: r for r in sa.summary_rows(results, ["het-same-8-0", "het-same-4-4"])}
    assert rows["het-same-4-4"]["own_ratio"] == pytest.approx([2.0, 2.0])  # paired: the seeds' scales cancel
    assert rows["het-same-4-4"]["batch_ratio"] == pytest.approx([2.5, 2.5])
    assert rows["het-same-4-4"]["heldout_gain"] == pytest.approx([0.2, 0.4])
    assert sa.baseline_of("het-paper-4-4-noIS") == "het-paper-8-0-noIS" and sa.baseline_of("het-same-8-0") is None
    assert sa.baseline_candidates("het-same-4-4-lr1e-3") == ["het-same-8-0-lr1e-3", "het-same-8-0"]
    assert sa.baseline_candidates("het-same-8-0-keep0") == ["het-same-8-0"]
    prop = sa.propagation(results, "het-same-4-4")["gcd"]
    # success is 0.5 per draw from the rise on: the last 10 draws reach start (0) + 0.1 at the second such draw
    assert prop["share"] == 1.0 and prop["first"] == pytest.approx(26) and prop["lag"] == pytest.approx(10)
    assert sa.propagation(results, "het-same-8-0")["gcd"]["share"] == 0.0
    table = sa.markdown_summary(list(rows.values()))
    assert "| het-same-4-4 | 2 | 60 |" in table and "2.000 ± 0.000" in table


def test_paper_budget_rows_fall_back_to_the_identical_same_budget_baseline(tmp_path: Path) -> None:
    _node(tmp_path, "het-same-8-0", 0, 0, 0.1, 0.2, None)
    _node(tmp_path, "het-paper-4-4", 0, 0, 0.3, 0.2, None)
    rows = sa.summary_rows(sa.collect(tmp_path), [])
    assert {r["config"]: r["own_ratio"] for r in rows}["het-paper-4-4"] == pytest.approx([3.0])


def test_the_learning_rate_sweep_compares_each_splits_best_rate_on_the_seeds_all_rates_ran() -> None:
    def row(name: str, own: dict[int, float], gain: float = 0.05) -> dict:
        return {"config": name, "seed_ids": list(own), "own": list(own.values()), "heldout_gain": [gain] * len(own)}

    rows = [
        row("het-same-8-0", {0: 100.0, 1: 500.0}),  # seed 1 ran at the base rate only: left out of the comparison
        row("het-same-4-4", {0: 90.0, 1: 10.0}, gain=0.09),
        row("het-same-8-0-lr1e-3", {0: 120.0}, gain=0.02),
        row("het-same-4-4-lr1e-3", {0: 80.0}),
        row("het-same-4-4-noIS", {0: 999.0}),  # an ablation, not a rate
        row("homo-same-8-0", {0: 1.0}),  # no rate rows: no sweep
    ]
    text = "\n".join(sa.lr_sweep(rows, 3e-4))
    assert "Seed 0 (common" in text and "| het-same-8-0 | 0.001 | 120.0 | 0.020 |" in text
    assert "best learning rate by own-rollout reward: 8-0 0.001, 4-4 0.0003" in text
    assert "best 4/4 over best 8/0, own-rollout reward paired by seed 0.750; held-out gain +0.070" in text
    assert "homo" not in text and "999" not in text
    assert sa.lr_sweep(rows[-2:], 3e-4) == []


def _family_node(run: Path, cfg: str, node: int, own: float, success: dict[str, list[float]]) -> None:
    """A node whose own success on each family is given per draw (one draw of each family per step, 2 samples)."""
    d = run / cfg / "seed0" / f"node{node}"
    steps = len(next(iter(success.values())))
    _write(d / "metrics.jsonl", [{"step": s, "reward_mean": own} for s in range(1, steps + 1)])
    rows = [
        {"step": s + 1, "task": {"family": fam}, "rewards": [p, p]}
        for fam, ps in success.items()
        for s, p in enumerate(ps)
    ]
    _write(d / "rollouts.jsonl", rows)


def test_the_ceiling_gives_every_node_the_end_skill_of_the_best_row_and_the_best_stretch_of_any_node(
    tmp_path: Path,
) -> None:
    from benchmarks.b4_sapo import ceiling

    flat = [0.2] * 100
    late = [0.0] * 40 + [0.3] * 10 + [0.6] * 50  # its last 50 draws: 0.6
    peak = [0.2] * 30 + [0.5] * 50 + [0.2] * 20  # a best stretch in mid-run
    _family_node(tmp_path, "het-same-8-0", 0, 0.1, {"gcd": flat, "lcm": [0.0] * 100})
    _family_node(tmp_path, "het-same-8-0", 1, 0.1, {"gcd": peak, "lcm": [0.0] * 100})
    _family_node(tmp_path, "het-same-4-4", 0, 0.3, {"gcd": [0.1] * 100, "lcm": late})
    _family_node(tmp_path, "het-same-4-4", 1, 0.3, {"gcd": [1.0] * 20, "lcm": [1.0] * 20})  # too few draws
    _family_node(tmp_path, "homo-same-8-0", 0, 0.1, {"gcd": [1.0] * 100, "lcm": [1.0] * 100})  # other population
    results = sa.collect(tmp_path)
    c = sa.family_ceiling(results, ["het-same-8-0", "het-same-4-4"], "het-same-8-0")
    assert c is not None
    assert c["best"] == pytest.approx({"gcd": 0.5, "lcm": 0.6})
    assert c["where"] == {"gcd": "het-same-8-0", "lcm": "het-same-4-4"}
    assert c["share"] == pytest.approx({"gcd": 0.5, "lcm": 0.5})
    assert (c["reward"], c["base_reward"], c["ratio"]) == pytest.approx((0.55, 0.1, 5.5))
    # end skill: 8-0's nodes average (0.2 + 0.38) / 2 on gcd over their last 50 draws; 4-4's one node with 50 draws
    # has lcm 0.6 (its other node, with 20 draws, counts for neither bound)
    assert c["end"] == pytest.approx({"gcd": 0.29, "lcm": 0.6})
    assert (c["reward_end"], c["ratio_end"]) == pytest.approx((0.445, 4.45))
    assert sa.family_ceiling(results, ["het-same-4-4"], "het-paper-8-0") is None
    rows = sa.summary_rows(results, [])
    lines = ceiling(results, rows)
    assert len(lines) == 2  # one per population's 8-0, each over its own population's rows
    het = next(v for v in lines if v.startswith("het-same-8-0"))
    assert (
        "**4.45x** (lcm 0.60, gcd 0.29)" in het
        and "**5.50x** (lcm 0.60 (het-same-4-4), gcd 0.50 (het-same-8-0))" in het
    )
    assert "2 het rows" in het and "earns 0.100 a node-step" in het
    homo = next(v for v in lines if v.startswith("homo-same-8-0"))
    assert homo.count("**10.00x**") == 2
