"""B1 gossip over libp2p: how fast signed rollout records spread over the py-libp2p transport, against raw GossipSub.

Same workload and table as ``benchmarks/systems/b1_gossip.py`` (the hivemind run): N peer processes on 127.0.0.1 each
publish one group record per step (64 completions, ``encode_record``, ~50-200 KB) and poll the recent windows.
Per record we time how long until every other peer has it (p50, p95), plus records/s, wire bytes per completion
and the share of encode+sign+validate+decode in the time spent (client side and the transport's edge validator).

Baseline in the same run: raw py-libp2p GossipSub (same router settings) carrying the same bytes, no validation,
no decoding, no sync protocol, no peer exchange; arrival is when the subscription yields the message.

Every peer bootstraps from peer 0's address. Mode ``libp2p-leave``: the same, but peer 0 publishes a third of the
steps and then leaves the swarm while the others go on (every record must still reach every peer that stayed).
For both transport modes the results also show the connection graph at the end: mean degree, the fewest
connections a peer has besides the bootstrap node (0 would be a star), and the components without it.

Every process here imports libp2p and never hivemind (they cannot share a process).

Usage::

    python benchmarks/systems/b1_gossip_libp2p.py          # 8 and 32 peers -> benchmarks/results/b1_gossip_libp2p.md
    python benchmarks/systems/b1_gossip_libp2p.py --peers 8 --repeats 1 --modes libp2p,libp2p-leave
    python benchmarks/systems/b1_gossip_libp2p.py --quick --out /tmp/b1  # 3 small peers, one repeat (the test)

Knows nothing about training: records carry synthetic text of realistic size.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems import gossip as b1_common  # noqa: E402
from benchmarks.systems import gossip_summary as b1_summary  # noqa: E402  (imports neither hivemind nor libp2p)
from benchmarks.systems import launch  # noqa: E402
from benchmarks.systems.gossip import SWARM, make_batch  # noqa: E402


def _rid(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


# -- worker (one peer per process) --------------------------------------------------------------------------


# what a worker imports: the zygote of ``--launch fork`` imports it once for every peer
PRELOAD = (
    "trio",
    "multiaddr",
    "libp2p",
    "protocol.identity",
    "protocol.records",
    "protocol.transport.config",
    "protocol.transport.libp2p.transport",
    "protocol.validation",
)


def run_worker(wargs: dict) -> None:
    if wargs["mode"] == "raw":
        raw_worker(wargs)
    else:
        asyncio.run(worker(wargs))


async def worker(args: dict) -> None:
    """One peer of the libp2p transport: publish ``steps`` records, poll, record arrival times."""
    from protocol.identity import Identity
    from protocol.records import encode_record, window_of
    from protocol.transport.config import Libp2pTransportConfig, ProtocolConfig
    from protocol.transport.libp2p.transport import Libp2pTransport
    from protocol.validation import RecordValidator

    leave_after = args.get("leave_after") or 0
    leaver = args["index"] == 0 and leave_after > 0
    steps = leave_after if leaver else args["steps"]
    n_expected = (args["peers"] - 1) * args["steps"] + (leave_after or args["steps"])
    pc = ProtocolConfig(window_seconds=args["window_seconds"], max_past_windows=8, fetch_past_windows=2)
    validator = RecordValidator.from_config(SWARM, pc)
    ident = Identity.generate()
    rng = random.Random(args["index"])
    timing = {"encode": 0.0, "check": 0.0, "publish": 0.0, "fetch": 0.0, "polls": 0}
    seen: dict[str, float] = {}
    published: dict[str, float] = {}
    sizes: list[int] = []
    boot = args.get("bootstrap")
    discovery = args.get("discovery") or "exchange"
    cfg = Libp2pTransportConfig(
        initial_peers=[boot] if boot else [],
        request_timeout_s=20,
        startup_timeout_s=120,
        peer_exchange=discovery == "exchange",
        gossipsub_px=discovery == "gossipsub-px",
        **({"inline_max_bytes": args["inline_max_bytes"]} if args.get("inline_max_bytes") else {}),
    )
    transport = await Libp2pTransport.create(cfg, swarm=SWARM, validate=validator.verdict, protocol=pc)
    print("READY", transport.addresses()[0], flush=True)
    t0 = float((await asyncio.to_thread(sys.stdin.readline)).split()[1])
    end = t0 + args["steps"] * args["interval"] + args["settle_s"]

    async def publisher() -> None:
        for step in range(steps):
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
        while time.time() < end and (len(seen) < n_expected or len(published) < steps):
            if leaver and len(published) >= steps:
                return
            w = window_of(time.time(), pc.window_seconds)
            t1 = time.time()
            datas = await transport.fetch_recent([w - 2, w - 1, w])
            now = time.time()
            timing["fetch"] += now - t1
            timing["polls"] += 1
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
    left_at = None
    if leaver:
        # The bootstrap node leaves midway: one interval after its last record (so that record is out), while the
        # others still have steps to publish. Everyone bootstrapped from it.
        await asyncio.sleep(args["interval"])
        left_at = time.time()
    # Otherwise stay in the swarm until the run ends: a peer that has everything still relays and serves sync
    # requests.
    while not leaver and time.time() < end:
        await asyncio.sleep(0.5)
    connections = await transport.peers()
    stats = transport.stats()
    rss, pss = launch.rss_tree_bytes(), launch.pss_tree_bytes()  # before close, as the hivemind worker does
    await transport.close()
    out = {
        "rss_bytes": rss,
        "pss_bytes": pss,
        "index": args["index"],
        "left_at": left_at,
        "peer_id": transport.addresses()[0].rsplit("/p2p/", 1)[1],
        "connections": connections,
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


# How records arrived at a peer: inline in a gossip message, fetched after an announcement (or from another forwarder
# after that fetch failed), pulled by sync; and the copies of announcements dropped unjudged without a fetch: their
# record was already being fetched, or their forwarder had 2 fetches running or was held off after a failed one.
ARRIVAL_STATS = (
    "gossip_records",
    "fetched_large",
    "fetched_large_retry",
    "synced",
    "announce_copy_in_flight",
    "announce_forwarder_busy",
    "announce_forwarder_held_off",
)


def summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts by reason, added up (reasons that stay at zero are left out)."""
    return dict(sum((Counter(c) for c in counts), Counter()))


