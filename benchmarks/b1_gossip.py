"""B1 gossip: how fast signed rollout records spread over the real hivemind transport, against raw hivemind.

N peer processes on 127.0.0.1 each publish one group record per step (64 completions built from
``protocol.types`` values, signed with ``encode_record``, ~50-200 KB) and poll the recent windows. Per record
we time how long until every other peer has it (p50, p95), plus records/s, wire bytes per completion and the
share of encode+sign+validate+decode in the time spent (client side and inside the DHT's store guard).

Baseline in the same run: raw hivemind ``DHTNode`` store/get of the same bytes with the same key layout
(content-addressed record keys plus a per-window index), no validation, no decoding. The figures that matter
are the ratios (transport / raw) and the median over ``--repeats``.

Usage::

    python benchmarks/b1_gossip.py                  # 8 and 32 peers, writes benchmarks/results/b1_gossip.md
    python benchmarks/b1_gossip.py --peers 8 --repeats 3
    python benchmarks/b1_gossip.py --quick --out /tmp/b1   # 3 small peers, one repeat (what the test runs)

Knows nothing about training: records carry synthetic text of realistic size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SWARM = "b1"
COMPLETIONS = 64
WORDS = ("the", "answer", "is", "so", "we", "add", "then", "sum", "carry", "step", "check", "result", "of", "and")


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


# -- worker (one peer per process) --------------------------------------------------------------------------


async def _raw_node(boot: str | None):
    from hivemind.dht.node import DHTNode

    return await DHTNode.create(
        initial_peers=[boot] if boot else None, host_maddrs=["/ip4/127.0.0.1/tcp/0"], wait_timeout=10
    )


async def worker(args: dict) -> None:
    from protocol.identity import Identity
    from protocol.records import encode_record, window_of
    from protocol.transport.config import HivemindTransportConfig, ProtocolConfig
    from protocol.transport.hivemind_dht import HivemindTransport, index_key, index_subkey, record_digest, record_key
    from protocol.validation import RecordValidator

    mode, boot, n_expected = args["mode"], args.get("bootstrap"), args["peers"] * args["steps"]
    pc = ProtocolConfig(window_seconds=args["window_seconds"], max_past_windows=8, fetch_past_windows=2)
    validator = RecordValidator.from_config(SWARM, pc)
    ident = Identity.generate()
    rng = random.Random(args["index"])
    timing = {"encode": 0.0, "check": 0.0, "publish": 0.0, "fetch": 0.0}
    seen: dict[str, float] = {}
    published: dict[str, float] = {}
    sizes: list[int] = []
    raw_have: dict[tuple[int, str], bytes] = {}

    if mode == "hivemind":
        cfg = HivemindTransportConfig(initial_peers=[boot] if boot else [], request_timeout_s=20)
        transport = await HivemindTransport.create(cfg, swarm=SWARM, validate=validator.is_storable, protocol=pc)
        addr = transport.addresses()[0]
    else:
        node = await _raw_node(boot)
        addr = str((await node.get_visible_maddrs())[0])
    print("READY", addr, flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    if not line.startswith("GO"):  # the coordinator went away before the start: leave cleanly
        await (transport.close() if mode == "hivemind" else node.shutdown())
        return
    t0 = float(line.split()[1])
    end = t0 + args["steps"] * args["interval"] + args["settle_s"]

    async def raw_publish(data: bytes, window: int) -> None:
        d = record_digest(data)
        exp = float((window + 1 + 4) * pc.window_seconds)
        keys = [record_key(SWARM, window, ident.peer_id, d), index_key(SWARM, window)]
        await asyncio.wait_for(
            node.store_many(keys, [data, b""], exp, subkeys=[None, index_subkey(window, ident.peer_id, d)]), 20
        )

    async def raw_fetch(windows: list[int]) -> list[bytes]:
        keys = [index_key(SWARM, w) for w in windows]
        found = await asyncio.wait_for(node.get_many(keys, sufficient_expiration_time=float("inf")), 20)
        wanted = {}
        for w, k in zip(windows, keys, strict=True):
            entry = found.get(k)
            if entry is not None and isinstance(entry.value, dict):
                for sub in entry.value:
                    if (w, sub) not in raw_have:
                        _, sender, d = sub.split("/")
                        wanted[record_key(SWARM, w, sender, d)] = (w, sub)
        if wanted:
            got = await asyncio.wait_for(node.get_many(list(wanted)), 20)
            for k, ws in wanted.items():
                if got.get(k) is not None and isinstance(got[k].value, bytes):
                    raw_have[ws] = got[k].value
        return [v for (w, _), v in raw_have.items() if w in windows]

    async def publisher() -> None:
        for step in range(args["steps"]):
            await asyncio.sleep(max(0.0, t0 + step * args["interval"] - time.time()))
            batch = make_batch(args["record_kb"], step, rng)
            start = time.time()
            window = window_of(start, pc.window_seconds)
            seq = step + 1
            data = encode_record(
                ident, kind="rollouts", swarm=SWARM, seq=seq, window=window, created=start, payload=batch
            )
            t1 = time.time()
            timing["encode"] += t1 - start
            published[record_digest(data)] = start
            sizes.append(len(data))
            if mode == "hivemind":
                await transport.publish(data, window=window, sender=ident.peer_id)
            else:
                await raw_publish(data, window)
            timing["publish"] += time.time() - t1

    async def poller() -> None:
        while time.time() < end and (len(seen) < n_expected or len(published) < args["steps"]):
            w = window_of(time.time(), pc.window_seconds)
            windows = [w - 2, w - 1, w]
            t1 = time.time()
            try:
                datas = await (transport.fetch_recent(windows) if mode == "hivemind" else raw_fetch(windows))
            except Exception as e:  # a timed-out poll is part of what we measure; the next poll retries
                print(f"fetch failed: {e!r}", file=sys.stderr, flush=True)
                datas = []
            now = time.time()
            timing["fetch"] += now - t1
            for data in datas:
                rid = record_digest(data)
                if rid in seen:
                    continue
                if mode == "hivemind":
                    t2 = time.time()
                    env = validator.check(data)
                    timing["check"] += time.time() - t2
                    if env is None:
                        continue
                seen[rid] = now
            await asyncio.sleep(args["poll_s"])

    await asyncio.gather(publisher(), poller())
    guard_s = transport.stats()["guard_seconds"] if mode == "hivemind" else 0.0
    out = {
        "published": published,
        "seen": seen,
        "sizes": sizes,
        "timing": {**timing, "guard": guard_s},
    }
    if mode == "hivemind":
        await transport.close()
    else:
        await node.shutdown()
    Path(args["outfile"]).write_text(json.dumps(out))


# -- coordinator ----------------------------------------------------------------------------------------------


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run_swarm(mode: str, peers: int, opts: argparse.Namespace, workdir: Path) -> dict:
    """Start ``peers`` worker processes, let them publish and poll, and compute this run's metrics."""
    procs: list[subprocess.Popen] = []
    outs: list[Path] = []
    logs = []
    boot = None
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
                "outfile": str(out),
            }
            log = (workdir / f"{mode}_{peers}_{i}.log").open("w")
            logs.append(log)
            proc = subprocess.Popen(
                [sys.executable, __file__, "--worker", json.dumps(wargs)],
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
        t0 = time.time() + 1.0
        for proc in procs:
            proc.stdin.write(f"GO {t0}\n")
            proc.stdin.flush()
        limit = opts.steps * opts.interval + opts.settle_s + 60
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(1.0, t0 + limit - time.time()))
    finally:
        for proc in procs:
            _stop(proc)
        for log in logs:
            log.close()
    results = [json.loads(o.read_text()) for o in outs if o.exists()]
    return summarize(mode, peers, results)


