"""A test peer process over the real hivemind transport: ``python -m tests.integration.hivemind_peer ...``.

Honest role: starts a :class:`~protocol.channel.Channel` over :class:`HivemindTransport` (built by the factory with
the peer's identity as its libp2p key, as ``swarm-node join`` does), prints ``ADDR <multiaddr> <peer id>`` on stdout
(others bootstrap from it), publishes ``--records`` rollout records of about ``--record-kb`` KB whose completions
start with ``--tag``, polls, and appends one JSON line per record received from another peer to ``--out``
(``{"type": "record", "sender", "seq", "window", "size", "head"}``, ``head`` the start of its first completion).
Every poll it rewrites ``--out.metrics.json`` with the channel's metrics (rejections by reason) and the
transport's DHT-level rejections. It runs until SIGTERM or ``--duration`` seconds.

Hostile role (``--hostile``): a node whose own DHT does not validate; it writes tampered, replayed,
oversized, malformed, wrong-swarm and misfiled entries straight into the DHT (``store_raw``), bypassing the
transport's layout, and prints ``HOSTILE DONE`` once it has tried them all.

Sybil role (``--sybils N``): every ``--publish-interval`` seconds, N fresh throwaway identities each publish one
valid, *informative* rollouts record (one group on a real training task of the node's default families, half the
completions right and half wrong, so a node's re-scoring keeps it) through the real transport, each listed in its
own signed index entry (``sim.adversary.SybilSwarm``). It prints ``SYBILS <rounds> <identities>`` after each round.

Flood role (``--flood N``): N fresh identities each sign an index entry listing 64 digests that resolve to nothing
(dangling), unstamped, for the window ``--flood-ahead`` after the current one, and store it under the shard keys of
``--flood-levels`` (default 0, 4, 5, 6: issue 33's attack) straight into the DHT, in batches. It prints
``FLOOD <window> <entries> <stores accepted> <stores refused> <seconds>`` when done, then reads the level-0 shard
key of that window back through the DHT (as any peer would) and prints ``FLOODREAD <entries> <value bytes>``.

Every honest peer prints ``PUBLISHED <seq> <unix time>`` after each record it publishes, and the JSON lines of
``--out`` carry the unix time ``t`` a record was received; its metrics file carries the transport's stats (the
largest shard key its DHT storage has held: ``shard_key_entries_max``, ``shard_key_bytes_max``).

Knows nothing about pytest; the tests read its stdout and files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from protocol.channel import Channel
from protocol.identity import Identity
from protocol.layout import IndexWriter, encode_index_entry, peer_key, record_digest_hex, shard_key, shard_of
from protocol.records import encode_record, sign_body, window_of
from protocol.transport.config import HivemindTransportConfig, ProtocolConfig
from protocol.transport.factory import create_transport
from protocol.transport.hivemind.transport import HivemindTransport, record_key
from protocol.types import Completion, Group, RolloutBatch, TaskRef
from protocol.validation import RecordValidator


def make_batch(record_kb: float, step: int, tag: str = "") -> RolloutBatch:
    chars = max(8, int(record_kb * 1024 / 8) - 40)
    comps = tuple(Completion(text=f"{tag}{step}:{i} " + "x" * chars, n_tokens=chars // 4) for i in range(8))
    return RolloutBatch("builtin:tiny", step, "tok", (Group(TaskRef("chain_sum", seed=step), comps),))


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--swarm", default="it")
    ap.add_argument("--bootstrap", action="append", default=[])
    ap.add_argument("--key", type=Path, help="identity key file (kept across restarts of one peer)")
    ap.add_argument("--port", type=int, default=0, help="TCP port to listen on (0: any free port)")
    ap.add_argument("--tag", default="", help="honest role: the start of every completion this peer publishes")
    ap.add_argument("--records", type=int, default=2)
    ap.add_argument("--record-kb", type=float, default=4.0)
    ap.add_argument("--publish-interval", type=float, default=0.5)
    ap.add_argument("--poll-s", type=float, default=0.3)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--window-seconds", type=int, default=15)
    ap.add_argument("--max-record-kb", type=int, default=512)
    ap.add_argument("--client-mode", action="store_true", help="same as --mode client")
    ap.add_argument("--mode", choices=["auto", "client", "server"], default="server", help="DHT client mode")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    ap.add_argument("--relay", action="store_true", help="transport.relay_via_peers (circuit relay at --bootstrap)")
    ap.add_argument("--hostile", action="store_true")
    ap.add_argument("--sybils", type=int, default=0, help="sybil role: fresh identities per round")
    ap.add_argument("--sybil-concurrency", type=int, default=1, help="sybil role: publishes in flight at once")
    ap.add_argument("--flood", type=int, default=0, help="flood role: dangling index entries (one identity each)")
    ap.add_argument("--flood-levels", default="0,4,5,6", help="flood role: shard levels to store them under")
    ap.add_argument("--flood-ahead", type=int, default=1, help="flood role: windows ahead of now to flood")
    ap.add_argument("--start-delay", type=float, default=0.0, help="honest role: seconds to wait before publishing")
    ap.add_argument("--out", type=Path)
    return ap.parse_args(argv)


def _shown(addresses: list[str]) -> str:
    """The address others dial: the first one not on loopback (a peer listening on 0.0.0.0), else the first."""
    return next((a for a in addresses if not a.startswith("/ip4/127.")), addresses[0])


def _protocol(a: argparse.Namespace) -> ProtocolConfig:
    return ProtocolConfig(window_seconds=a.window_seconds, max_record_bytes=a.max_record_kb * 1024)


async def honest(a: argparse.Namespace, stop: asyncio.Event) -> None:
    pc = _protocol(a)
    identity = Identity.load_or_create(a.key) if a.key else Identity.generate()
    validator = RecordValidator.from_config(a.swarm, pc)
    mode = {"auto": "auto", "client": True, "server": False}["client" if a.client_mode else a.mode]
    cfg = HivemindTransportConfig(
        initial_peers=a.bootstrap,
        client_mode=mode,
        request_timeout_s=5,
        port=a.port,
        host=a.host,
        relay_via_peers=a.relay,
    )
    transport = await create_transport(
        cfg, swarm=a.swarm, peer_id=identity.peer_id, validate=validator.verdict, protocol=pc, identity=identity
    )
    channel = await Channel.create(identity, transport, validator, fetch_past_windows=2, timeout_s=20)
    print("ADDR", _shown(transport.addresses()), identity.peer_id, flush=True)
    out = a.out.open("a")
    metrics_path = Path(f"{a.out}.metrics.json")
    end = time.monotonic() + a.duration
    next_pub, published = time.monotonic() + a.start_delay, 0
    try:
        while not stop.is_set() and time.monotonic() < end:
            if published < a.records and time.monotonic() >= next_pub:
                env = await channel.publish("rollouts", make_batch(a.record_kb, published, a.tag))
                print("PUBLISHED", env.seq, f"{time.time():.3f}", flush=True)
                published += 1
                next_pub = time.monotonic() + a.publish_interval
            for env in await channel.poll():
                head = env.payload.groups[0].completions[0].text[:32] if isinstance(env.payload, RolloutBatch) else ""
                line = {"type": "record", "sender": env.sender, "seq": env.seq, "window": env.window, "size": env.size}
                line["head"] = head
                line["t"] = round(time.time(), 3)
                out.write(json.dumps(line) + "\n")
                out.flush()
            metrics = {"me": identity.peer_id, "published": published, "channel": channel.metrics()}
            metrics["dht_rejections"] = transport.rejections()
            metrics["dht_stats"] = transport.stats()
            tmp = metrics_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(metrics))
            tmp.replace(metrics_path)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), a.poll_s)
    finally:
        out.close()
        await channel.close()


async def hostile(a: argparse.Namespace, stop: asyncio.Event) -> None:
    """Try every kind of bad entry once, straight into the DHT; then idle until stopped."""
    pc = _protocol(a)
    me = Identity.generate()
    cfg = HivemindTransportConfig(initial_peers=a.bootstrap, store_validation=False, request_timeout_s=5)
    dht = await HivemindTransport.create(cfg, swarm=a.swarm, protocol=pc)
    print("ADDR", dht.addresses()[0], me.peer_id, flush=True)
    w = window_of(time.time(), pc.window_seconds)
    exp = float((w + 3) * pc.window_seconds)

    def signed(seq: int, swarm: str = a.swarm, window: int = w, kb: float = 2.0) -> bytes:
        return encode_record(
            me, kind="rollouts", swarm=swarm, seq=seq, window=window, created=time.time(), payload=make_batch(kb, seq)
        )

    writer = IndexWriter(me, a.swarm)

    async def put_entry(entry: bytes, window: int, subkey: str = me.peer_id) -> None:
        # A longer entry expires a little later, as honest writers do, so it replaces the shorter one.
        e = exp + 0.01 * len(writer._digests.get(window, []))
        await dht.store_raw(peer_key(a.swarm, window, me.peer_id), entry, e)
        for level in range(pc.shard_levels):
            shard = shard_of(window, me.peer_id, level, pc.shard_fanout)
            await dht.store_raw(shard_key(a.swarm, window, level, shard), entry, e, subkey=subkey)

    async def put(data: bytes, window: int = w, sender: str = me.peer_id) -> None:
        """Store ``data`` under the record key of (window, sender) and list it in our own signed index entry."""
        d = record_digest_hex(data)
        await dht.store_raw(record_key(a.swarm, window, sender, d), data, exp)
        entry = writer.add(data, window)
        if entry is not None:
            await put_entry(entry, window)

    good = signed(1)
    tampered = bytearray(signed(2))
    at = tampered.index(b"x" * 16)
    tampered[at] = ord("y")  # inside a completion's text: still decodes, but the signature no longer matches
    attempts = {
        "tampered": bytes(tampered),
        "malformed": os.urandom(3000),
        "wrong_swarm": signed(3, swarm="other-swarm"),
        # signed and well formed, but larger than max_record_bytes (sign_body skips encode_record's size cap)
        "oversized": sign_body(me, {"x": b"y" * (pc.max_record_bytes + 1024)}),
    }
    for name, data in attempts.items():
        await put(data)
        print("HOSTILE tried", name, flush=True)
    # Misfiled: a valid record under another sender's key, and under another window's key.
    await put(good, sender="0" * 32)
    await put(good, window=w - 1)
    # Replay: the same (sender, seq) with different content (equivocation) under correct keys; the DHT accepts
    # both (each is authentic), the receivers' validators keep one and count the other as a replay.
    await put(good)
    await put(signed(1, kb=2.5))
    # Junk in the index: bytes that are no entry, our entry filed under another sender's subkey, and an entry
    # with a broken signature (a forged listing for somebody else).
    await dht.store_raw(shard_key(a.swarm, w, 0, 0), b"junk", exp, subkey=me.peer_id)
    listed = writer.add(good, w)
    assert listed is not None
    await dht.store_raw(shard_key(a.swarm, w, 0, 0), listed, exp, subkey="0" * 32)
    forged = bytearray(encode_index_entry(me, a.swarm, w, [record_digest_hex(good)]))
    forged[-1] ^= 1
    await dht.store_raw(peer_key(a.swarm, w, me.peer_id), bytes(forged), exp + 1)
    print("HOSTILE DONE", flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), a.duration)
    await dht.close()


async def sybils(a: argparse.Namespace, stop: asyncio.Event) -> None:
    """Publish ``--sybils`` valid informative records per round under fresh identities until stopped."""
    import random

    from node.config import NodeConfig
    from node.tasks import TaskSource
    from sim.adversary import SybilSwarm

    pc = _protocol(a)
    validator = RecordValidator.from_config(a.swarm, pc)
    cfg = HivemindTransportConfig(initial_peers=a.bootstrap, request_timeout_s=5)
    transport = await HivemindTransport.create(cfg, swarm=a.swarm, validate=validator.verdict, protocol=pc)
    print("ADDR", transport.addresses()[0], "sybils", flush=True)
    tasks = TaskSource(NodeConfig().tasks)  # the families and seed a default node regenerates and trains on
    swarm = SybilSwarm(
        transport,
        count=a.sybils,
        swarm_id=a.swarm,
        refs=lambda rng: tasks.sample(rng, 1),
        solve=lambda ref: str(tasks.materialize(ref).answer),
        group_size=4,
        clock=time.time,
        window_seconds=pc.window_seconds,
        seed=random.randrange(2**31),
        concurrency=a.sybil_concurrency,
    )
    end = time.monotonic() + a.duration
    try:
        while not stop.is_set() and time.monotonic() < end:
            await swarm.act()
            print("SYBILS", swarm.rounds, len(swarm.senders), flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), a.publish_interval)
    finally:
        await transport.close()


async def flood(a: argparse.Namespace, stop: asyncio.Event) -> None:
    """Store ``--flood`` dangling, unstamped index entries of fresh identities for the next window, then idle."""
    import random

    from protocol.layout import ShardParams, encode_index_entry

    pc = _protocol(a)
    params = ShardParams.from_config(pc)
    cfg = HivemindTransportConfig(initial_peers=a.bootstrap, store_validation=False, request_timeout_s=20)
    dht = await HivemindTransport.create(cfg, swarm=a.swarm, protocol=pc)
    print("ADDR", dht.addresses()[0], "flood", flush=True)
    levels = [int(x) for x in a.flood_levels.split(",")]
    # The latest window whose entries honest guards accept now (their expiration must be within the
    # expiration_too_far limit): the flood is stored before that window starts, as far as this machine manages.
    now = time.time()
    w = window_of(now, pc.window_seconds) + a.flood_ahead
    exp = float((w + 1 + cfg.expiration_windows) * pc.window_seconds) + 0.64
    rng = random.Random()
    t0 = time.monotonic()
    batches: list[tuple[list[str], list[bytes], list[str]]] = [([], [], [])]
    for _ in range(a.flood):
        me = Identity.generate()
        digests = [rng.randbytes(16).hex() for _ in range(64)]
        entry = encode_index_entry(me, a.swarm, w, digests)  # no work stamp: free to mint
        keys, values, subkeys = batches[-1]
        for level in levels:
            keys.append(shard_key(a.swarm, w, level, shard_of(w, me.peer_id, level, params.fanout)))
            values.append(entry)
            subkeys.append(me.peer_id)
        if len(keys) >= 1000:
            batches.append(([], [], []))
    accepted = refused = 0
    gate = asyncio.Semaphore(4)

    async def store(batch: tuple[list[str], list[bytes], list[str]]) -> None:
        nonlocal accepted, refused
        keys, values, subkeys = batch
        if not keys:
            return
        async with gate:
            try:
                ok = await dht._call(
                    dht._node.store_many(keys, values, exp, subkeys=subkeys, beam_size=cfg.lookup_beam), timeout=300
                )
                accepted += sum(1 for v in ok.values() if v)
                refused += sum(1 for v in ok.values() if not v)
            except Exception as e:  # a flooder goes on whatever the DHT says
                refused += len(keys)
                print("FLOOD batch failed", type(e).__name__, e, flush=True)

    await asyncio.gather(*(store(b) for b in batches))
    print("FLOOD", w, a.flood, accepted, refused, f"{time.monotonic() - t0:.1f}", flush=True)
    # Read the level-0 shard back as any peer does: one lookup, whatever a replica returns in one message.
    found = await dht._call(dht._node.get(shard_key(a.swarm, w, 0, 0), latest=True), timeout=60)
    value = found.value if found is not None else {}
    items = [v.value for v in value.values()] if isinstance(value, dict) else []
    print("FLOODREAD", len(items), sum(len(v) for v in items), flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), a.duration)
    await dht.close()


async def main(argv: list[str] | None = None) -> None:
    a = _args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if a.flood:
        await flood(a, stop)
    elif a.sybils:
        await sybils(a, stop)
    else:
        await (hostile(a, stop) if a.hostile else honest(a, stop))


if __name__ == "__main__":
    asyncio.run(main())
