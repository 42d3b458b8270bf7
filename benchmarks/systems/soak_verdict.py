"""B9 soak's verdict and report (``soak.py`` runs them): which probes must stay flat, which may fill up to a cap
and which grow by design, the verdict on one run's samples, and the Markdown report; and the multi-process soak's
slope of time-block medians (per hour or per 1,000 steps) with its interval, its swing and its verdict.

Knows nothing about running a node; works on the samples ``soak_probe.sample`` takes.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import statistics
import sys
from typing import Any

from benchmarks.common.machine import machine_info
from node.config import RuntimeConfig
from protocol.validation import VERDICT_CACHE_ENTRIES

#: ``vade.max_tracked`` of the VADE node: small enough that the LRU reaches it within the run and is seen to hold
#: (one posterior per prompt drawn, ~1.1 per round; the default 100,000 would take ~90,000 rounds).
VADE_TRACKED = 1000

#: Append-only logs: they grow linearly by design (what the node is asked to record); bytes per step reported.
LOGS = {
    "rollouts_bytes": "append-only log of own groups, one JSON line per group",
    "metrics_bytes": "append-only log, one JSON line per step",
}
#: Structures that fill up to a configured cap (per node), then stay there: (cap, what bounds them).
CAPS: dict[str, tuple[int, str]] = {
    "tasks_items": (4096, "TaskSource item LRU (cache_items)"),
    "tasks_datasets": (64, "TaskSource dataset LRU"),
    "vade_posteriors": (VADE_TRACKED, "VADE posteriors, LRU at vade.max_tracked; one per prompt drawn until then"),
    "pool": (2048, "sapo.pool_size, and pruned after sapo.max_age_steps"),
    "pool_sources": (8192, "RolloutPool per-source statistics, LRU"),
    "channel_seen": (200_000, "seen digests: pruned past the acceptance horizon, capped at seen_capacity"),
    "replay_entries": (200_000, "(sender, seq) pairs inside the acceptance horizon, capped at replay_capacity"),
    "index_writer_windows": (9, "own index entries: the last 8 windows"),
    "outbox": (
        RuntimeConfig().max_outbox_groups,
        "own groups waiting for the next publish, the oldest dropped past runtime.max_outbox_groups",
    ),
    "verdict_cache": (
        VERDICT_CACHE_ENTRIES,
        "the validator's decoded records: those inside the acceptance horizon, LRU at VERDICT_CACHE_ENTRIES",
    ),
    "reader_cache_windows": (12, "shard reader cache: expiration_windows + 2 windows"),
    "checkpoint_files": (12, "checkpoint.keep = 2 checkpoints of 6 files"),
}
#: Wall clock and sample metadata, not state.
IGNORED = {"elapsed_s"}


def fitted_slope(rows: list[dict[str, Any]], key: str) -> float:
    """Least-squares slope of ``key`` per 1000 steps over the second half of the samples (a leak's rate; unlike the
    difference of two samples, one noisy sample at either end cannot make or hide it)."""
    half = [r for r in rows[len(rows) // 2 :] if isinstance(r.get(key), int | float)]
    if len({r["step"] for r in half}) < 2:
        return 0.0
    return 1000 * statistics.linear_regression([r["step"] for r in half], [r[key] for r in half]).slope


def verdict(rows: list[dict[str, Any]], rss_bound: float, nodes: int, slope_bound: float = 5.0) -> list[dict[str, Any]]:
    """One line per probe: baseline (first sample after warm-up), end, and whether it is flat, capped or a log.

    RSS must also grow by at most ``slope_bound`` MB per 1000 steps over the second half (a fitted slope): a slow
    leak stays inside a +15% bound for thousands of steps, and volunteers run for days."""
    base, end = rows[1], rows[-1]
    # A slope over the second half shows a slow leak that a baseline/end ratio could hide.
    mid = rows[len(rows) // 2]
    span = max(end["step"] - mid["step"], 1)
    out = []
    for key in end:
        if key == "step" or key in IGNORED or key not in base:
            continue
        b, e = base[key], end[key]
        if not isinstance(b, int | float) or not isinstance(e, int | float):
            continue
        peak = max(r.get(key, 0) or 0 for r in rows[1:])
        slope = (e - mid.get(key, e)) / span * 1000
        flat = e <= max(b, 1) * 1.5 + 2
        if key in LOGS:
            per_step = (e - b) / max(end["step"] - base["step"], 1)
            ok, kind, note = True, "log", f"{LOGS[key]}: {per_step:,.0f} bytes per step, linear by design"
        elif key == "rss_mb":
            fitted = fitted_slope(rows, key)
            ok, kind = e <= b * (1 + rss_bound) and fitted <= slope_bound, "flat"
            note = (
                f"bound +{rss_bound:.0%} of baseline and a second-half slope <= {slope_bound:g} MB/1000 steps "
                f"(least squares over the second half's samples): {fitted:+.1f} MB/1000 steps (end minus "
                f"midpoint {slope:+.1f}); peak {peak:,.0f}"
            )
        elif key == "py_objects":
            # Capped caches hold objects (a TaskSource item is a question, an answer and a metadata dict): count
            # from the sample where the item LRU reached its final size, the others being far below their caps.
            settled = next((r for r in rows[1:] if r.get("tasks_items") == end.get("tasks_items")), base)
            sb = settled[key]
            ok, kind = e <= sb * 1.05 + 1000, "flat"
            note = (
                f"bound +5% (+1000) from step {settled['step']}, when the TaskSource item LRU had filled to its "
                f"cap ({sb:,} -> {e:,}: {100 * (e - sb) / sb:+.1f}%; {100 * (e - b) / b:+.1f}% from the baseline, "
                f"the LRU filling); second-half slope {slope:+,.0f} per 1000 steps"
            )
        elif key == "threads":
            # Python threads: the main one and asyncio's default pool, which starts a worker whenever work is
            # submitted while all are busy, up to min(32, cores + 4), and keeps it.
            cap = 1 + min(32, (os.cpu_count() or 1) + 4)
            ok, kind = peak <= cap, "flat" if flat else "capped"
            note = f"main thread + asyncio's default thread pool (min(32, cores + 4) workers); cap {cap}; peak {peak}"
        elif key == "checkpoint_bytes":
            files = end.get("checkpoint_files", 0)
            ok, kind = files <= CAPS["checkpoint_files"][0] * nodes, "capped"
            note = f"checkpoint.keep = 2 per node; peak {peak:,}"
        elif key in CAPS:
            cap, why = CAPS[key]
            ok = peak <= cap * nodes
            kind = "flat" if flat else "capped"
            note = f"{why}; cap {cap * nodes:,}; peak {peak:,}; second-half slope {slope:+,.1f} per 1000 steps"
        else:
            ok, kind = flat, "flat"
            note = f"peak {peak:,}; second-half slope {slope:+,.1f} per 1000 steps"
        out.append({"probe": key, "baseline": b, "end": e, "ok": bool(ok), "kind": kind, "note": note})
    return out


def render(results: dict[str, dict[str, Any]], args: argparse.Namespace, step: dict[str, Any]) -> str:
    lines = [
        "# B9 soak: a node alone and a 4-node in-process swarm over a long run",
        "",
        f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  ",
        f"Machine: {machine_info(['hivemind'])}  ",
        "Cores shared with other engineers' jobs: wall times are indicative only.",
        "",
        (
            "Command: `python benchmarks/systems/soak.py` (re-rendered from its saved samples, `--from-json`)"
            if args.from_json is not None
            else f"Command: `python benchmarks/systems/soak.py {' '.join(sys.argv[1:])}`".replace(" `", "`")
        ),
        "",
        f"Step: {json.dumps(step)}. Swarm: 4 nodes, one process, memory network; network clock +{args.round_s}s "
        "per round (window 15 s: a new window every few rounds); node 2 APRIL+VADE "
        f"(vade.max_tracked {VADE_TRACKED}), node 3 MNPO side by side.",
        "",
        "Baseline is the sample at the end of the first "
        f"{args.every} steps (warm-up: pools fill, caches reach their working size); end is the last sample. "
        "Counts are summed over the swarm's four nodes. Verdicts: *flat* = end within 1.5x (+2) of the baseline; "
        "*capped* = grows, but its peak stays under the configured cap named in the note (it fills up to it, then "
        f"stays); *log* = append-only file, linear by design. RSS must stay within +{args.rss_bound:.0%} of its "
        f"baseline and grow by at most {args.slope_bound:g} MB per 1000 steps over the second half (least squares), "
        "live Python objects within +5%.",
        "",
    ]
    saved = args.out.with_suffix(".json").name
    for label, res in results.items():
        rows = res["rows"]
        earlier = [f"(An earlier run's samples, kept in `{saved}`; verdicts recomputed.)", ""]
        earlier = earlier if res.get("earlier") else []
        lines += [
            f"## {label}: {rows[-1]['step']} steps in {res['wall_s']:.0f} s",
            "",
            *earlier,
            "| probe | baseline | end | verdict | note |",
            "|---|---:|---:|---|---|",
        ]
        for v in res["verdict"]:
            b, e = v["baseline"], v["end"]
            fmt = (lambda x: f"{x:,.1f}") if isinstance(b, float) or isinstance(e, float) else (lambda x: f"{x:,}")
            mark = v["kind"] if v["ok"] else f"NOT {v['kind']}"
            lines.append(f"| {v['probe']} | {fmt(b)} | {fmt(e)} | {mark} | {v['note']} |")
        lines.append("")
        shown = rows[:: max(1, len(rows) // 25)]  # about 25 samples, and the last
        shown += [] if shown[-1] is rows[-1] else [rows[-1]]
        lines += ["RSS (MB) over steps: " + ", ".join(f"{r['step']}: {r['rss_mb']:.0f}" for r in shown), ""]
        jumps = [
            f"step {cur['step']} ({prev['rss_mb']:.0f} -> {cur['rss_mb']:.0f} MB, threads {prev['threads']} -> "
            f"{cur['threads']})"
            for prev, cur in itertools.pairwise(rows[1:])
            if cur["rss_mb"] > prev["rss_mb"] * 1.04
        ]
        if jumps:
            lines += [
                "RSS steps of more than 4% between samples: " + "; ".join(jumps) + ". A step that coincides with a "
                "new thread is most likely the thread pool behind `asyncio.to_thread` starting another worker (at "
                "most min(32, cores + 4)) with its own malloc arena (not verified); RSS is flat between steps.",
                "",
            ]
    return "\n".join(lines) + "\n"


# -- the multi-process soak's slopes (``soak_multiproc.py``) ---------------------------------------------------


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    if len(ts) < 3:
        return float("nan")
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    den = sum((t - mt) ** 2 for t in ts)
    return 3600.0 * sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / den if den else float("nan")


#: Time blocks of the judged half, and the two-sided 95% t multiplier for their slope (blocks - 2 = 4 df).
BLOCKS, T975_4 = 6, 2.776


def block_slope(ts: list[float], ys: list[float], blocks: int = BLOCKS) -> tuple[float, float, float]:
    """Slope per hour of the medians of ``blocks`` equal time blocks, and its 95% interval: a sample-to-sample
    swing of the allocator moves one block's median little, a leak moves every block's."""
    lo_t, hi_t = ts[0], ts[-1]
    width = (hi_t - lo_t) / blocks or 1.0
    mids, meds = [], []
    for b in range(blocks):
        ys_b = [y for t, y in zip(ts, ys, strict=True) if lo_t + b * width <= t < lo_t + (b + 1) * width or
                (b == blocks - 1 and t == hi_t)]  # fmt: skip
        if ys_b:
            mids.append(lo_t + (b + 0.5) * width)
            meds.append(statistics.median(ys_b))
    if len(mids) < 3:
        return float("nan"), float("nan"), float("nan")
    sl = slope_per_hour(mids, meds)
    mt, my = statistics.fmean(mids), statistics.fmean(meds)
    den = sum((t - mt) ** 2 for t in mids) / 3600.0**2
    resid = [y - (my + sl * (t - mt) / 3600.0) for t, y in zip(mids, meds, strict=True)]
    se = math.sqrt(sum(r * r for r in resid) / (len(mids) - 2) / den)
    return sl, sl - T975_4 * se, sl + T975_4 * se


def block_slope_per_kstep(steps: list[float], ys: list[float]) -> tuple[float, float, float]:
    """``block_slope`` against the node's step instead of the clock: slope per 1,000 steps (3,600 units of x) with
    its interval, over blocks of equal step ranges."""
    return block_slope([3.6 * s for s in steps], ys)


def swing(ys: list[float]) -> tuple[float, float]:
    """Median and 90th percentile of the absolute change between consecutive samples: the allocator's swing."""
    d = sorted(abs(b - a) for a, b in itertools.pairwise(ys))
    return (statistics.median(d), d[int(0.9 * (len(d) - 1))]) if d else (float("nan"), float("nan"))


