"""Multi-process soak over hivemind: do real node processes (and their p2pd daemons) stay flat for hours?

``--nodes`` (4) real ``swarm-node join`` processes on 127.0.0.1 with the built-in tiny model, small steps and one
torch thread each, fixed ports and identities (a restarted node keeps its address). Node 0 bootstraps the others.
The last node is restarted (SIGTERM, checkpoint, start again: it resumes) every ``--restart-every-s`` (15 min),
so the others live through a peer's churn the whole time; nodes 0 .. n-2 are never restarted and are the ones
judged.

Sampled every ``--sample-s``: per node, RSS of the node process and of its p2pd child (and their sum), open file
descriptors and threads (both together), and from its ``metrics.jsonl`` the DHT keys it stores, its step and its
Python heap (``py_heap_blocks``: pymalloc blocks in use).

Verdict over the second half of the run, per judged node, by the slope per hour of the medians of six equal time
blocks (least squares, with its 95% t-interval, 4 degrees of freedom): bounds RSS (node + p2pd) ``--rss-slope-pct``
(2%) of its median per hour, open fds 4/h, threads 4/h, DHT keys 10% of their median per hour (plus 20 keys: a
handful of windows come and go). A measure passes when the interval's upper end is within its bound and fails when
its lower end is above it; between the two the run cannot tell, and says so (``UNDECIDED``: run longer). A run
shorter than an hour is reported but not judged. (Revised after the first 2-hour run, whose RSS moved 13-86 MB
between 30-s samples: one least-squares slope over every sample judged that noise, so that run's FAIL, by the older
rule, is kept in its results with the reading.)

Python heap (added 2026-11-28 before the third run, after two runs of 2 and 2.5 hours left RSS UNDECIDED: the
allocator's caching swings RSS by tens of MB, so a 2.5-hour run cannot bound its slope near 2%/h): the node's
pymalloc blocks in use, judged by the same rule, bound 2% of its median per hour. It is what a leak of the node's
own Python objects (pool entries, records, peers, futures) grows, step for step; it does not see native memory
(torch, p2pd), which RSS still bounds. The run's verdict needs every measure, as before; the heap's own verdict is
reported beside it.

Anonymous RSS (added 2026-11-29 before the fifth run, after the fourth left RSS UNDECIDED on one node while the
heap passed everywhere): RSS less the file-backed pages (``memory_info().shared``: shared libraries, page cache),
which the kernel drops and faults back in under other work's memory pressure. Reported with its slope by the same
rule, not part of the verdict, which stays as registered: it tells whether the RSS swings are native memory the
node holds or pages the kernel moves.

Settled RSS per 1,000 steps (registered 2026-11-29 before the sixth run, issue 70, after five runs left RSS per
hour UNDECIDED). The swing is the step's own working set: a node's anonymous RSS, read every 0.25 s, rises some
80 MB through each step and falls back at the update's ``malloc_trim``, so a sample at any moment catches a random
phase (capping glibc's arenas did not narrow it, ``soak_multiproc_alloc.md``). The node now writes its RSS between
steps, after that trim, into ``metrics.jsonl`` (``rss_mb``); the settled RSS is that plus its p2pd's. The verdict
judges settled RSS by the slope of its block medians against the node's own step, bound ``--rss-slope-pct`` of its
median per hour at the laboratory node's step rate (``LAB_STEPS_PER_H``: 2.5 s a step, ``docs/operations.md``),
1.39% of the median per 1,000 steps: what a volunteer's node would gain an hour if it leaked per step. RSS per hour
(sampled at any moment, as before) is reported beside it, with the swing (median and 90th percentile of the change
between consecutive samples) of anonymous and of settled RSS and each judged node's steps an hour. ``--set``
passes settings to every node (the allocator's, ``runtime.malloc_arena_max`` and ``runtime.malloc_trim_every``, for
comparisons); ``--base-port`` lets runs share a machine.

    python benchmarks/systems/soak_multiproc.py --duration-s 7200                 # the real soak (2 h)
    python benchmarks/systems/soak_multiproc.py --duration-s 720 --restart-every-s 180 --out /tmp/s.md  # 12 min
    python benchmarks/systems/soak_multiproc.py --duration-s 9000 --autogroup-nice 15  # beside other work

Writes ``benchmarks/results/soak_multiproc.md`` (or ``--out``) and the samples beside it as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems.harness import stop_process  # noqa: E402
from benchmarks.systems.soak_verdict import BLOCKS, swing  # noqa: E402
from benchmarks.systems.soak_verdict import multiproc_verdict as verdict  # noqa: E402

BASE_PORT = 34700
SMALL = [
    "--set", "rollout.prompts_per_step=4",
    "--set", "rollout.group_size=4",
    "--set", "sapo.local_groups=2",
    "--set", "sapo.external_groups=2",
    "--set", "runtime.poll_interval_s=2",
    "--set", "eval.items_per_family=4",
    "--set", "model.threads=1",
]  # fmt: skip


#: ``--set``: more node settings, each a ``--set KEY=VALUE`` of ``swarm-node join``.
EXTRA: list[str] = []


def node_cmd(i: int, run_dir: Path, boot: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(run_dir), "--max-steps", "1000000"]
    cmd += ["--host", "127.0.0.1", "--port", str(BASE_PORT + i), "--config", "tiny", *SMALL]
    cmd += [a for kv in EXTRA for a in ("--set", kv)]
    return cmd + (["--peers", boot] if boot else [])


#: ``--autogroup-nice``: the scheduler priority of every node's session (set at start, so a run keeps one regime).
AUTOGROUP_NICE: int | None = None


def _lower_priority() -> None:
    """In the node's new session (``start_new_session``): the kernel schedules a session as one group, so a plain
    ``nice`` does not hold a node back against other sessions; the group's own nice does."""
    if AUTOGROUP_NICE is not None:
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(str(AUTOGROUP_NICE))


