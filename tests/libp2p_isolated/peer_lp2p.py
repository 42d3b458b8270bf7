"""One libp2p peer process for the multi-process tests: honest (publishes and collects records), hostile
(floods tampered, forged, oversized, wrong-swarm and garbage messages, optionally one valid record), or a staller
(announces records at a high rate and never serves them: its sync server holds every ``get`` until the requester
gives up, and counts them).

Its host key is its identity (``--key`` keeps it in a file across restarts; with ``--port`` the multiaddr stays the
same too); ``--tag`` starts the text of every record it publishes, and the summary lists the tags received.

Prints ``listening on <multiaddr>`` once up, runs for ``--duration`` seconds (or until it has records from
``--expect`` distinct senders, when ``--exit-when-done``), then writes a JSON summary to ``--out``: our sender
id, the senders of every valid record received, the transport's stats, and the peers seen.

    python -m tests.libp2p_isolated.peer_lp2p --out /tmp/a.json [--bootstrap ADDR] [--hostile]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path

from protocol.identity import Identity
from protocol.records import encode_record, window_of
from protocol.transport.config import Libp2pTransportConfig, ProtocolConfig
from protocol.transport.libp2p.transport import TAG_ANNOUNCE, TAG_RECORD, Libp2pTransport
from protocol.transport.netkey import NetworkKey
from protocol.types import Completion, Group, RolloutBatch, TaskRef
from protocol.validation import RecordValidator

logger = logging.getLogger("peer_lp2p")

SWARM = "lp2p-test"
# Two minutes of acceptance horizon: on a loaded 2-core machine a late joiner may start a minute after the others.
PROTOCOL = ProtocolConfig(window_seconds=15, max_record_bytes=256 * 1024, max_past_windows=8)


def batch(text: str, index: int) -> RolloutBatch:
    return RolloutBatch("m", 0, "t", (Group(TaskRef("chain_sum", {}, 0, index), (Completion(text, 1),)),))


def record(ident: Identity, text: str, index: int, *, swarm: str = SWARM, seq: int | None = None) -> bytes:
    now = time.time()
    return encode_record(
        ident,
        kind="rollouts",
        swarm=swarm,
        seq=seq if seq is not None else int(now * 1000) + index,
        window=window_of(now, PROTOCOL.window_seconds),
        created=now,
        payload=batch(text, index),
        max_bytes=1 << 20,
    )


def hostile_frames(ident: Identity) -> list[bytes]:
    """Invalid gossip frames, one of each kind the edge must refuse."""
    good = record(ident, "good" + "y" * 64, 1)
    tampered = bytearray(good)
    tampered[tampered.index(b"y" * 16)] = ord("z")
    victim = Identity.generate()
    forged = bytearray(record(victim, "forged" + "q" * 64, 2))  # claims victim, then re-signed by nobody
    forged[-1] ^= 0xFF
    oversized = record(ident, "o" * 262_100, 3)  # fine for a 1 MiB encoder, above the swarm's 256 KiB cap
    wrong_swarm = record(ident, "w", 4, swarm="other-swarm")
    ann = bytes([TAG_ANNOUNCE]) + b"\x83\xa6digest\xc4\x20" + b"\x00" * 32 + b"\xa4size\x01\xa6window\x01"
    return [
        bytes([TAG_RECORD]) + bytes(tampered),
        bytes([TAG_RECORD]) + bytes(forged),
        bytes([TAG_RECORD]) + oversized,
        bytes([TAG_RECORD]) + wrong_swarm,
        bytes([TAG_RECORD]) + b"\x92garbage",
        ann,
    ]


def scores(transport: Libp2pTransport) -> dict[str, float]:
    """This peer's GossipSub score of each peer it knows on the topic (py-libp2p's scorer)."""
    scorer = transport._pubsub.router.scorer
    return {str(p): round(v, 2) for p, v in scorer.get_all_peer_scores([transport.topic]).items()}


STALLED_GETS = [0]


def become_a_staller() -> None:
    """Replace the sync server's handler (before the transport is built): answer ``have`` with nothing held and
    ``peers`` with nobody, and hold every ``get`` without an answer, counting them."""
    import msgpack
    import trio
    from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

    from protocol.transport.libp2p import sync

    async def handle(self: sync.SyncServer, stream: object) -> None:
        try:
            req = msgpack.unpackb(await read_varint_prefixed_bytes_limited(stream, sync.MAX_REQUEST_BYTES))
            if req.get("op") == "get":
                STALLED_GETS[0] += 1
                await trio.sleep(60)
            else:
                await stream.write(encode_varint_prefixed(msgpack.packb([])))  # type: ignore[attr-defined]
            await stream.close()  # type: ignore[attr-defined]
        except Exception:
            pass

    sync.SyncServer.handle = handle  # type: ignore[method-assign]


def announcement() -> bytes:
    """An announcement of a record nobody holds."""
    import msgpack

    return bytes([TAG_ANNOUNCE]) + msgpack.packb({"digest": os.urandom(32), "size": 1000}, use_bin_type=True)


async def run(a: argparse.Namespace) -> dict:
    ident = Identity.load_or_create(a.key) if a.key else Identity.generate()
    if a.staller:
        become_a_staller()
    validator = RecordValidator.from_config(SWARM, PROTOCOL)
    cfg = Libp2pTransportConfig(
        initial_peers=a.bootstrap,
        request_timeout_s=5,
        sync_interval_s=a.sync_interval,
        inline_max_bytes=a.inline_max,
        expiration_windows=8,
        port=a.port,
        host=a.host,
        peer_exchange=not a.no_peer_exchange,
    )
    transport = await Libp2pTransport.create(
        cfg,
        swarm=SWARM,
        validate=validator.verdict,
        protocol=PROTOCOL,
        validate_own=not (a.hostile or a.staller),
        key=NetworkKey.of(ident),
    )
    for addr in transport.addresses():
        print(f"listening on {addr}", flush=True)
    print(f"sender {ident.peer_id}", flush=True)
    senders: set[str] = set()
    tags: set[str] = set()
    peers_seen: set[str] = set()
    handled: set[bytes] = set()
    end = time.monotonic() + a.duration
    published = 0
    done_at: float | None = None
    next_publish = 0.0
    try:
        await asyncio.sleep(a.warmup)
        if a.hostile:
            # GossipSub sends a frame to the mesh as it stands and never again: wait for a neighbour, then send rounds
            # a heartbeat (1 s) apart, so a mesh still forming on a loaded machine gets a later round.
            while not await transport.peers() and time.monotonic() < end:
                await asyncio.sleep(0.2)
            for _ in range(a.repeat):
                for frame in hostile_frames(ident):
                    await transport.publish_raw(frame)
                await asyncio.sleep(1.0)
            if a.also_valid:
                data = record(ident, "hostile-but-valid", 99)
                await transport.publish(data, window=window_of(time.time(), 15), sender=ident.peer_id)
        while a.staller and time.monotonic() < end:
            await transport.publish_raw(announcement())
            await asyncio.sleep(a.every)
        while time.monotonic() < end:
            if not (a.hostile or a.staller) and published < a.records and time.monotonic() >= next_publish:
                next_publish = time.monotonic() + a.every
                data = record(ident, f"{a.tag}|{ident.peer_id} #{published}" + "p" * a.size, published)
                await transport.publish(data, window=window_of(time.time(), 15), sender=ident.peer_id)
                published += 1
            w = window_of(time.time(), 15)
            for data in await transport.fetch_recent([w - 2, w - 1, w, w + 1]):
                if data not in handled:
                    handled.add(data)
                    env = validator.check(data)
                    if env is not None:
                        senders.add(env.sender)
                        if isinstance(env.payload, RolloutBatch) and "|" in env.payload.groups[0].completions[0].text:
                            tags.add(env.payload.groups[0].completions[0].text.split("|", 1)[0])
            peers_seen.update(await transport.peers())
            done = len(senders) >= a.expect and published >= a.records and (not a.expect_tag or a.expect_tag in tags)
            if a.exit_when_done and done:
                done_at = done_at if done_at is not None else time.monotonic()
                if time.monotonic() - done_at >= a.linger:
                    break
            await asyncio.sleep(0.2)
        return {
            "sender": ident.peer_id,
            "senders": sorted(senders),
            "tags": sorted(tags),
            "stats": transport.stats(),
            "peers": sorted(peers_seen),
            "published": published,
            "stalled_gets": STALLED_GETS[0],
            "scores": scores(transport),
        }
    finally:
        await transport.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--bootstrap", action="append", default=[])
    ap.add_argument("--key", type=Path, help="identity key file (kept across restarts; created if missing)")
    ap.add_argument("--port", type=int, default=0, help="TCP port (0: any free port)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    ap.add_argument("--tag", default="", help="the start of the text of every record this peer publishes")
    ap.add_argument("--expect-tag", default="", help="with --exit-when-done: also wait for a record with this tag")
    ap.add_argument("--hostile", action="store_true")
    ap.add_argument("--also-valid", action="store_true", help="hostile: end with one valid record")
    ap.add_argument("--staller", action="store_true", help="announce a record every --every s, never serve one")
    ap.add_argument("--records", type=int, default=3)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--every", type=float, default=4.0, help="seconds between own records")
    ap.add_argument("--repeat", type=int, default=3, help="hostile: rounds of invalid frames")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--exit-when-done", action="store_true")
    ap.add_argument("--linger", type=float, default=5.0, help="seconds to stay up after --expect is met")
    ap.add_argument("--sync-interval", type=float, default=2.0)
    ap.add_argument("--inline-max", type=int, default=900_000)
    ap.add_argument("--no-peer-exchange", action="store_true", help="stay connected to --bootstrap peers only")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    out = asyncio.run(run(a))
    a.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