#: The laboratory node's steps an hour on 2 idle cores (32 prompts x 8 in about 2.5 s, ``docs/operations.md``).
LAB_STEPS_PER_H = 1440.0
MEASURES = ("rss_kstep", "heap", "fds", "threads", "dht_keys")
#: Measures bounded by ``--rss-slope-pct`` of their median per hour (``rss_kstep``: per hour at the lab's rate).
RELATIVE = ("rss", "rss_anon", "heap", "rss_kstep")
BOUNDS = {"fds": 4.0, "threads": 4.0}


def multiproc_verdict(
    samples: list[dict], judged: list[int], duration_s: float, rss_pct: float, keys: tuple[str, ...] = MEASURES
) -> tuple[list[str], str]:
    """The multi-process soak's table rows and ``PASS``, ``FAIL``, ``UNDECIDED`` or ``SHORT`` (``soak_multiproc``'s
    docstring), over the measures ``keys`` (a measure no sample carries, such as the heap of a run made before it
    was kept, reads n/a)."""
    half = samples[len(samples) // 2 :]
    rows, states = [], []
    for i in judged:
        ts = [s["t"] for s in half]
        row = [f"node{i}"]
        for key in keys:
            bound = BOUNDS.get(key)
            per_k, src = key == "rss_kstep", "rss_step" if key == "rss_kstep" else key
            if not any(src in s["nodes"][i] for s in half):  # a run before the measure was kept
                row.append("n/a")
                continue
            ys = [float(s["nodes"][i].get(src, 0)) for s in half]
            med = statistics.median(ys) if ys else 0.0
            b = bound if bound is not None else (rss_pct / 100 * med if key in RELATIVE else 0.10 * med + 20)
            b = b / (LAB_STEPS_PER_H / 1000) if per_k else b
            xs = [float(s["nodes"][i]["step"]) for s in half] if per_k else ts
            sl, lo, hi = (
                (block_slope_per_kstep if per_k else block_slope)(xs, ys) if len(ts) >= 3 else (float("nan"),) * 3
            )
            state = "ok" if hi <= b else ("FAIL" if lo > b else "undecided")
            states.append(state)
            unit, scale = {"heap": ("k", 1000)}.get(key, (" MB", 2**20) if "rss" in key else ("", 1))
            row.append(
                f"{med / scale:.0f}{unit}, {sl / scale:+.1f} [{lo / scale:+.1f}, {hi / scale:+.1f}]{unit}"
                f"{'/1,000 steps' if per_k else '/h'} "
                f"(bound {b / scale:.1f}) {state}"
            )
        rows.append("| " + " | ".join(row) + " |")
    if duration_s < 3600:
        return rows, "SHORT"
    return rows, "FAIL" if "FAIL" in states else ("UNDECIDED" if "undecided" in states else "PASS")
