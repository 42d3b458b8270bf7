"""B1 for a mixed swarm: record visibility when hivemind-transport and libp2p-transport nodes share one swarm.

N peer processes on 127.0.0.1, each a real transport under a :class:`~protocol.channel.Channel` (the node's own receive
path): ``hivemind`` (all N hivemind nodes: DHT plus p2pd's GossipSub), ``libp2p`` (all N py-libp2p nodes), ``mixed``
(hivemind and libp2p alternating, peer 0 hivemind; SPEC 7.6) and ``hivemind-dht`` (hivemind nodes with ``gossip:
false``: the DHT poll alone, what a hivemind swarm was before). Every peer bootstraps from peer 0, waits until all are
up, then publishes one group record (64 completions, about ``--record-kb`` KB) every ``--interval`` s for
``--steps`` steps and polls every ``--poll`` s. Per record: the time from the publisher's ``publish`` call until the
last other peer had it (visibility p50/p95; a record some peer never got counts as inf), and per (record, reader)
pair, split in the mixed swarm by the transports of publisher and reader.

Usage::

    python benchmarks/systems/b1_gossip_mixed.py --peers 8 --out benchmarks/results/b1_gossip_mixed.md

A worker imports one transport only (hivemind and libp2p cannot share a process). Knows nothing about training.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems.harness import stop_process  # noqa: E402

SWARM = "b1-mixed"
WORDS = ("the", "answer", "is", "so", "we", "add", "then", "sum", "carry", "step", "check", "result", "of", "and")


def make_batch(record_kb: float, step: int, rng: random.Random):  # type: ignore[no-untyped-def]
    """One group of 64 completions of about ``record_kb`` KB in all."""
    from protocol.types import Completion, Group, RolloutBatch, TaskRef

    chars = max(16, int(record_kb * 1024 / 64) - 40)
    comps = tuple(
        Completion(" ".join(rng.choice(WORDS) for _ in range(chars // 4 + 1))[:chars], chars // 4) for _ in range(64)
    )
    return RolloutBatch("builtin:tiny", step, "tok", (Group(TaskRef("chain_sum", seed=step), comps),))


# -- worker (one peer per process) ------------------------------------------------------------------------------


async def worker(a: argparse.Namespace) -> None:
    from protocol.channel import Channel
    from protocol.identity import Identity
    from protocol.transport.config import HivemindTransportConfig, Libp2pTransportConfig, ProtocolConfig
    from protocol.transport.factory import create_transport
    from protocol.validation import RecordValidator

    pc = ProtocolConfig(window_seconds=15, max_record_bytes=1 << 20)
    me = Identity.generate()
    validator = RecordValidator.from_config(SWARM, pc)
    peers = [a.bootstrap] if a.bootstrap else []
    if a.transport.startswith("hivemind"):
        gossip = a.transport == "hivemind"  # hivemind-dht: the DHT alone, as before mixed swarms (SPEC 7.6)
        cfg: object = HivemindTransportConfig(
            initial_peers=peers, request_timeout_s=5, client_mode=False, gossip=gossip
        )
    else:
        cfg = Libp2pTransportConfig(initial_peers=peers, request_timeout_s=5)
    transport = await create_transport(
        cfg, swarm=SWARM, peer_id=me.peer_id, validate=validator.verdict, protocol=pc, identity=me
    )
    channel = await Channel.create(me, transport, validator, fetch_past_windows=2, timeout_s=20)
    print("ADDR", transport.addresses()[0], me.peer_id, flush=True)
    go = Path(a.go)
    while not go.exists():
        await asyncio.sleep(0.1)
    rng = random.Random(a.index)
    published: list[tuple[int, float]] = []
    received: dict[str, float] = {}
    end = time.monotonic() + a.steps * a.interval + a.tail
    next_pub = time.monotonic() + rng.uniform(0, a.interval)
    try:
        while time.monotonic() < end:
            if len(published) < a.steps and time.monotonic() >= next_pub:
                batch = make_batch(a.record_kb, len(published), rng)
                t = time.time()
                env = await channel.publish("rollouts", batch)
                published.append((env.seq, t))
                next_pub += a.interval
            for env in await channel.poll():
                received.setdefault(f"{env.sender}/{env.seq}", time.time())
            await asyncio.sleep(a.poll)
    finally:
        stats = transport.stats()
        await channel.close()
    out = {"me": me.peer_id, "transport": a.transport, "published": published, "received": received}
    out["stats"] = {k: v for k, v in stats.items() if isinstance(v, int | float)}
    Path(a.out).write_text(json.dumps(out))


# -- coordinator ----------------------------------------------------------------------------------------------------


def run(mode: str, n: int, a: argparse.Namespace, work: Path) -> dict:
    kinds = {m: [m] * n for m in ("hivemind", "hivemind-dht", "libp2p")}.get(mode)
    kinds = kinds or ["hivemind" if i % 2 == 0 else "libp2p" for i in range(n)]
    work.mkdir(parents=True, exist_ok=True)
    go = work / "go"
    go.unlink(missing_ok=True)
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}

    def start(i: int, boot: str) -> subprocess.Popen:
        cmd = [sys.executable, __file__, "--worker", "--transport", kinds[i], "--index", str(i), "--go", str(go)]
        cmd += ["--out", str(work / f"{i}.json"), "--steps", str(a.steps), "--interval", str(a.interval)]
        cmd += ["--poll", str(a.poll), "--record-kb", str(a.record_kb), "--tail", str(a.tail)]
        cmd += ["--bootstrap", boot] if boot else []
        log = (work / f"{i}.log").open("w")
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT)

    def addr_of(p: subprocess.Popen) -> str:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("ADDR"):
                return line.split()[1]
        raise RuntimeError(f"a {mode} worker exited before it was up (see {work})")

    try:
        procs.append(start(0, ""))
        boot = addr_of(procs[0])
        procs += [start(i, boot) for i in range(1, n)]
        for p in procs[1:]:
            addr_of(p)
        time.sleep(2.0)  # the last joiners' meshes settle
        go.write_text("go")
        for p in procs:
            p.wait(timeout=a.steps * a.interval + a.tail + 120)
    finally:
        for p in procs:
            stop_process(p)
    results = [json.loads((work / f"{i}.json").read_text()) for i in range(n)]
    return summarize(mode, results)


def _q(xs: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (inf counts as the largest value)."""
    return sorted(xs)[max(0, math.ceil(q * len(xs)) - 1)] if xs else float("nan")


