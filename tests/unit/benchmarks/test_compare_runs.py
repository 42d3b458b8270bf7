"""benchmarks/compare_runs.py: timings aside, any difference in a run tree's JSONL lines is reported."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.compare_runs import compare, main


def _tree(root: Path, rows: list[dict]) -> Path:
    d = root / "cfg" / "seed0" / "node0"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "cfg"


def test_timings_alone_do_not_count_but_a_value_does(tmp_path: Path) -> None:
    before = _tree(
        tmp_path / "a", [{"step": 1, "reward_mean": 0.5, "gen_s": 1.0, "time": 5.0, "seconds": 2, "py_heap_blocks": 7}]
    )
    same = _tree(
        tmp_path / "b", [{"step": 1, "reward_mean": 0.5, "gen_s": 9.0, "time": 7.0, "seconds": 3, "py_heap_blocks": 9}]
    )
    other = _tree(tmp_path / "c", [{"step": 1, "reward_mean": 0.25, "gen_s": 1.0, "time": 5.0, "seconds": 2}])
    assert compare(before, same) == (1, [])
    assert compare(before, other) == (1, ["seed0/node0/metrics.jsonl:1: reward_mean"])
    assert main([str(before), str(same)]) == 0 and main([str(before), str(other)]) == 1


def test_a_missing_line_or_file_is_a_difference(tmp_path: Path) -> None:
    before = _tree(tmp_path / "a", [{"step": 1}, {"step": 2}])
    shorter = _tree(tmp_path / "b", [{"step": 1}])
    assert compare(before, shorter)[1] == ["seed0/node0/metrics.jsonl: 2 lines before, 1 after"]
    assert compare(before, tmp_path / "nowhere")[1] == ["seed0/node0/metrics.jsonl: missing after"]
