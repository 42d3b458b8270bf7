"""The multi-process soak's verdict: a slope judged with its interval (pass, fail, or too noisy to tell); RSS per
1,000 steps of the node, the other measures per hour."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

from benchmarks.systems.soak_verdict import block_slope, slope_per_hour, swing

ROOT = Path(__file__).resolve().parents[3]
MB = 2**20


def _soak():
    path = ROOT / "benchmarks" / "systems" / "soak_multiproc.py"
    spec = importlib.util.spec_from_file_location("soak_multiproc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _samples(rss, hours: float = 2.0, every_s: float = 30.0, nodes: int = 2, steps_h: float = 1000) -> list[dict]:
    out = []
    for k in range(int(hours * 3600 / every_s) + 1):
        t = k * every_s
        node = {"rss": rss(t), "fds": 26, "threads": 17, "dht_keys": 80, "step": int(steps_h * t / 3600)}
        node["rss_step"] = node["rss"]  # the node's RSS between steps (+ p2pd): here the same series
        out.append({"t": t, "nodes": [dict(node) for _ in range(nodes)]})
    return out


def test_flat_noisy_rss_passes_a_steady_leak_fails_and_a_borderline_one_is_undecided() -> None:
    soak = _soak()
    rng = random.Random(0)
    flat = _samples(lambda t: 700 * MB + rng.gauss(0, 3) * MB)
    rows, outcome = soak.verdict(flat, [0, 1], 7200, 2.0)
    assert outcome == "PASS", rows
    # 40 MB/h at 1,000 steps an hour: 40 MB per 1,000 steps against 2%/h at the lab's 1,440 steps/h (9.7 MB)
    leak = _samples(lambda t: 700 * MB + 40 * MB * t / 3600 + rng.gauss(0, 3) * MB)
    rows, outcome = soak.verdict(leak, [0, 1], 7200, 2.0)
    assert outcome == "FAIL" and "FAIL" in rows[0]
    # at the bound, with noise as wide as the first 2-hour run's: the run cannot tell, and says so
    edge = _samples(lambda t: 700 * MB + 10 * MB * t / 3600 + rng.gauss(0, 25) * MB)
    rows, outcome = soak.verdict(edge, [0, 1], 7200, 2.0)
    assert outcome == "UNDECIDED" and "undecided" in rows[0]
    assert soak.verdict(flat[:100], [0], 99 * 30, 2.0)[1] == "SHORT"


def test_one_spike_moves_a_block_median_little() -> None:
    ts = [float(t) for t in range(0, 3601, 30)]
    ys = [700.0] * len(ts)
    ys[-1] = 786.0  # the largest sample-to-sample swing the first run saw, at the very end
    sl, lo, hi = block_slope(ts, ys)
    assert sl == 0.0 and lo == 0.0 and hi == 0.0
    assert slope_per_hour(ts, ys) > 2.0  # a least-squares slope over the samples reads a trend


def test_the_python_heap_is_judged_beside_rss_and_an_older_run_without_it_reads_n_a() -> None:
    soak = _soak()
    rng = random.Random(1)
    noisy = _samples(lambda t: 700 * MB + 14 * MB * t / 3600 + rng.gauss(0, 25) * MB)
    growing = [dict(s, nodes=[{**n, "heap": 300_000 + 20_000 * s["t"] / 3600} for n in s["nodes"]]) for s in noisy]
    rows, outcome = soak.verdict(growing, [0, 1], 7200, 2.0, keys=("heap",))
    assert outcome == "FAIL" and "k/h" in rows[0]  # 20k blocks an hour against 2% of ~320k
    flat = [dict(s, nodes=[{**n, "heap": 300_000 + (s["t"] % 60)} for n in s["nodes"]]) for s in noisy]
    assert soak.verdict(flat, [0, 1], 7200, 2.0, keys=("heap",))[1] == "PASS"
    rows, outcome = soak.verdict(noisy, [0, 1], 7200, 2.0)  # samples of a run before the heap was kept
    assert rows[0].split(" | ")[2] == "n/a" and outcome == "UNDECIDED"


def test_anonymous_rss_is_bounded_by_its_own_median_not_the_fixed_default() -> None:
    soak = _soak()
    rng = random.Random(2)
    base = _samples(lambda t: 700 * MB + rng.gauss(0, 3) * MB)
    # 10 MB/h on a 300 MB anonymous set is 3.3%/h: beyond 2% of its own median (6 MB/h), within 10% + 20 MB
    anon = [dict(s, nodes=[{**n, "rss_anon": 300 * MB + 10 * MB * s["t"] / 3600} for n in s["nodes"]]) for s in base]
    rows, outcome = soak.verdict(anon, [0, 1], 7200, 2.0, keys=("rss_anon",))
    assert outcome == "FAIL" and " MB/h" in rows[0], rows
    assert soak.verdict(anon, [0, 1], 7200, 2.0)[1] == "PASS"  # the registered verdict does not read it


def test_rss_is_judged_per_1000_steps_so_the_step_rate_decides_a_slow_rise() -> None:
    soak = _soak()
    rise = lambda t: 700 * MB + 12 * MB * t / 3600  # noqa: E731 -- 12 MB an hour, no noise
    rows, outcome = soak.verdict(_samples(rise, steps_h=4000), [0], 7200, 2.0, keys=("rss_kstep",))
    assert outcome == "PASS" and "+3.0 [+3.0, +3.0] MB/1,000 steps" in rows[0], rows  # 3 MB a 1,000 steps
    rows, outcome = soak.verdict(_samples(rise, steps_h=500), [0], 7200, 2.0, keys=("rss_kstep",))
    assert outcome == "FAIL" and "+24." in rows[0], rows  # 24 MB a 1,000 steps (int steps) against 10
    assert soak.verdict(_samples(rise, steps_h=500), [0], 7200, 2.0, keys=("rss",))[1] == "PASS"  # 12 MB/h < 14


def test_the_swing_is_the_change_between_consecutive_samples() -> None:
    assert swing([700.0, 750.0, 700.0, 701.0, 700.0]) == (25.5, 50.0)
    assert swing([700.0]) != swing([700.0])  # one sample has no change: NaN


def test_the_verdict_judges_rss_between_steps_not_rss_at_any_moment() -> None:
    soak = _soak()
    rng = random.Random(3)
    # RSS sampled at any moment swings with the step's working set; between steps it is flat, or it leaks
    base = _samples(lambda t: 700 * MB + rng.gauss(0, 25) * MB, steps_h=2000)
    for s in base:
        for n in s["nodes"]:
            del n["rss_step"]
    flat = [dict(s, nodes=[{**n, "rss_step": 690 * MB} for n in s["nodes"]]) for s in base]
    leak = [dict(s, nodes=[{**n, "rss_step": 690 * MB + 60 * MB * n["step"] / 1000} for n in s["nodes"]]) for s in base]
    rows, outcome = soak.verdict(flat, [0], 7200, 2.0, keys=("rss_kstep",))
    assert outcome == "PASS" and "690 MB" in rows[0], rows
    assert soak.verdict(leak, [0], 7200, 2.0, keys=("rss_kstep",))[1] == "FAIL"
    assert soak.verdict(flat, [0], 7200, 2.0, keys=("rss",))[1] == "UNDECIDED"  # the instantaneous series
    rows, outcome = soak.verdict(base, [0], 7200, 2.0, keys=("rss_kstep",))  # a run before rss_step was kept
    assert rows[0].endswith("| n/a |") and outcome == "PASS"