def summarize(mode: str, results: list[dict]) -> dict:
    vis: list[float] = []
    pairs: dict[str, list[float]] = {}
    missing = 0
    for pub in results:
        for seq, t in pub["published"]:
            key = f"{pub['me']}/{seq}"
            worst = 0.0
            for r in results:
                if r is pub:
                    continue
                got = r["received"].get(key)
                d = float("inf") if got is None else max(0.0, got - t)
                missing += got is None
                worst = max(worst, d)
                pairs.setdefault(f"{pub['transport']}->{r['transport']}", []).append(d)
            vis.append(worst)
    row = {"mode": mode, "peers": len(results), "records": len(vis), "missing_pairs": missing}
    row["p50_s"], row["p95_s"] = _q(vis, 0.5), _q(vis, 0.95)
    row["pairs"] = {k: (_q(v, 0.5), _q(v, 0.95), len(v)) for k, v in sorted(pairs.items())}
    drops: dict[str, float] = {}
    for r in results:
        for k, v in r["stats"].items():
            if "failed" in k or "rejected" in k:
                drops[k] = drops.get(k, 0) + v
    row["drops"] = {k: v for k, v in drops.items() if v}
    return row


def render(rows: list[dict], a: argparse.Namespace) -> str:
    load = os.getloadavg()[0]
    lines = [
        "# B1 gossip: a mixed swarm (hivemind + libp2p transports) against single-transport swarms",
        "",
        f"Machine: {platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}; "
        f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at the end {load:.1f} "
        "(2 shared cores: other agents' training ran beside).",
        "",
        f"`python benchmarks/systems/b1_gossip_mixed.py --peers {a.peers} --steps {a.steps} --interval {a.interval} "
        f"--record-kb {a.record_kb} --repeats {a.repeats}`. Each peer (a transport under a Channel, its own "
        f"process) publishes one signed group record (64 completions, ~{a.record_kb:.0f} KB) every {a.interval} s for "
        f"{a.steps} steps and polls every {a.poll} s; every peer bootstraps from peer 0; `mixed` alternates hivemind "
        "and libp2p nodes (peer 0 hivemind); `hivemind-dht` is hivemind with `gossip: false` (the DHT poll alone). "
        "Visibility = time from the publish call until the last other peer had "
        "the record (a record some peer never got counts as inf). One line per repeat.",
        "",
        "| peers | mode | records | p50 visibility s | p95 visibility s | (record, reader) pairs never delivered |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['peers']} | {r['mode']} | {r['records']} | {r['p50_s']:.2f} | {r['p95_s']:.2f} | "
            f"{r['missing_pairs']} |"
        )
    lines += [
        "",
        "Per (record, reader) pair by publisher -> reader transport: p50 / p95 s (pairs).",
        "",
        "| peers | mode | direction | reader p50 s | reader p95 s | pairs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for k, (p50, p95, n) in r["pairs"].items():
            lines.append(f"| {r['peers']} | {r['mode']} | {k} | {p50:.2f} | {p95:.2f} | {n} |")
    drops = {r["mode"]: r["drops"] for r in rows if r["drops"]}
    lines += ["", f"Failures and refusals counted by the transports (summed over peers): {json.dumps(drops)}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--transport", default="hivemind", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", default="", help=argparse.SUPPRESS)
    ap.add_argument("--go", default="", help=argparse.SUPPRESS)
    ap.add_argument("--peers", type=int, default=8)
    ap.add_argument("--modes", default="mixed,hivemind,libp2p,hivemind-dht")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--interval", type=float, default=9.0, help="seconds between a peer's records")
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between polls")
    ap.add_argument("--record-kb", type=float, default=150.0)
    ap.add_argument("--tail", type=float, default=20.0, help="seconds to keep polling after the last publish")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if a.worker:
        asyncio.run(worker(a))
        return 0
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory(prefix="b1mixed-") as tmp:
        for rep in range(a.repeats):
            for mode in a.modes.split(","):
                row = run(mode, a.peers, a, Path(tmp) / f"{mode}-{rep}")
                print(json.dumps(row), flush=True)
                rows.append(row)
    text = render(rows, a)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
