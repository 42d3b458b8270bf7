"""B9 soak's probes (``soak.py`` runs them): what one sample of a run holds -- the process's memory, files and
threads, every cache and pool of each node and of the memory network, and the run dir's files.

Reads the objects it is given and never changes them; knows nothing about the verdict or the report.
"""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path
from typing import Any


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


def progress(label: str, step: int, total: int, t0: float, row: dict[str, Any]) -> None:
    """One line on stdout: how far a run is, its ETA, and its RSS, open files and pool at ``row``."""
    el = time.perf_counter() - t0
    eta = el / max(step, 1) * (total - step)
    print(
        f"[soak {label}] step {step}/{total} ({100 * step / total:.0f}%), elapsed {el:.0f}s, ETA {eta:.0f}s, "
        f"rss {row['rss_mb']:.0f} MB, fds {row['open_fds']}, pool {row.get('pool')}",
        flush=True,
    )