def summarize(mode: str, peers: int, results: list[dict]) -> dict:
    # The edge validator runs in the router, outside publish and fetch: it counts in the time spent too.
    row = b1_summary.summarize(mode, peers, results, transport="libp2p", guard_in_total=True, require_all_peers=True)
    row["drops"] = summed(r.get("drops", {}) for r in results)
    row["rejected"] = summed(r.get("stats", {}).get("rejected", {}) for r in results)
    row["arrivals"] = summed({k: r.get("stats", {}).get(k, 0) for k in ARRIVAL_STATS} for r in results)
    row["mesh"] = mesh_summary(results) if mode != "raw" else None
    return row


def mesh_summary(results: list[dict]) -> dict:
    """The connection graph at the end of a run: mean degree, the smallest number of connections a peer has to
    peers other than the bootstrap node (0 = it hangs off the bootstrap node alone: a star), and the connected
    components of the graph without the bootstrap node (1 = the swarm survives the bootstrap node leaving)."""
    boot = next((r["peer_id"] for r in results if r.get("index", 0) == 0 and r.get("peer_id")), None)
    ids = {r["peer_id"] for r in results if r.get("peer_id")} - {boot}
    edges: dict[str, set[str]] = {p: set() for p in ids}
    degrees = []
    for r in results:
        if r.get("peer_id") in ids:
            conns = set(r.get("connections", [])) & ids
            degrees.append(len(r.get("connections", [])))
            for q in conns:
                edges[r["peer_id"]].add(q)
                edges[q].add(r["peer_id"])
    seen: set[str] = set()
    components = 0
    for start in ids:
        if start in seen:
            continue
        components += 1
        stack = [start]
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                stack += list(edges[p] - seen)
    return {
        "mean_degree": statistics.mean(degrees) if degrees else 0.0,
        "min_degree_without_boot": min((len(e) for e in edges.values()), default=0),
        "components_without_boot": components,
    }


