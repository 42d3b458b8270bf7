"""Benchmarks' quick modes run end to end (so they never rot); timings are not checked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "systems" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_b2_quick(tmp_path: Path, tiny_cache: Path) -> None:
    b2 = _load("b2_rollout")
    # the cache of the reduced model the other tests share (tests/conftest.py)
    assert b2.main(["--quick", "--out", str(tmp_path), "--cache-dir", str(tiny_cache)]) == 0
    text = (tmp_path / "b2_rollout.md").read_text()
    assert "| batch |" in text and "cores" in text and "GPU" in text


def test_soak_quick(tmp_path: Path) -> None:
    soak = _load("soak")
    out = tmp_path / "soak.md"
    assert soak.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    assert "## alone: 30 steps" in text and "## swarm: 30 steps" in text and "cores" in text
    rows = __import__("json").loads(out.with_suffix(".json").read_text())
    swarm = rows["swarm"][-1]
    # the swarm really exchanged records, so the caches it samples are exercised
    assert swarm["pool"] > 0 and swarm["channel_seen"] > 0 and swarm["net_records"] > 0 and swarm["replay_entries"] > 0
    assert swarm["vade_posteriors"] > 0 and swarm["mnpo_ref_cache"] >= 0
    assert rows["alone"][-1]["rollouts_bytes"] > rows["alone"][1]["rollouts_bytes"]
    for probe in ("rss_mb", "open_fds", "pool", "channel_seen", "replay_entries", "metrics_bytes"):
        assert f"| {probe} |" in text