def start(i: int, work: Path, boot: str | None) -> subprocess.Popen:
    d = work / f"node{i}"
    d.mkdir(parents=True, exist_ok=True)
    log = (d / "stdout.log").open("a")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        node_cmd(i, d, boot),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=_lower_priority if AUTOGROUP_NICE is not None else None,
    )


def stop(p: subprocess.Popen, grace_s: float = 60) -> None:
    stop_process(p, grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)


def probe(p: subprocess.Popen, run_dir: Path) -> dict:
    """RSS of the node and its p2pd, fds and threads of both, and the last metrics line's DHT keys, step and
    Python heap blocks."""
    out = {"rss_node": 0, "rss_p2pd": 0, "rss_anon": 0, "fds": 0, "threads": 0}
    try:
        proc = psutil.Process(p.pid)
        for q in [proc, *proc.children(recursive=True)]:
            with_p2pd = "p2pd" in q.name()
            mem = q.memory_info()
            out["rss_p2pd" if with_p2pd else "rss_node"] += mem.rss
            out["rss_anon"] += mem.rss - mem.shared  # less file-backed pages (libraries, page cache)
            out["fds"] += q.num_fds()
            out["threads"] += q.num_threads()
    except psutil.NoSuchProcess:
        pass
    out["rss"] = out["rss_node"] + out["rss_p2pd"]
    try:
        last = (run_dir / "metrics.jsonl").read_text().splitlines()[-1]
        m = json.loads(last)
        out["dht_keys"], out["step"] = m.get("dht_storage_keys", 0), m.get("step", 0)
        out["heap"] = m.get("py_heap_blocks", 0)
        if "rss_mb" in m:  # the node's RSS between steps, after its trim, and its p2pd's now
            out["rss_step"] = int(m["rss_mb"] * 2**20) + out["rss_p2pd"]
    except (OSError, IndexError, ValueError):
        out["dht_keys"], out["step"], out["heap"] = 0, 0, 0
    return out


VERDICTS = {
    "PASS": "PASS",
    "FAIL": "FAIL",
    "UNDECIDED": "UNDECIDED: some slope's interval straddles its bound; run longer",
    "SHORT": "no verdict: shorter than an hour",
}


def run(opts: argparse.Namespace) -> tuple[list[dict], int]:
    """Start the nodes, sample them every ``--sample-s`` for ``--duration-s``, restart the last on schedule;
    the samples and the number of restarts."""
    work = Path(tempfile.mkdtemp(prefix="soak-mp-"))
    procs: list[subprocess.Popen] = []
    samples: list[dict] = []
    restarts = 0
    t0 = time.time()
    try:
        procs.append(start(0, work, None))
        boot = None
        deadline = time.time() + 300
        while boot is None and time.time() < deadline:
            text = (work / "node0" / "stdout.log").read_text() if (work / "node0" / "stdout.log").exists() else ""
            for line in text.splitlines():
                if line.startswith("listening on /ip4/127.0.0.1/"):
                    boot = line.split()[-1]
            if procs[0].poll() is not None:
                raise SystemExit(f"node0 exited; see {work / 'node0' / 'stdout.log'}")
            time.sleep(0.5)
        if boot is None:
            raise SystemExit("node0 printed no address")
        for i in range(1, opts.nodes):
            procs.append(start(i, work, boot))
        last_restart = time.time()
        t0 = time.time()
        while time.time() - t0 < opts.duration_s:
            time.sleep(opts.sample_s)
            if time.time() - last_restart >= opts.restart_every_s:
                k = opts.nodes - 1
                stop(procs[k])
                procs[k] = start(k, work, boot)
                restarts += 1
                last_restart = time.time()
            sample = {"t": time.time() - t0, "nodes": [probe(p, work / f"node{i}") for i, p in enumerate(procs)]}
            samples.append(sample)
            print(json.dumps(sample), flush=True)
            dead = [i for i, p in enumerate(procs) if p.poll() is not None]
            if dead:
                raise SystemExit(f"node(s) {dead} exited; see {work}")
    finally:
        for p in procs:
            stop(p)
    return samples, restarts


