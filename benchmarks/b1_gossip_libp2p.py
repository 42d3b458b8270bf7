"""B1 gossip over libp2p: how fast signed rollout records spread over the py-libp2p transport, against raw GossipSub.

Same workload and table as ``benchmarks/b1_gossip.py`` (the hivemind run): N peer processes on 127.0.0.1 each
publish one group record per step (64 completions, ``encode_record``, ~50-200 KB) and poll the recent windows.
Per record we time how long until every other peer has it (p50, p95), plus records/s, wire bytes per completion
and the share of encode+sign+validate+decode in the time spent (client side and the transport's edge validator).

Baseline in the same run: raw py-libp2p GossipSub (same router settings) carrying the same bytes, no validation,
no decoding, no sync protocol; arrival is when the subscription yields the message.

Every process here imports libp2p and never hivemind (they cannot share a process).

Usage::

    python benchmarks/b1_gossip_libp2p.py                  # 8 and 32 peers -> benchmarks/results/b1_gossip_libp2p.md
    python benchmarks/b1_gossip_libp2p.py --peers 8 --repeats 1
    python benchmarks/b1_gossip_libp2p.py --quick --out /tmp/b1   # 3 small peers, one repeat (what the test runs)

Knows nothing about training: records carry synthetic text of realistic size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.b1_gossip import COMPLETIONS, fmt, make_batch  # noqa: E402  (no heavy imports at module level)

SWARM = "b1"


def _rid(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


# -- worker (one peer per process) --------------------------------------------------------------------------


async def worker(args: dict) -> None:
    """One peer of the libp2p transport: publish ``steps`` records, poll, record arrival times."""
    from protocol.identity import Identity
    from protocol.records import encode_record, window_of
    from protocol.transport.config import Libp2pTransportConfig, ProtocolConfig
    from protocol.transport.libp2p_gossip import Libp2pTransport
    from protocol.validation import RecordValidator

    n_expected = args["peers"] * args["steps"]
    pc = ProtocolConfig(window_seconds=args["window_seconds"], max_past_windows=8, fetch_past_windows=2)
    validator = RecordValidator.from_config(SWARM, pc)
    ident = Identity.generate()
    rng = random.Random(args["index"])
    timing = {"encode": 0.0, "check": 0.0, "publish": 0.0, "fetch": 0.0}
    seen: dict[str, float] = {}
    published: dict[str, float] = {}
    sizes: list[int] = []
    boot = args.get("bootstrap")
    cfg = Libp2pTransportConfig(initial_peers=[boot] if boot else [], request_timeout_s=20, startup_timeout_s=120)
    transport = await Libp2pTransport.create(cfg, swarm=SWARM, validate=validator.is_storable, protocol=pc)
    print("READY", transport.addresses()[0], flush=True)
    t0 = float((await asyncio.to_thread(sys.stdin.readline)).split()[1])
    end = t0 + args["steps"] * args["interval"] + args["settle_s"]

    async def publisher() -> None:
        for step in range(args["steps"]):
            await asyncio.sleep(max(0.0, t0 + step * args["interval"] - time.time()))
            batch = make_batch(args["record_kb"], step, rng)
            start = time.time()
            window = window_of(start, pc.window_seconds)
            data = encode_record(
                ident, kind="rollouts", swarm=SWARM, seq=step + 1, window=window, created=start, payload=batch
            )
            t1 = time.time()
            timing["encode"] += t1 - start
            published[_rid(data)] = start
            sizes.append(len(data))
            await transport.publish(data, window=window, sender=ident.peer_id)
            timing["publish"] += time.time() - t1

    async def poller() -> None:
        while time.time() < end and (len(seen) < n_expected or len(published) < args["steps"]):
            w = window_of(time.time(), pc.window_seconds)
            t1 = time.time()
            datas = await transport.fetch_recent([w - 2, w - 1, w])
            now = time.time()
            timing["fetch"] += now - t1
            for data in datas:
                rid = _rid(data)
                if rid in seen:
                    continue
                t2 = time.time()
                env = validator.check(data)
                timing["check"] += time.time() - t2
                if env is not None:
                    seen[rid] = now
            await asyncio.sleep(args["poll_s"])

    await asyncio.gather(publisher(), poller())
    # Stay in the swarm until the run ends: a peer that has everything still relays and serves sync requests
    # (every peer bootstraps from peer 0, so early leavers would cut the others off).
    while time.time() < end:
        await asyncio.sleep(0.5)
    stats = transport.stats()
    await transport.close()
    out = {
        "published": published,
        "seen": seen,
        "sizes": sizes,
        "timing": {**timing, "guard": stats["edge_seconds"]},
        "drops": stats["drops"],
        "stats": stats,
    }
    Path(args["outfile"]).write_text(json.dumps(out))


def raw_worker(args: dict) -> None:
    """One peer of bare py-libp2p GossipSub with the transport's router settings; no validation, no decoding."""
    import multiaddr
    import trio
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.tools.anyio_service import background_trio_service

    from protocol.identity import Identity
    from protocol.records import encode_record, window_of
    from protocol.transport.config import Libp2pTransportConfig

    cfg = Libp2pTransportConfig()
    topic = f"raw/{SWARM}"
    ident = Identity.generate()
    rng = random.Random(args["index"])
    timing = {"encode": 0.0, "check": 0.0, "publish": 0.0, "fetch": 0.0, "guard": 0.0}
    seen: dict[str, float] = {}
    published: dict[str, float] = {}
    sizes: list[int] = []

    async def main() -> None:
        listen = [multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]
        host = new_host(key_pair=create_new_key_pair(), listen_addrs=listen)
        router = GossipSub(
            protocols=[PROTOCOL_ID_V11, PROTOCOL_ID],
            degree=cfg.degree,
            degree_low=cfg.degree - 2,
            degree_high=2 * cfg.degree,
            heartbeat_interval=cfg.heartbeat_interval_s,
            max_messages_per_topic_per_second=cfg.router_max_messages_per_s,
        )
        pubsub = Pubsub(host, router)
        async with host.run(listen_addrs=listen), background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            sub = await pubsub.subscribe(topic)
            if args.get("bootstrap"):
                with trio.fail_after(60):
                    await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(args["bootstrap"])))
            print("READY", str(host.get_addrs()[0]), flush=True)
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            t0 = float(line.split()[1])
            end = t0 + args["steps"] * args["interval"] + args["settle_s"]

            async def drain() -> None:
                async for msg in sub:
                    rid = _rid(bytes(msg.data))
                    seen.setdefault(rid, time.time())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain)
                for step in range(args["steps"]):
                    await trio.sleep(max(0.0, t0 + step * args["interval"] - time.time()))
                    batch = make_batch(args["record_kb"], step, rng)
                    start = time.time()
                    window = window_of(start, 15)
                    data = encode_record(
                        ident, kind="rollouts", swarm=SWARM, seq=step + 1, window=window, created=start, payload=batch
                    )
                    published[_rid(data)] = start
                    sizes.append(len(data))
                    with trio.fail_after(20):
                        await pubsub.publish(topic, data)
                n_expected = args["peers"] * args["steps"]
                while time.time() < end and len(seen) < n_expected:
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

    trio.run(main)
    out = {"published": published, "seen": seen, "sizes": sizes, "timing": timing, "drops": {}}
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
        time.sleep(2.0)  # a couple of heartbeats: meshes form before the first publish
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
    drops: dict[str, int] = {}
    for r in results:
        published.update(r["published"])
        sizes += r["sizes"]
        for k, v in r.get("drops", {}).items():
            drops[k] = drops.get(k, 0) + v
    lat = []
    for rid, tp in published.items():
        ts = [r["seen"].get(rid) for r in results if rid not in r["published"]]
        lat.append(max(ts) - tp if ts and all(t is not None for t in ts) else float("inf"))
    if len(results) < peers:  # a peer that died never saw anything
        lat = [float("inf")] * len(lat)
    lat.sort()
    complete = [x for x in lat if x != float("inf")]
    span = (max(published.values()) + max(complete) - min(published.values())) if complete else float("nan")
    timing = {k: sum(r["timing"][k] for r in results) for k in ("encode", "check", "publish", "fetch", "guard")}
    codec = timing["encode"] + timing["check"] + timing["guard"]
    total = timing["encode"] + timing["check"] + timing["publish"] + timing["fetch"] + timing["guard"]
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
        "codec_share": codec / total if mode == "libp2p" and total > 0 else float("nan"),
        "drops": drops,
    }


