"""The soak's verdict: a slow RSS leak fails it inside the +15% bound; one run of two keeps the other's samples."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from benchmarks.systems.soak_verdict import fitted_slope

ROOT = Path(__file__).resolve().parents[3]


def _soak():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks" / "systems" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(rss, steps: int = 2000, every: int = 100) -> list[dict]:
    return [{"step": s, "elapsed_s": s / 10, "rss_mb": rss(s), "open_fds": 11} for s in range(0, steps + 1, every)]


def _rss(verdict: list[dict]) -> dict:
    return next(v for v in verdict if v["probe"] == "rss_mb")


def test_fitted_slope_reads_the_second_half_and_ignores_one_noisy_end() -> None:
    soak = _soak()
    # +20 MB per 1000 steps from step 1000 on, flat before
    assert abs(fitted_slope(_rows(lambda s: 500 + 0.02 * max(0, s - 1000)), "rss_mb") - 20.0) < 1e-6
    # flat over 10,000 steps, with one +40 MB spike at the last sample: end minus midpoint reads +8 MB/1000 steps
    spiky = _rows(lambda s: 540.0 if s == 10_000 else 500.0, steps=10_000)
    assert fitted_slope(spiky, "rss_mb") < 2
    assert _rss(soak.verdict(spiky, 0.15, 4))["ok"]


def test_a_slow_leak_inside_the_rss_bound_fails_the_slope_bound() -> None:
    soak = _soak()
    leak = _rows(lambda s: 500 + 0.01 * s)  # +10 MB per 1000 steps: 501 -> 520, +4%, inside +15%
    flat = _rows(lambda s: 500 + (3 if s % 200 else 0))  # noise, no trend
    assert not _rss(soak.verdict(leak, 0.15, 4))["ok"]
    assert _rss(soak.verdict(leak, 0.15, 4, slope_bound=12.0))["ok"]
    assert _rss(soak.verdict(flat, 0.15, 4))["ok"]
    # the +15% bound still holds on its own
    jump = _rows(lambda s: 500 if s < 300 else 600)
    assert not _rss(soak.verdict(jump, 0.15, 4, slope_bound=100.0))["ok"]


def test_only_one_run_keeps_the_other_runs_saved_samples(tmp_path: Path, monkeypatch) -> None:
    soak = _soak()
    out = tmp_path / "soak.md"
    alone = _rows(lambda s: 550.0)
    out.with_suffix(".json").write_text(json.dumps({"alone": alone, "swarm": _rows(lambda s: 1.0)}))

    async def fake_swarm(steps, every, work, round_s):
        return _rows(lambda s: 700.0, steps, every)

    monkeypatch.setattr(soak, "run_swarm", fake_swarm)
    assert soak.main(["--only", "swarm", "--steps", "1000", "--out", str(out)]) == 0
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["alone"] == alone and saved["swarm"][-1]["step"] == 1000 and saved["swarm"][-1]["rss_mb"] == 700.0
    text = out.read_text()
    assert text.index("## alone: 2000 steps") < text.index("## swarm: 1000 steps")
    assert text.count("An earlier run's samples") == 1
    assert out.with_suffix(".png").stat().st_size > 0