def summarize(mode: str, peers: int, results: list[dict]) -> dict:
    published: dict[str, float] = {}
    sizes: list[int] = []
    for r in results:
        published.update(r["published"])
        sizes += r["sizes"]
    # Records are identified by their content digest; a publisher's own records do not count for it.
    lat = []
    for rid, tp in published.items():
        ts = [r["seen"].get(rid) for r in results if rid not in r["published"]]
        lat.append(max(ts) - tp if ts and all(t is not None for t in ts) else float("inf"))
    lat.sort()
    complete = [x for x in lat if x != float("inf")]
    span = (max(published.values()) + max(complete) - min(published.values())) if complete else float("nan")
    timing = {k: sum(r["timing"][k] for r in results) for k in ("encode", "check", "publish", "fetch", "guard")}
    codec = timing["encode"] + timing["check"] + timing["guard"]
    total = timing["encode"] + timing["check"] + timing["publish"] + timing["fetch"]
    size = statistics.mean(sizes) if sizes else 0.0
    return {
        "mode": mode,
        "peers": peers,
        "records": len(published),
        "incomplete": len(lat) - len(complete),
        "p50_s": lat[len(lat) // 2] if lat else float("nan"),
        "p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else float("nan"),
        "records_per_s": len(complete) / span if complete and span > 0 else 0.0,
        "record_kb": size / 1024,
        "bytes_per_completion": size / COMPLETIONS,
        "codec_share": codec / total if mode == "hivemind" and total > 0 else float("nan"),
    }


def _median(runs: list[dict], key: str) -> float:
    vals = [r[key] for r in runs]
    return statistics.median(vals)


def machine_info() -> dict:
    mem_gib = float("nan")
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024**2
    gpu = "none"
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(Exception):
            gpu = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout.strip()
                or "none"
            )
    import importlib.metadata as md

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "ram_gib": round(mem_gib, 1),
        "gpu": gpu,
        "python": platform.python_version(),
        "hivemind": md.version("hivemind"),
        "load_avg_at_start": os.getloadavg()[0],
    }


