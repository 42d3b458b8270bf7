"""Multi-process soak over hivemind: do real node processes (and their p2pd daemons) stay flat for hours?

``--nodes`` (4) real ``swarm-node join`` processes on 127.0.0.1 with the built-in tiny model, small steps and one
torch thread each, fixed ports and identities (a restarted node keeps its address). Node 0 bootstraps the others.
The last node is restarted (SIGTERM, checkpoint, start again: it resumes) every ``--restart-every-s`` (15 min),
so the others live through a peer's churn the whole time; nodes 0 .. n-2 are never restarted and are the ones
judged.

Sampled every ``--sample-s``: per node, RSS of the node process and of its p2pd child (and their sum), open file
descriptors and threads (both together), and from its ``metrics.jsonl`` the DHT keys it stores and its step.

Verdict over the second half of the run, per judged node, by least-squares slope per hour:
RSS (node + p2pd) <= ``--rss-slope-pct`` (2%) of its median per hour, open fds <= 4/h, threads <= 4/h, DHT keys <=
10% of their median per hour (plus 20 keys: a handful of windows come and go). A run shorter than an hour is
reported but marked too short to judge a slope: noise of a few minutes swamps a slow leak.

    python benchmarks/soak_multiproc.py --duration-s 7200                         # the real soak (2 h)
    python benchmarks/soak_multiproc.py --duration-s 720 --restart-every-s 180 --out /tmp/s.md   # a 12-min check

Writes ``benchmarks/results/soak_multiproc.md`` (or ``--out``) and the samples beside it as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
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


def node_cmd(i: int, run_dir: Path, boot: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(run_dir), "--max-steps", "1000000"]
    cmd += ["--host", "127.0.0.1", "--port", str(BASE_PORT + i), *SMALL]
    return cmd + (["--peers", boot] if boot else [])


def start(i: int, work: Path, boot: str | None) -> subprocess.Popen:
    d = work / f"node{i}"
    d.mkdir(parents=True, exist_ok=True)
    log = (d / "stdout.log").open("a")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        node_cmd(i, d, boot), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
    )


def stop(p: subprocess.Popen, grace_s: float = 60) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)


def probe(p: subprocess.Popen, run_dir: Path) -> dict:
    """RSS of the node and its p2pd, fds and threads of both, and the last metrics line's DHT keys and step."""
    out = {"rss_node": 0, "rss_p2pd": 0, "fds": 0, "threads": 0}
    try:
        proc = psutil.Process(p.pid)
        for q in [proc, *proc.children(recursive=True)]:
            with_p2pd = "p2pd" in q.name()
            out["rss_p2pd" if with_p2pd else "rss_node"] += q.memory_info().rss
            out["fds"] += q.num_fds()
            out["threads"] += q.num_threads()
    except psutil.NoSuchProcess:
        pass
    out["rss"] = out["rss_node"] + out["rss_p2pd"]
    try:
        last = (run_dir / "metrics.jsonl").read_text().splitlines()[-1]
        m = json.loads(last)
        out["dht_keys"], out["step"] = m.get("dht_storage_keys", 0), m.get("step", 0)
    except (OSError, IndexError, ValueError):
        out["dht_keys"], out["step"] = 0, 0
    return out


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    if len(ts) < 3:
        return float("nan")
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    den = sum((t - mt) ** 2 for t in ts)
    return 3600.0 * sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / den if den else float("nan")


def verdict(samples: list[dict], judged: list[int], duration_s: float, rss_pct: float) -> tuple[list[str], bool]:
    half = samples[len(samples) // 2 :]
    rows, ok = [], True
    for i in judged:
        ts = [s["t"] for s in half]
        row = [f"node{i}"]
        for key, bound in (("rss", None), ("fds", 4.0), ("threads", 4.0), ("dht_keys", None)):
            ys = [float(s["nodes"][i][key]) for s in half]
            med = statistics.median(ys) if ys else 0.0
            b = bound if bound is not None else (rss_pct / 100 * med if key == "rss" else 0.10 * med + 20)
            sl = slope_per_hour(ts, ys)
            good = sl <= b
            ok &= good
            if key == "rss":
                row.append(
                    f"{med / 2**20:.0f} MB, {sl / 2**20:+.1f} MB/h (bound {b / 2**20:.1f}) {'ok' if good else 'FAIL'}"
                )
            else:
                row.append(f"{med:.0f}, {sl:+.1f}/h (bound {b:.1f}) {'ok' if good else 'FAIL'}")
        rows.append("| " + " | ".join(row) + " |")
    return rows, ok and duration_s >= 3600


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--duration-s", type=float, default=7200)
    ap.add_argument("--restart-every-s", type=float, default=900)
    ap.add_argument("--sample-s", type=float, default=30)
    ap.add_argument("--rss-slope-pct", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak_multiproc.md")
    opts = ap.parse_args()
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
    duration = samples[-1]["t"] if samples else 0.0
    judged = list(range(opts.nodes - 1))
    rows, passed = verdict(samples, judged, duration, opts.rss_slope_pct)
    steps = [s["step"] for s in samples[-1]["nodes"]] if samples else []
    cmd = "python benchmarks/soak_multiproc.py " + " ".join(sys.argv[1:])
    text = [
        "# Multi-process soak over hivemind",
        "",
        f"{opts.nodes} `swarm-node join` processes on 127.0.0.1 (tiny model, small steps, one torch thread), "
        f"{duration / 60:.1f} min, node{opts.nodes - 1} restarted every {opts.restart_every_s:g} s ({restarts} "
        f"restarts); sampled every {opts.sample_s:g} s; steps at the end: {steps}. Slopes per hour over the second "
        "half, nodes never restarted (RSS = node process + its p2pd).",
        "",
        "| node | RSS median, slope | open fds | threads | DHT keys stored |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Verdict: {'PASS' if passed else ('no verdict: shorter than an hour' if duration < 3600 else 'FAIL')}.",
        "",
        f"Command: `{cmd}`",
    ]
    opts.out.write_text("\n".join(text) + "\n")
    opts.out.with_suffix(".json").write_text(json.dumps(samples))
    print("\n".join(text))


if __name__ == "__main__":
    main()
