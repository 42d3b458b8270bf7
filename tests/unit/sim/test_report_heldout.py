"""The simulator report puts held-out accuracy beside training reward: table columns, spread only over seeds."""

from __future__ import annotations

import json
from pathlib import Path

from sim.report.summary import write_report


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(out: Path, config: str, seed: int, node: int, start: float, end: float, reward: float) -> None:
    d = out / config / f"seed{seed}" / f"node{node}"
    _write(d / "metrics.jsonl", [{"step": s, "reward_mean": reward} for s in (1, 2, 3, 4)])
    _write(d / "eval.jsonl", [{"step": 0, "accuracy": start}, {"step": 2, "accuracy": (start + end) / 2},
                              {"step": 4, "accuracy": end}])  # fmt: skip


def test_heldout_columns_and_plot(tmp_path: Path) -> None:
    for node in (0, 1):
        _run(tmp_path, "alone", 0, node, 0.1, 0.2 + 0.1 * node, 0.3)  # gains 0.1 and 0.2: mean 0.15
        _run(tmp_path, "swarm", 0, node, 0.1, 0.4, 0.5)
        _run(tmp_path, "swarm", 1, node, 0.1, 0.3, 0.5)
    rows = write_report(tmp_path, title="t", order=["alone", "swarm"])
    alone, swarm = rows
    assert alone["heldout_start"] == 0.1 and abs(alone["heldout_end"] - 0.25) < 1e-12
    assert abs(alone["heldout_gain"] - 0.15) < 1e-12
    assert abs(swarm["heldout_gain"] - 0.25) < 1e-12 and swarm["heldout_gain_std"] > 0
    md = (tmp_path / "results.md").read_text()
    assert "held-out exact start -> end" in md and "majority baseline" in md
    alone_line = next(line for line in md.splitlines() if line.startswith("| alone |"))
    swarm_line = next(line for line in md.splitlines() if line.startswith("| swarm |"))
    assert "0.100 -> 0.250" in alone_line and "±" not in alone_line  # one seed: no spread
    assert "0.250 ± 0.071" in swarm_line
    assert (tmp_path / "rewards.png").stat().st_size > 0


def test_report_without_evaluations_says_so(tmp_path: Path) -> None:
    d = tmp_path / "only" / "seed0" / "node0"
    _write(d / "metrics.jsonl", [{"step": 1, "reward_mean": 0.5}])
    [row] = write_report(tmp_path, title="t")
    md = (tmp_path / "results.md").read_text()
    assert row["heldout_gain"] != row["heldout_gain"]  # NaN: nothing to report
    assert "| only | 1 | 1 | 1 | 0.50 | 1 | 0.00 | 0.500 | - | - | - | - |" in md