def fmt(x: float, digits: int = 2) -> str:
    if x != x:  # nan
        return "-"
    if x == float("inf"):
        return "inf"
    return f"{x:.{digits}f}"


def render(rows: list[dict], info: dict, opts: argparse.Namespace) -> str:
    lines = [
        "# B1 gossip: record dissemination over hivemind",
        "",
        f"Machine: {info['cores']} cores, {info['ram_gib']} GiB RAM, GPU: {info['gpu']}; Python {info['python']}, "
        f"hivemind {info['hivemind']}; load average at start {info['load_avg_at_start']:.1f}. Date: {info['date']}.",
        "",
        f"Each peer publishes one signed group record (64 completions, ~{opts.record_kb:.0f} KB) every "
        f"{opts.interval:g} s for {opts.steps} steps and polls every {opts.poll_s:g} s. Visibility = time from "
        f"the publisher's encode call until the last other peer has the record (incomplete records count as inf). "
        f"Median of {opts.repeats} repeat(s). raw = hivemind DHTNode store/get of the same bytes with the same key "
        f"layout, no validation or decoding. codec share = (encode+sign + receive validate+decode + DHT store "
        f"guard) / (encode + publish + fetch + receive checks).",
        "",
        "| peers | mode | p50 visibility s | p95 visibility s | records/s | record KB | wire bytes/completion "
        "| codec share | incomplete | p50 vs raw |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['peers']} | {r['mode']} | {fmt(r['p50_s'])} | {fmt(r['p95_s'])} | {fmt(r['records_per_s'])} "
            f"| {fmt(r['record_kb'], 1)} | {fmt(r['bytes_per_completion'], 0)} | "
            f"{fmt(r['codec_share'] * 100, 1) + '%' if r['codec_share'] == r['codec_share'] else '-'} "
            f"| {r['incomplete']} | {r.get('ratio', '-')} |"
        )
    lines += ["", "Targets (BENCHMARKS.md): 8 peers p50 <= 2 s; 32 peers p50 <= 10 s; codec share <= 5%.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--peers", default="8,32", help="comma-separated swarm sizes (default 8,32)")
    ap.add_argument("--steps", type=int, default=3, help="records each peer publishes")
    ap.add_argument("--interval", type=float, default=0.0, help="seconds between steps (default: 5 + peers/2)")
    ap.add_argument("--record-kb", type=float, default=150.0, help="approximate record size in KB")
    ap.add_argument("--poll-s", type=float, default=0.25, help="seconds between polls of a peer")
    ap.add_argument("--settle-s", type=float, default=45.0, help="seconds to keep polling after the last step")
    ap.add_argument("--window-seconds", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="raw,hivemind")
    ap.add_argument("--quick", action="store_true", help="3 peers, 2 small records each, one repeat")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    opts = ap.parse_args(argv)
    if opts.worker:
        asyncio.run(worker(json.loads(opts.worker)))
        return 0
    if opts.quick:
        opts.peers, opts.steps, opts.record_kb, opts.repeats, opts.settle_s = "3", 2, 50.0, 1, 20.0
        opts.interval = opts.interval or 2.0
    # Turn SIGTERM into SystemExit so run_swarm's cleanup stops every worker by pid.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    info = machine_info()
    rows = []
    with tempfile.TemporaryDirectory(prefix="b1_") as tmp:
        for peers in [int(p) for p in opts.peers.split(",")]:
            interval = opts.interval or 5.0 + peers / 2
            per_mode: dict[str, list[dict]] = {m: [] for m in opts.modes.split(",")}
            for rep in range(opts.repeats):
                modes = list(per_mode) if rep % 2 == 0 else list(reversed(per_mode))
                for mode in modes:
                    run_opts = argparse.Namespace(**{**vars(opts), "interval": interval})
                    res = run_swarm(mode, peers, run_opts, Path(tmp))
                    print(json.dumps(res), file=sys.stderr, flush=True)
                    per_mode[mode].append(res)
            for mode, runs in per_mode.items():
                row = {"mode": mode, "peers": peers, "incomplete": sum(r["incomplete"] for r in runs)}
                for key in ("p50_s", "p95_s", "records_per_s", "record_kb", "bytes_per_completion", "codec_share"):
                    row[key] = _median(runs, key)
                rows.append(row)
            raw = next((r for r in rows if r["peers"] == peers and r["mode"] == "raw"), None)
            for r in rows:
                if r["peers"] == peers and raw is not None and raw["p50_s"] > 0:
                    r["ratio"] = f"{r['p50_s'] / raw['p50_s']:.2f}x"
    text = render(rows, info, opts)
    print(text)
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "b1_gossip.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