def run_one(mode: str, peers: int, opts: argparse.Namespace, workdir: Path) -> dict:
    # ``libp2p-leave``: the bootstrap node (peer 0) publishes about a third of the steps, then leaves.
    leave = max(1, opts.steps // 3) if mode == "libp2p-leave" else 0
    run_opts = argparse.Namespace(**{**vars(opts), "boot_leaves_after": leave})
    # A couple of heartbeats before GO: meshes form before the first publish.
    return summarize(mode, peers, b1_common.run_swarm(__file__, mode, peers, run_opts, workdir, mesh_wait_s=2.0))


def render(rows: list[dict], machine: str, opts: argparse.Namespace) -> str:
    every = f"{opts.interval:g} s" if opts.interval else "5 + peers/2 s"
    description = (
        f"Each peer publishes one signed group record (64 completions, ~{opts.record_kb:.0f} KB) every "
        f"{every} for {opts.steps} steps and polls every {opts.poll_s:g} s (a local read: records are "
        f"pushed). Visibility = time from the publisher's encode call until the last other peer has the record "
        f"(incomplete records count as inf). Median of {opts.repeats} repeat(s). raw = bare py-libp2p GossipSub "
        f"with the same router settings carrying the same bytes, no validation, decoding or sync. codec share = "
        f"(encode+sign + receive validate+decode + edge validator) / (encode + publish + fetch + receive checks "
        f"+ edge validator). Peer discovery: {opts.discovery}. Records over "
        f"{opts.inline_max_bytes or 900_000:,} bytes are announced and fetched, smaller ones travel in the gossip "
        f"message. Compare with the hivemind transport in `b1_gossip.md`." + launch.launch_note(opts)
    )
    drops = summed(r.get("drops", {}) for r in rows)
    refused = summed(r.get("rejected", {}) for r in rows)
    notes = ["", f"Drops counted by the transport (all runs): {json.dumps(drops) if drops else 'none'}."]
    notes += ["", f"Refused at the edge, by reason (all runs): {json.dumps(refused) if refused else 'none'}."]
    for r in rows:
        if any(r.get("arrivals", {}).values()):
            notes += [
                "",
                f"How records arrived, and announcements dropped without a fetch, {r['peers']} peers, {r['mode']} "
                f"(all repeats): {json.dumps(r['arrivals'])}.",
            ]
    notes += [
        "",
        "Mesh at the end of each run (median over repeats): mean connections per peer; the fewest connections a peer "
        "has to peers other than the bootstrap node (0 = a star); connected components without the bootstrap node "
        "(1 = not partitioned when it leaves). `libp2p-leave`: the bootstrap node publishes a third of the steps, "
        "then leaves while the others go on; its records count, it does not count as a receiver.",
        "",
        "| peers | mode | mean degree | min degree without bootstrap | components without bootstrap |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.get("mesh")
        if m:
            notes.append(
                f"| {r['peers']} | {r['mode']} | {m['mean_degree']:.1f} | {m['min_degree_without_boot']} "
                f"| {m['components_without_boot']} |"
            )
    return b1_summary.render("libp2p", machine, description, rows, notes)


def main(argv: list[str] | None = None) -> int:
    ap = b1_common.parser(__doc__, poll_s=0.05, modes="raw,libp2p,libp2p-leave")
    ap.add_argument(
        "--discovery",
        choices=["exchange", "gossipsub-px", "none"],
        default="exchange",
        help="how peers find each other: the transport's signed peer exchange (default), GossipSub v1.1 PX on "
        "PRUNE instead, or nothing (a star around the bootstrap node)",
    )
    ap.add_argument(
        "--inline-max-bytes",
        type=int,
        help="records up to this size travel inside the gossip message, larger ones are announced and fetched "
        "(the transport's inline_max_bytes; default its own, 900,000)",
    )
    opts = ap.parse_args(argv)
    if launch.worker_main(opts, PRELOAD, run_worker):
        return 0
    logging_setup()
    b1_common.apply_quick(opts)
    machine = b1_summary.machine_line("libp2p")
    rows = []
    for peers, per_mode in b1_common.sweep(opts, run_one, tmp_prefix="b1p2p_"):
        group = []
        for mode, runs in per_mode.items():
            row = b1_summary.median_row(mode, peers, runs)
            for key in ("drops", "rejected", "arrivals"):  # summed over the repeats
                row[key] = summed(r.get(key, {}) for r in runs)
            meshes = [r["mesh"] for r in runs if r.get("mesh")]
            if meshes:
                row["mesh"] = {k: statistics.median(m[k] for m in meshes) for k in meshes[0]}
            group.append(row)
        b1_summary.add_ratios(group, finite_raw_only=True)
        rows += group
    b1_summary.write(render(rows, machine, opts), opts.out, "b1_gossip_libp2p.md")
    return 0


def logging_setup() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