def main() -> None:
    global AUTOGROUP_NICE, BASE_PORT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--duration-s", type=float, default=7200)
    ap.add_argument("--restart-every-s", type=float, default=900)
    ap.add_argument("--sample-s", type=float, default=30)
    ap.add_argument("--rss-slope-pct", type=float, default=2.0)
    ap.add_argument(
        "--autogroup-nice", type=int, default=None, help="run the nodes at this session priority (beside other work)"
    )
    ap.add_argument("--base-port", type=int, default=BASE_PORT, help="node i listens on this + i")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a node setting (repeatable)")
    ap.add_argument("--rejudge", type=Path, help="judge the samples (JSON) of an earlier run instead of running")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak_multiproc.md")
    opts = ap.parse_args()
    AUTOGROUP_NICE, BASE_PORT, EXTRA[:] = opts.autogroup_nice, opts.base_port, opts.set
    if opts.rejudge is not None:  # an earlier run's samples: its restarts follow from the schedule
        samples = json.loads(opts.rejudge.read_text())
        restarts = int(samples[-1]["t"] // opts.restart_every_s) if samples else 0
    else:
        samples, restarts = run(opts)
    duration = samples[-1]["t"] if samples else 0.0
    judged = list(range(opts.nodes - 1))
    rows, outcome = verdict(samples, judged, duration, opts.rss_slope_pct)
    heap_outcome = verdict(samples, judged, duration, opts.rss_slope_pct, keys=("heap",))[1]
    anon_rows, anon_outcome = verdict(samples, judged, duration, opts.rss_slope_pct, keys=("rss_anon",))
    hour_rows, hour_outcome = verdict(samples, judged, duration, opts.rss_slope_pct, keys=("rss",))
    half, mb = samples[len(samples) // 2 :], 2**20
    rates = [3600 * (half[-1]["nodes"][i]["step"] - half[0]["nodes"][i]["step"]) / (half[-1]["t"] - half[0]["t"])
             for i in judged] if len(half) > 1 else []  # fmt: skip
    swings = [swing([s["nodes"][i][k] / mb for s in half if k in s["nodes"][i]]) for k in ("rss_anon", "rss_step")
              for i in judged]  # fmt: skip
    steps = [s["step"] for s in samples[-1]["nodes"]] if samples else []
    cmd = "python benchmarks/systems/soak_multiproc.py " + " ".join(sys.argv[1:])
    lines = [
        "# Multi-process soak over hivemind",
        "",
        f"{opts.nodes} `swarm-node join` processes on 127.0.0.1 (tiny model, small steps, one torch thread), "
        f"{duration / 60:.1f} min, node{opts.nodes - 1} restarted every {opts.restart_every_s:g} s ({restarts} "
        f"restarts); sampled every {opts.sample_s:g} s; steps at the end: {steps}. Slopes over the second half "
        f"(per hour; settled RSS per 1,000 steps) with their 95% intervals (medians of {BLOCKS} time blocks), "
        "nodes never restarted (RSS = node process + its p2pd; settled: the node's between steps).",
        "",
        "| node | settled RSS median, slope per 1,000 steps | Python heap blocks | open fds | threads "
        "| DHT keys stored |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Verdict: {VERDICTS[outcome]}. The Python heap's own verdict: {VERDICTS[heap_outcome]}.",
        "",
        "Anonymous RSS (RSS less file-backed pages, node + p2pd), reported, not judged: "
        + "; ".join(r.strip("| ").replace(" | ", ": ") for r in anon_rows)
        + f" ({VERDICTS[anon_outcome]} by the same rule).",
        "",
        "RSS per hour, reported, not judged: "
        + "; ".join(r.strip("| ").replace(" | ", ": ") for r in hour_rows)
        + f" ({VERDICTS[hour_outcome]} by the same rule).",
        "",
        "Second half, judged nodes: steps an hour " + ", ".join(f"{r:.0f}" for r in rates) + "; change between "
        "consecutive samples, median / 90th percentile (MB), of anonymous RSS "
        + ", ".join(f"{a:.1f} / {b:.1f}" for a, b in swings[: len(judged)])
        + "; of settled RSS "
        + ", ".join(f"{a:.1f} / {b:.1f}" for a, b in swings[len(judged) :])
        + ".",
        "",
        f"Node settings: {' '.join(opts.set) or 'defaults'}.",
        "",
        f"Command: `{cmd}`",
    ]
    opts.out.write_text("\n".join(lines) + "\n")
    opts.out.with_suffix(".json").write_text(json.dumps(samples))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
