"""Shared by the two B1 gossip benchmarks (``b1_gossip.py`` over hivemind, ``b1_gossip_libp2p.py`` over libp2p).

The synthetic records, the coordinator that starts one worker process per peer (``launch`` starts each, and
measures its memory), the sweep over swarm sizes and repeats and the command line (``gossip_summary`` has the
statistics and the table). Each script keeps its own workers.

Imports neither hivemind nor libp2p (they cannot share a process: duplicate protobuf symbols), so either script
can use it; the workers import their transport inside their own process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.systems.harness import ROOT, stop_process
from benchmarks.systems.launch import Forked, Zygote

SWARM = "b1"
COMPLETIONS = 64
WORDS = ("the", "answer", "is", "so", "we", "add", "then", "sum", "carry", "step", "check", "result", "of", "and")
MEDIAN_KEYS = (
    "pairs_delivered",
    "p50_s",
    "p95_s",
    "records_per_s",
    "record_kb",
    "bytes_per_completion",
    "codec_share",
    "encode_share",
    "check_share",
    "guard_share",
    "codec_cpu_share",
    "encode_cpu_share",
    "check_cpu_share",
    "guard_cpu_share",
    "pair_p50_s",
    "pair_p95_s",
    "rss_mb_median",
    "rss_mb_max",
    "pss_mb_median",
    "poll_mean_s",
    "publish_mean_s",
)


# -- records ------------------------------------------------------------------------------------------------


def make_batch(record_kb: float, step: int, rng: random.Random):
    """A RolloutBatch with one group of 64 completions whose encoded size is about ``record_kb`` KB."""
    from protocol.types import Completion, Group, RolloutBatch, TaskRef

    chars = max(16, int(record_kb * 1024 / COMPLETIONS) - 40)
    comps = []
    for i in range(COMPLETIONS):
        text = " ".join(rng.choice(WORDS) for _ in range(chars // 4 + 1))[:chars]
        comps.append(
            Completion(
                text=text,
                n_tokens=chars // 4,
                finish_reason="stop" if i % 7 else "length",
                policy_version=step,
                logprob_mean=-rng.random(),
                reward_hint=float(i % 2),
            )
        )
    task = TaskRef("chain_sum", {"min_terms": 2, "max_terms": 4}, seed=step, index=rng.randrange(10_000))
    return RolloutBatch(
        model="builtin:tiny", policy_version=step, tokenizer="tok-b1", groups=(Group(task, tuple(comps)),)
    )


def peer_logs() -> tuple[dict[str, float], dict[str, float], list[int]]:
    """A worker's empty logs: when it first saw each record, when it published each (by record id), and the sizes
    of what it published."""
    return {}, {}, []


async def fetch_timed(
    transport: Any, window_seconds: int, timing: dict[str, float], *, tolerate: bool = False
) -> tuple[list[bytes], float]:
    """One poll of the last three windows, its wall time added to ``timing["fetch"]`` and counted in
    ``timing["polls"]``; the records and when they came. ``tolerate``: a failed poll prints its error and reads as
    no records (a timed-out poll is part of what is measured; the next poll retries)."""
    from protocol.records import window_of

    w = window_of(time.time(), window_seconds)
    t1 = time.time()
    try:
        datas = await transport.fetch_recent([w - 2, w - 1, w])
    except Exception as e:
        if not tolerate:
            raise
        print(f"fetch failed: {e!r}", file=sys.stderr, flush=True)
        datas = []
    now = time.time()
    timing["fetch"] += now - t1
    timing["polls"] += 1
    return datas, now


# -- coordinator ----------------------------------------------------------------------------------------------


def _stop(proc: subprocess.Popen | Forked) -> None:
    stop_process(proc, grace_s=15)
    if isinstance(proc, Forked):
        proc.close()


def run_swarm(
    script: str, mode: str, peers: int, opts: argparse.Namespace, workdir: Path, *, mesh_wait_s: float = 0.0
) -> list[dict]:
    """Start ``peers`` worker processes (``script --worker ARGS``, or forked by a zygote with ``--launch fork``),
    let them publish and poll; their result files.

    ``mesh_wait_s``: pause between the last READY and GO (a gossip mesh needs a few heartbeats to form)."""
    procs: list[subprocess.Popen | Forked] = []
    outs: list[Path] = []
    logs = []
    boot = None
    zygote = Zygote(script, workdir / f"{mode}_{peers}_zygote.log") if opts.launch == "fork" else None
    zygote_pss = 0
    try:
        for i in range(peers):
            out = workdir / f"{mode}_{peers}_{i}.json"
            out.unlink(missing_ok=True)
            outs.append(out)
            wargs = {
                "mode": mode,
                "index": i,
                "peers": peers,
                "bootstrap": boot,
                "steps": opts.steps,
                "interval": opts.interval,
                "record_kb": opts.record_kb,
                "poll_s": opts.poll_s,
                "settle_s": opts.settle_s,
                "window_seconds": opts.window_seconds,
                "leave_after": getattr(opts, "boot_leaves_after", 0),
                "discovery": getattr(opts, "discovery", None),
                "inline_max_bytes": getattr(opts, "inline_max_bytes", None),
                "poll_senders": getattr(opts, "poll_senders", None),
                "poll_records": getattr(opts, "poll_records", None),
                "lookup_beam": getattr(opts, "lookup_beam", None),
                "outfile": str(out),
            }
            log = (workdir / f"{mode}_{peers}_{i}.log").open("w")
            logs.append(log)
            proc: subprocess.Popen | Forked
            if zygote is not None:
                proc = zygote.spawn(wargs, log)
            else:
                proc = subprocess.Popen(
                    [sys.executable, script, "--worker", json.dumps(wargs)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    cwd=ROOT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            procs.append(proc)
            if i == 0:
                line = proc.stdout.readline()
                if not line.startswith("READY"):
                    raise RuntimeError(f"peer 0 did not start; see {log.name}")
                boot = line.split()[1]
        for i, proc in enumerate(procs[1:], 1):
            line = proc.stdout.readline()
            if not line.startswith("READY"):
                raise RuntimeError(f"peer {i} did not start; see {logs[i].name}")
        if mesh_wait_s:
            time.sleep(mesh_wait_s)
        t0 = time.time() + 1.0
        for proc in procs:
            proc.stdin.write(f"GO {t0}\n")
            proc.stdin.flush()
        limit = opts.steps * opts.interval + opts.settle_s + 60
        while zygote is not None and time.time() < t0 + limit and all(p.poll() is None for p in procs):
            # the zygote's share of the pages it shares with the peers, measured (like theirs) while they all run
            zygote_pss = zygote.pss_bytes()
            time.sleep(1.0)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(1.0, t0 + limit - time.time()))
    finally:
        for proc in procs:
            _stop(proc)
        for log in logs:
            log.close()
        if zygote is not None:
            zygote.close()
    results = [json.loads(o.read_text()) for o in outs if o.exists()]
    for r in results:
        r["zygote_pss_bytes"] = zygote_pss
    return results


def sweep(
    opts: argparse.Namespace, run_one: Callable[[str, int, argparse.Namespace, Path], dict], *, tmp_prefix: str
) -> list[tuple[int, dict[str, list[dict]]]]:
    """For each swarm size in ``opts.peers``: ``opts.repeats`` runs of every mode (order alternating per repeat),
    each ``run_one(mode, peers, run_opts, workdir)``; the runs by mode."""
    out = []
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as tmp:
        for peers in [int(p) for p in opts.peers.split(",")]:
            interval = opts.interval or 5.0 + peers / 2
            per_mode: dict[str, list[dict]] = {m: [] for m in opts.modes.split(",")}
            for rep in range(opts.repeats):
                modes = list(per_mode) if rep % 2 == 0 else list(reversed(per_mode))
                for mode in modes:
                    run_opts = argparse.Namespace(**{**vars(opts), "interval": interval})
                    res = run_one(mode, peers, run_opts, Path(tmp))
                    print(json.dumps(res), file=sys.stderr, flush=True)
                    per_mode[mode].append(res)
            out.append((peers, per_mode))
    return out


# -- command line ---------------------------------------------------------------------------------------------


def parser(doc: str, *, poll_s: float, modes: str) -> argparse.ArgumentParser:
    """The options both scripts take; ``poll_s`` and ``modes`` are their defaults."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--zygote", type=int, help=argparse.SUPPRESS)
    ap.add_argument(
        "--launch",
        choices=["exec", "fork"],
        default="exec",
        help="exec: each peer a fresh interpreter (default); fork: peers forked from one process that imported "
        "the transport once, sharing those pages (lets 64 hivemind peers fit in memory)",
    )
    ap.add_argument("--peers", default="8,32", help="comma-separated swarm sizes (default 8,32)")
    ap.add_argument("--steps", type=int, default=3, help="records each peer publishes")
    ap.add_argument("--interval", type=float, default=0.0, help="seconds between steps (default: 5 + peers/2)")
    ap.add_argument("--record-kb", type=float, default=150.0, help="approximate record size in KB")
    ap.add_argument("--poll-s", type=float, default=poll_s, help="seconds between polls of a peer")
    ap.add_argument("--settle-s", type=float, default=45.0, help="seconds to keep polling after the last step")
    ap.add_argument("--window-seconds", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=modes)
    ap.add_argument("--quick", action="store_true", help="3 peers, 2 small records each, one repeat")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return ap


def apply_quick(opts: argparse.Namespace) -> None:
    """``--quick``: 3 peers, 2 records of ~50 KB each, one repeat (what the tests run)."""
    if opts.quick:
        opts.peers, opts.steps, opts.record_kb, opts.repeats, opts.settle_s = "3", 2, 50.0, 1, 20.0
        opts.interval = opts.interval or 2.0
