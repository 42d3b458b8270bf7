"""B9 soak: does a node stay flat over a long run? Memory, open files, pools, caches and disk, sampled every N steps.

Two runs, one after the other, each in this process with the built-in tiny model and a small step (few prompts,
a small group, short completions, no held-out evaluation), so that thousands of steps fit on two shared cores:

* ``alone``: one node, no network (GRPO on its own rollouts; checkpoints every 100 steps, ``keep: 2``);
* ``swarm``: four nodes over one in-process memory network with the real channel, validator, sharded layout and
  SAPO sampler, stepping in turn. The network's clock advances ``--round-s`` per round, so protocol windows turn
  over every few rounds and every per-window structure (replay memory, index writer, shard reader cache, the
  network's own store) is created and pruned hundreds of times. Node 2 runs APRIL + VADE (their buffer and
  posteriors), node 3 runs MNPO side by side (its reference-logprob cache and score tables).

Sampled every ``--every`` steps: process RSS (the four swarm nodes share one process), open file descriptors,
threads, live Python objects, the SAPO pool, the channel's seen-digest map and followed-sender table, the
validator's replay memory, the shard reader's cache, the memory network's store, the node's peer table and
ingest counters, MNPO/VADE/APRIL state, the task caches, and the run dir's files (rollouts, metrics, checkpoints).

The verdict compares the first sample after the warm-up (step ``--every``) with the last, for every probe:
memory must stay within ``--rss-bound`` (default +15%) of that baseline, every cache within its stated cap, and
every file that grows must grow linearly by design (append-only logs: bytes per step reported).

    python benchmarks/systems/soak.py                    # 2,000 steps alone, then 2,000 rounds of the 4-node swarm
    python benchmarks/systems/soak.py --quick            # 30 steps each, sampled every 10 (a smoke run for the tests)

Writes ``benchmarks/results/soak.md`` (or ``--out``) and the raw samples next to it as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402
from node.config import RuntimeConfig  # noqa: E402
from protocol.validation import VERDICT_CACHE_ENTRIES  # noqa: E402

#: The small step: 2 prompts x 4 completions of at most 12 tokens, 2 own + 2 peers' groups per update.
STEP = {
    "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 12},
    "sapo": {"local_groups": 2, "external_groups": 2, "max_age_steps": 20},
    "eval": {"every_steps": None, "at_start": False, "at_end": False},
    "checkpoint": {"every": 100, "keep": 2},
    "model": {"threads": 1},
}


def node_config(swarm_id: str, extra: dict[str, Any] | None = None):
    from node.config import NodeConfig

    data: dict[str, Any] = json.loads(json.dumps(STEP))
    data["swarm_id"] = swarm_id
    for k, v in (extra or {}).items():
        data.setdefault(k, {}).update(v)
    return NodeConfig.model_validate(data)


def _len(obj: Any, *path: str) -> int | None:
    """``len`` of ``obj.a.b...``; None when the path does not exist (a feature that is off)."""
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    try:
        return len(obj)
    except TypeError:
        return None


def _nested(obj: Any, *path: str) -> int | None:
    """Total entries of a dict of containers at ``obj.a.b...`` (per-window maps)."""
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return sum(len(v) for v in obj.values())


def probe_node(node: Any) -> dict[str, int | None]:
    """Sizes of everything a node keeps that could grow with the number of steps (read by name, private ones
    included: a probe whose attribute no longer exists reads None and is left out of the report)."""
    ch = node.channel
    val = ch.validator if ch is not None else None
    tr = getattr(ch, "transport", None) if ch is not None else None
    inner = getattr(tr, "inner", tr)
    reader = getattr(inner, "reader", None)
    from node.rollout.planner import RolloutPlanner
    from node.seams import NoPhase

    mn = None if isinstance(node.phase, NoPhase) else node.phase
    plan = node.planner if isinstance(node.planner, RolloutPlanner) else None
    out: dict[str, int | None] = {
        "pool": _len(node, "pool"),
        "pool_sources": _len(node.pool, "_sources"),
        "peer_table": _len(node, "_peer_last_step"),
        "ingest_counter_keys": _len(node, "ingest_counts"),
        "totals_keys": _len(node, "totals"),
        "outbox": _len(node, "_outbox"),
        "tasks_items": _len(node.tasks, "_items"),
        "tasks_datasets": _len(node.tasks, "_datasets"),
        "node_tasks": _len(node, "_tasks"),
    }
    if ch is not None:
        out |= {
            "channel_seen": len(ch._seen),
            "channel_recent_senders": len(ch._recent_senders),
            "index_writer_windows": _len(ch.index_writer, "_digests"),
            "replay_windows": _len(val, "_seen"),
            "replay_entries": _nested(val, "_seen"),
            "quota_windows": _len(val, "_counts"),
            "verdict_cache": _len(val, "_verdicts"),
            "verdict_cache_windows": _len(val, "_verdict_windows"),
            "reader_cache_windows": _len(reader, "cache"),
            "reader_cache_records": _nested(reader, "cache") if reader is not None else None,
        }
    if mn is not None:
        out |= {
            "mnpo_prompts": _len(mn, "_prompts"),
            "mnpo_ref_cache": _len(mn, "_ref_cache"),
            "mnpo_pending_groups": _len(mn, "_pending_groups"),
        }
        for name in dir(mn):  # swarm.mnpo tables the phase owns (responses per window, peers' scores, versions)
            v = getattr(mn, name, None)
            for attr in ("_windows", "_peers", "_versions"):
                inner_v = getattr(v, attr, None)
                if isinstance(inner_v, dict) and not name.startswith("__"):
                    out[f"mnpo_{name}{attr}"] = len(inner_v)
    if plan is not None:
        out |= {
            "vade_posteriors": _len(plan, "posteriors", "posteriors"),
            "april_buffer": _len(plan, "buffer", "groups"),
        }
    return out


def probe_network(network: Any) -> dict[str, int]:
    return {
        "net_records": len(network._records),
        "net_peer_entries": len(network._peer_entries),
        "net_shards": len(network._shards),
        "net_window_keys": len(network._window_keys),
    }


def probe_process() -> dict[str, float]:
    import psutil

    p = psutil.Process()
    return {
        "rss_mb": p.memory_info().rss / 2**20,
        "open_fds": p.num_fds(),
        "threads": threading.active_count(),
        "py_objects": len(gc.get_objects()),
    }


def probe_disk(run_dir: Path) -> dict[str, int]:
    out = {"rollouts_bytes": 0, "metrics_bytes": 0, "checkpoint_bytes": 0, "checkpoint_files": 0, "other_bytes": 0}
    for p in run_dir.rglob("*"):
        if not p.is_file():
            continue
        size = p.stat().st_size
        if p.name.startswith("rollouts.jsonl"):
            out["rollouts_bytes"] += size
        elif p.name.startswith("metrics.jsonl"):
            out["metrics_bytes"] += size
        elif "checkpoints" in p.parts:
            out["checkpoint_bytes"] += size
            out["checkpoint_files"] += 1
        else:
            out["other_bytes"] += size
    return out


def _sum_probes(probes: list[dict[str, int | None]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pr in probes:
        for k, v in pr.items():
            if v is not None:
                out[k] = out.get(k, 0) + v
    return out


def sample(step: int, t0: float, nodes: list[Any], run_dir: Path, network: Any = None) -> dict[str, Any]:
    gc.collect()
    row: dict[str, Any] = {"step": step, "elapsed_s": round(time.perf_counter() - t0, 1)}
    row |= probe_process()
    row |= _sum_probes([probe_node(n) for n in nodes])
    if network is not None:
        row |= probe_network(network)
    row |= probe_disk(run_dir)
    return row


def _progress(label: str, step: int, total: int, t0: float, row: dict[str, Any]) -> None:
    el = time.perf_counter() - t0
    eta = el / max(step, 1) * (total - step)
    print(
        f"[soak {label}] step {step}/{total} ({100 * step / total:.0f}%), elapsed {el:.0f}s, ETA {eta:.0f}s, "
        f"rss {row['rss_mb']:.0f} MB, fds {row['open_fds']}, pool {row.get('pool')}",
        flush=True,
    )


async def run_alone(steps: int, every: int, run_dir: Path) -> list[dict[str, Any]]:
    from node.runtime import Node

    cfg = node_config("soak-alone")
    node = await Node.create(cfg, run_dir, resume=False, live=False)
    rows = []
    t0 = time.perf_counter()
    try:
        rows.append(sample(0, t0, [node], run_dir))
        while node.step < steps:
            await node.step_once()
            if node.step % every == 0:
                rows.append(sample(node.step, t0, [node], run_dir))
                _progress("alone", node.step, steps, t0, rows[-1])
    finally:
        await node.close()
    return rows


async def run_swarm(steps: int, every: int, run_dir: Path, round_s: float, nodes_n: int = 4) -> list[dict[str, Any]]:
    from node.runtime import Node, build_parts
    from protocol.channel import Channel
    from protocol.transport.memory import MemoryNetwork, MemoryTransport
    from protocol.validation import RecordValidator
    from sim.inprocess import SimClock, derived_identity

    clock = SimClock(1_700_000_000.0)
    extras: list[dict[str, Any]] = [
        {},
        {},
        {"april": {"enabled": True}, "vade": {"enabled": True, "max_tracked": VADE_TRACKED}},
        {"mnpo": {"schedule": "side_by_side", "prompts_per_window": 2, "responses_per_prompt": 2}},
    ]
    cfgs = [node_config("soak-swarm", extras[i % len(extras)]) for i in range(nodes_n)]
    pcfg = cfgs[0].protocol
    network = MemoryNetwork(seed=0, clock=clock, retention_windows=max(8, pcfg.max_past_windows + 2))
    nodes = []
    try:
        for i, cfg in enumerate(cfgs):
            ident = derived_identity(0, "soak", i)
            transport = MemoryTransport(network, ident.peer_id, protocol=pcfg, swarm=cfg.swarm_id, seed=i)
            validator = RecordValidator.from_config(cfg.swarm_id, pcfg, clock=clock)
            channel = await Channel.create(
                ident, transport, validator, fetch_past_windows=pcfg.fetch_past_windows, timeout_s=pcfg.timeout_s
            )
            parts = await asyncio.to_thread(build_parts, cfg)
            node_dir = run_dir / f"node{i}"
            nodes.append(
                await Node.create(
                    cfg, node_dir, channel=channel, parts=parts, name=ident.peer_id, resume=False, live=False
                )
            )
        rows = []
        t0 = time.perf_counter()
        rows.append(sample(0, t0, nodes, run_dir, network))
        for r in range(1, steps + 1):
            clock.now += round_s
            for node in nodes:
                await node.step_once()
            if r % every == 0:
                rows.append(sample(r, t0, nodes, run_dir, network))
                _progress("swarm", r, steps, t0, rows[-1])
        return rows
    finally:
        for node in nodes:
            await node.close()


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


def render(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
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
        f"Step: {json.dumps(STEP)}. Swarm: 4 nodes, one process, memory network; network clock +{args.round_s}s "
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


def save_rss_plot(path: Path, results: dict[str, dict[str, Any]]) -> None:
    """RSS over steps, one line per run (the picture of a leak: a slope that does not bend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, res in results.items():
        ax.plot([r["step"] for r in res["rows"]], [r["rss_mb"] for r in res["rows"]], label=label)
    ax.set_xlabel("step (swarm: round)")
    ax.set_ylabel("process RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000, help="steps of the lone node and rounds of the swarm")
    ap.add_argument("--every", type=int, default=100, help="sample every N steps (the first sample is the baseline)")
    ap.add_argument("--only", choices=["alone", "swarm"], default=None)
    ap.add_argument("--round-s", type=float, default=3.0, help="network clock advance per swarm round (seconds)")
    ap.add_argument("--rss-bound", type=float, default=0.15, help="allowed RSS growth over the baseline (fraction)")
    ap.add_argument(
        "--slope-bound", type=float, default=5.0, help="allowed RSS slope over the second half (MB per 1000 steps)"
    )
    ap.add_argument("--quick", action="store_true", help="30 steps each, sampled every 10 (smoke run, not enforced)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep run dirs here (default: a temporary dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak.md")
    ap.add_argument("--from-json", type=Path, default=None, help="re-render a report from a run's saved samples")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.every = 30, 10
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    results: dict[str, dict[str, Any]] = {}
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        results = {label: _judged(label, rows, rows[-1]["elapsed_s"], args) for label, rows in saved.items()}
        return _report(results, args)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = args.workdir or Path(tmp)
        for label in ("alone", "swarm"):
            if args.only not in (None, label):
                continue
            t0 = time.perf_counter()
            if label == "alone":
                rows = asyncio.run(run_alone(args.steps, args.every, work / "alone"))
            else:
                rows = asyncio.run(run_swarm(args.steps, args.every, work / "swarm", args.round_s))
            results[label] = _judged(label, rows, time.perf_counter() - t0, args)
    # One run of --only: the other run's samples saved by an earlier run (same --out) stay in the report.
    saved_json = args.out.with_suffix(".json")
    if args.only is not None and saved_json.exists():
        for label, rows in json.loads(saved_json.read_text()).items():
            if label not in results:
                results[label] = _judged(label, rows, rows[-1]["elapsed_s"], args) | {"earlier": True}
        results = dict(sorted(results.items()))  # alone, then swarm
    return _report(results, args)


def _judged(label: str, rows: list[dict[str, Any]], wall_s: float, args: argparse.Namespace) -> dict[str, Any]:
    nodes = 1 if label == "alone" else 4
    return {"rows": rows, "wall_s": wall_s, "verdict": verdict(rows, args.rss_bound, nodes, args.slope_bound)}


def _report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> int:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(results, args))
    args.out.with_suffix(".json").write_text(json.dumps({k: v["rows"] for k, v in results.items()}, indent=1))
    save_rss_plot(args.out.with_suffix(".png"), results)
    print(args.out.read_text())
    bad = [f"{label}:{v['probe']}" for label, res in results.items() for v in res["verdict"] if not v["ok"]]
    if bad:
        print("not flat or over a cap: " + ", ".join(bad), file=sys.stderr)
    # A quick run is a smoke test of the machinery: its caches are still warming up, so verdicts are not enforced.
    return 1 if bad and not args.quick else 0


if __name__ == "__main__":
    raise SystemExit(main())
