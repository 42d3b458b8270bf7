"""The B8 learning report: before/after per seed, gains with their spread, and the verdicts it states."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def _family(acc: float, greedy: float, pass8: float, fmt: float, baseline: float = 0.1) -> dict:
    return {"accuracy": acc, "greedy_accuracy": greedy, "format_rate": fmt, "majority_baseline": baseline,
            "reward": acc + 0.1, "pass_at_1": acc, "pass_at_8": pass8, "top_answer": "7", "top_answer_share": 0.2,
            "mean_length": 20.0}  # fmt: skip


def _write_run(work: Path, seed: int, before: float, after: float, pass8_after: float) -> None:
    d = work / f"seed{seed}"
    d.mkdir(parents=True)
    rows = [
        {"step": 0, "families": {"products": _family(before, 0.2, 0.5, 0.5)}},
        {"step": 50, "families": {"products": _family((before + after) / 2, 0.25, 0.5, 0.8)}},
        {"step": 100, "families": {"products": _family(after, 0.3, pass8_after, 1.0)}},
    ]
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _work(tmp_path: Path, before_after: list[tuple[float, float]], pass8_after: float) -> Path:
    """A work dir as ``b8_learning.py run`` leaves it: node.yaml and one finished run per seed."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "node.yaml").write_text(yaml.safe_dump({"model": {"name": "smollm2-135m"}}))
    for seed, (b, a) in enumerate(before_after):
        _write_run(work, seed, b, a, pass8_after=pass8_after)
    return work


def _report(work: Path, out: Path, *extra: str) -> str:
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "b8_learning.py"),
        "report",
        "--work",
        str(work),
        "--out",
        str(out),
        *extra,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    return (out / "b8_learning.md").read_text()


def test_report_states_gain_spread_baseline_and_pass_at_8(tmp_path: Path) -> None:
    work = _work(tmp_path, [(0.10, 0.30), (0.12, 0.31), (0.11, 0.33)], pass8_after=0.6)
    text = _report(work, tmp_path / "out")
    assert "| 0 | products | 100 | 0.100 -> 0.300 |" in text
    assert "| 1 | products | 100 | 0.120 -> 0.310 |" in text
    assert all(line.endswith("| 0.100 | '7' (0.20) |") for line in text.splitlines() if line.startswith("| 1 |"))
    # in format: accuracy / format rate (0.10 / 0.5 before)
    assert "0.200 -> 0.300" in text
    assert "- products: exact gain +0.203, beyond 2 sd" in text
    assert "above the majority baseline in every seed; pass@8 did not fall (+0.100)" in text
    assert (tmp_path / "out" / "b8_learning.png").stat().st_size > 0


def test_report_says_within_the_spread_and_pass_at_8_falling(tmp_path: Path) -> None:
    work = _work(tmp_path, [(0.10, 0.05), (0.10, 0.30), (0.10, 0.12)], pass8_after=0.4)
    text = _report(work, tmp_path / "out")
    assert "- products: exact gain +0.057, within 2 sd" in text
    assert "not above the majority baseline" in text  # seed 0 ends at 0.05 < 0.1
    assert "pass@8 fell (-0.100)" in text


def test_report_leaves_out_unfinished_seeds_and_names_a_loss(tmp_path: Path) -> None:
    work = _work(tmp_path, [(0.30, 0.10), (0.30, 0.11)], pass8_after=0.6)
    stopped = work / "seed7"
    stopped.mkdir()
    rows = [{"step": s, "families": {"products": _family(0.3, 0.2, 0.5, 0.5)}} for s in (0, 50)]
    (stopped / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "seed0-old").mkdir()  # not a seed directory
    text = _report(work, tmp_path / "out")
    assert "| 7 |" not in text
    assert "- products: exact loss -0.195, beyond 2 sd" in text


def test_report_sets_the_stock_model_beside_the_trained_one(tmp_path: Path) -> None:
    work = _work(tmp_path, [(0.10, 0.30), (0.12, 0.32)], pass8_after=0.6)
    node = {"tasks": {"families": [{"name": "products", "config": {"max_digits": 1}}]},
            "eval": {"items_per_family": 48}, "rollout": {"max_new_tokens": 64}}  # fmt: skip
    (work / "node.yaml").write_text(yaml.safe_dump(node))
    stock = tmp_path / "stock.json"
    row = {"family": "products", "accuracy": 0.05, "greedy": 0.2, "pass8": 0.25}
    stock.write_text(json.dumps({"config": node, "rows": [row]}))
    text = _report(work, tmp_path / "out", "--stock", str(stock))
    assert "| products | 0.050 / 0.310 | 0.200 / 0.300 | 0.250 / 0.600 |" in text
    other = {**node, "eval": {"items_per_family": 16}}  # probed on other items: not a line for these runs
    stock.write_text(json.dumps({"config": other, "rows": [row]}))
    assert "stock / after" not in _report(work, tmp_path / "out2", "--stock", str(stock))
