"""The peers of the libp2p B1 benchmark (``b1_gossip_libp2p.py`` starts one process per peer): a peer of the
py-libp2p transport, and a peer of bare py-libp2p GossipSub carrying the same bytes (the baseline).

Each runs in its own process, imports libp2p inside the worker and never hivemind (they cannot share a process);
knows nothing about the coordinator or the report.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys
import time
from pathlib import Path

from benchmarks.systems import gossip as b1_common
from benchmarks.systems import launch
from benchmarks.systems.gossip import SWARM, make_batch


def _rid(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


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
    seen, published, sizes = b1_common.peer_logs()
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
            datas, now = await b1_common.fetch_timed(transport, pc.window_seconds, timing)
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
    seen, published, sizes = b1_common.peer_logs()

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
