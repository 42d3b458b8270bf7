"""The simulator benchmarks' quick modes run end to end (so they never rot)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_b5_scale_quick(tmp_path):
    out = tmp_path / "b5.md"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "b5_scale.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    text = out.read_text()
    assert "| 5 |" in text and "| 40 |" in text and "Machine:" in text and "Reach" in text


def test_sybils_take_at_most_the_newcomer_share(tmp_path):
    """100 fresh sybil identities per round publishing informative groups: honest peers still supply at least
    half of what an honest node trains on from outside (the newcomer budgets of the read and of SAPO)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sybil import measure

    row = measure(100, 8, 3, tmp_path)
    assert row["external_groups"] > 0
    assert row["min_share"] >= 0.5, row


@pytest.mark.slow
def test_b4_sapo_smoke(tmp_path):
    out = tmp_path / "b4.md"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "b4_sapo.py"),
            "--smoke",
            "--run-dir",
            str(tmp_path / "run"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    text = out.read_text()
    assert "| smoke-same-8-0 |" in text and "| smoke-same-4-4 |" in text and "4/4 vs 8/0" in text
    for plot in ("b4_reward.png", "b4_batch.png", "b4_aha.png"):
        assert (tmp_path / plot).stat().st_size > 0


def test_b4_ordering_compares_the_splits_on_the_seeds_they_share():
    from benchmarks.b4_sapo import ordering

    by = {
        # 4/4 ran seeds 0-2 (a high seed 1 lifts its mean); the others only seed 0, where 2/6 is best
        "4-4": {"seed_ids": [0, 1, 2], "own": [101.0, 130.0, 100.0]},
        "2-6": {"seed_ids": [0], "own": [103.0]},
        "6-2": {"seed_ids": [0], "own": [102.0]},
        "8-0": {"seed_ids": [0, 1, 2], "own": [99.0, 99.0, 99.0]},
    }
    line = ordering(by, ["4-4", "2-6", "6-2", "8-0"])
    assert line.startswith("ordering ours 2-6 > 6-2 > 4-4 > 8-0 (seed 0, common to these rows"), line
    assert line.endswith("(different)")
    by["2-6"]["seed_ids"] = [5]
    assert ordering(by, ["4-4", "2-6", "6-2", "8-0"]).startswith("ordering: no seed common")


def test_b4_ordering_ranks_by_the_paired_ratio_like_the_by_length_table():
    """Where the mean reward and the mean paired ratio disagree, the verdict line follows the by-length table's
    ratios: a split that is ahead on one high-reward seed only is not ahead on the seeds' ratios."""
    from benchmarks.b4_sapo import ordering

    by = {
        "4-4": {"seed_ids": [0, 1], "own": [220.0, 110.0]},  # ratios 1.10, 1.10: mean 1.100, mean own 165
        "2-6": {"seed_ids": [0, 1], "own": [250.0, 90.0]},  # ratios 1.25, 0.90: mean 1.075, mean own 170
        "8-0": {"seed_ids": [0, 1], "own": [200.0, 100.0]},
    }
    line = ordering(by, ["4-4", "2-6", "8-0"])
    assert line.startswith("ordering ours 4-4 > 2-6 > 8-0 (seeds 0, 1, common to these rows, mean ratio"), line
    del by["8-0"]
    line = ordering(by, ["4-4", "2-6"])
    assert line.startswith("ordering ours 2-6 > 4-4 (seeds 0, 1, common to these rows, mean own-rollout"), line


def test_b4_splits_by_length_pairs_by_seed_and_orders_each_length():
    from benchmarks.analysis.sapo_b4 import NodeRun, SeedResult, splits_by_length

    def run(seed, rewards):
        return SeedResult(seed, {0: NodeRun([{"reward_mean": r} for r in rewards], [], [])})

    base = [run(s, [1.0] * 10) for s in (0, 1, 2)]
    early = [run(s, [1.2 + 0.1 * s] * 2 + [0.8] * 8) for s in (0, 1)]  # ahead early, below 8-0 at the end
    steady = [run(s, [1.05] * 10) for s in (0, 1)]
    text = splits_by_length({"p-8-0": base, "p-4-4": early, "p-2-6": steady}, ["p-4-4", "p-2-6"], "p-8-0")
    assert text.startswith("Seeds 0, 1 (common to these rows)")
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ") and "K (steps)" not in line]
    assert [r[0].strip() for r in rows] == ["2", "3", "5", "7", "8", "10"]
    assert rows[0][1].strip() == "1.250 ± 0.071" and rows[0][3].strip() == "p-4-4 > p-2-6 > p-8-0"
    assert rows[-1][2].strip() == "1.050 ± 0.000" and rows[-1][3].strip() == "p-2-6 > p-8-0 > p-4-4"
    base.append(run(3, [1.0] * 4))  # a base seed no split ran (shorter, still running) does not cut K
    again = splits_by_length({"p-8-0": base, "p-4-4": early, "p-2-6": steady}, ["p-4-4", "p-2-6"], "p-8-0")
    assert again == text
    assert splits_by_length({"p-8-0": base, "p-4-4": early}, ["p-4-4", "p-2-6"], "p-8-0") == ""
    zero = [run(s, [0.0] * 2 + [1.0] * 8) for s in (0, 1)]  # no reward in 8-0's first steps: no ratio, no crash
    assert splits_by_length({"p-8-0": zero, "p-4-4": early, "p-2-6": steady}, ["p-4-4", "p-2-6"], "p-8-0") == ""