def machine_info() -> dict:
    import importlib.metadata as md

    mem_gib = float("nan")
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024**2
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "ram_gib": round(mem_gib, 1),
        "python": platform.python_version(),
        "libp2p": md.version("libp2p"),
        "load_avg_at_start": os.getloadavg()[0],
    }


def render(rows: list[dict], info: dict, opts: argparse.Namespace) -> str:
    every = f"{opts.interval:g} s" if opts.interval else "5 + peers/2 s"
    lines = [
        "# B1 gossip: record dissemination over libp2p",
        "",
        f"Machine: {info['cores']} cores, {info['ram_gib']} GiB RAM, GPU: none; Python {info['python']}, "
        f"libp2p {info['libp2p']}; load average at start {info['load_avg_at_start']:.1f}. Date: {info['date']}.",
        "",
        f"Each peer publishes one signed group record (64 completions, ~{opts.record_kb:.0f} KB) every "
        f"{every} for {opts.steps} steps and polls every {opts.poll_s:g} s (a local read: records are "
        f"pushed). Visibility = time from the publisher's encode call until the last other peer has the record "
        f"(incomplete records count as inf). Median of {opts.repeats} repeat(s). raw = bare py-libp2p GossipSub "
        f"with the same router settings carrying the same bytes, no validation, decoding or sync. codec share = "
        f"(encode+sign + receive validate+decode + edge validator) / (encode + publish + fetch + receive checks "
        f"+ edge validator). Compare with the hivemind transport in `b1_gossip.md`.",
        "",
        "| peers | mode | p50 visibility s | p95 visibility s | records/s | record KB | wire bytes/completion "
        "| codec share | incomplete | p50 vs raw |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        share = r["codec_share"]
        lines.append(
            f"| {r['peers']} | {r['mode']} | {fmt(r['p50_s'])} | {fmt(r['p95_s'])} | {fmt(r['records_per_s'])} "
            f"| {fmt(r['record_kb'], 1)} | {fmt(r['bytes_per_completion'], 0)} | "
            f"{fmt(share * 100, 1) + '%' if share == share else '-'} | {r['incomplete']} | {r.get('ratio', '-')} |"
        )
    drops = {k: v for r in rows for k, v in r.get("drops", {}).items()}
    lines += ["", f"Drops counted by the transport (all runs): {json.dumps(drops) if drops else 'none'}."]
    lines += ["", "Targets (BENCHMARKS.md): 8 peers p50 <= 2 s; 32 peers p50 <= 10 s; codec share <= 5%.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--peers", default="8,32", help="comma-separated swarm sizes (default 8,32)")
    ap.add_argument("--steps", type=int, default=3, help="records each peer publishes")
    ap.add_argument("--interval", type=float, default=0.0, help="seconds between steps (default: 5 + peers/2)")
    ap.add_argument("--record-kb", type=float, default=150.0, help="approximate record size in KB")
    ap.add_argument("--poll-s", type=float, default=0.05, help="seconds between polls of a peer")
    ap.add_argument("--settle-s", type=float, default=45.0, help="seconds to keep polling after the last step")
    ap.add_argument("--window-seconds", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="raw,libp2p")
    ap.add_argument("--quick", action="store_true", help="3 peers, 2 small records each, one repeat")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    opts = ap.parse_args(argv)
    if opts.worker:
        wargs = json.loads(opts.worker)
        if wargs["mode"] == "raw":
            raw_worker(wargs)
        else:
            asyncio.run(worker(wargs))
        return 0
    logging_setup()
    if opts.quick:
        opts.peers, opts.steps, opts.record_kb, opts.repeats, opts.settle_s = "3", 2, 50.0, 1, 20.0
        opts.interval = opts.interval or 2.0
    info = machine_info()
    rows = []
    with tempfile.TemporaryDirectory(prefix="b1p2p_") as tmp:
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
                    row[key] = statistics.median(r[key] for r in runs)
                row["drops"] = {k: v for r in runs for k, v in r["drops"].items()}
                rows.append(row)
            raw = next((r for r in rows if r["peers"] == peers and r["mode"] == "raw"), None)
            for r in rows:
                if r["peers"] == peers and raw is not None and 0 < raw["p50_s"] < float("inf"):
                    r["ratio"] = f"{r['p50_s'] / raw['p50_s']:.2f}x"
    text = render(rows, info, opts)
    print(text)
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "b1_gossip_libp2p.md").write_text(text)
    return 0


def logging_setup() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
