"""Benchmarks' quick modes run end to end (so they never rot); timings are not checked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_b2_quick(tmp_path: Path, tiny_cache: Path) -> None:
    b2 = _load("b2_rollout")
    # the cache of the reduced model the other tests share (tests/conftest.py)
    assert b2.main(["--quick", "--out", str(tmp_path), "--cache-dir", str(tiny_cache)]) == 0
    text = (tmp_path / "b2_rollout.md").read_text()
    assert "| batch |" in text and "cores" in text and "GPU" in text
