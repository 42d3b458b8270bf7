"""The libp2p transport in one process: the shared Transport contract suite plus its own guarantees
(announce-then-fetch of large records, catch-up of a late joiner, edge validation, clean close, bootstrap errors).

Run only in a process that never imports hivemind: ``python -m pytest tests/libp2p_isolated/contract_lp2p.py``.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from protocol.errors import TransportError
from protocol.identity import Identity
from protocol.records import encode_record
from protocol.transport.config import Libp2pTransportConfig, ProtocolConfig
from protocol.transport.libp2p_gossip import TAG_RECORD, Libp2pTransport
from protocol.validation import RecordValidator
from tests.contract.transport_contract import *  # noqa: F403
from tests.contract.transport_contract import (
    SWARM,
    WINDOW_SECONDS,
    bootstrapped_transports,
    eventually,
    make_record,
    now_window,
)

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

PROTOCOL = ProtocolConfig(window_seconds=WINDOW_SECONDS)


async def _start(initial_peers: list[str], protocol: ProtocolConfig = PROTOCOL, **cfg) -> Libp2pTransport:
    validator = RecordValidator.from_config(SWARM, protocol)
    config = Libp2pTransportConfig(initial_peers=initial_peers, request_timeout_s=5, **cfg)
    return await Libp2pTransport.create(config, swarm=SWARM, validate=validator.is_storable, protocol=protocol)


make_transports = bootstrapped_transports(_start)


def _libp2p_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("libp2p-")]


async def test_addresses_are_full_multiaddrs(make_transports):
    (a,) = await make_transports(1)
    (addr,) = [x for x in a.addresses() if x.startswith("/ip4/127.0.0.1/")]
    assert "/tcp/" in addr and "/p2p/" in addr


async def test_large_record_is_announced_then_fetched(make_transports):
    a, b, c = await make_transports(3, inline_max_bytes=50_000)
    ident = Identity.generate()
    w = now_window()
    data = make_record(ident, window=w, size=200_000)
    await a.publish(data, window=w, sender=ident.peer_id)
    for t in (b, c):
        await eventually(lambda t=t: t.fetch_recent([w]), lambda r: data in r)
    assert b.stats().get("fetched_large", 0) + b.stats().get("synced", 0) >= 1


async def test_late_joiner_catches_up_through_sync(make_transports):
    (a,) = await make_transports(1)
    ident = Identity.generate()
    w = now_window()
    records = [make_record(ident, window=w, text=f"early{i}") for i in range(5)]
    for data in records:
        await a.publish(data, window=w, sender=ident.peer_id)
    late = await _start(a.addresses())
    try:
        await eventually(lambda: late.fetch_recent([w]), lambda r: all(d in r for d in records))
        # Replayed from the publisher's gossip cache or pulled by the sync protocol, whichever came first.
        stats = late.stats()
        assert stats.get("synced", 0) + stats.get("gossip_records", 0) >= 5
    finally:
        await late.close()


async def test_edge_validation_rejects_and_counts_bad_records(make_transports):
    (honest,) = await make_transports(1)
    hostile = await Libp2pTransport.create(
        Libp2pTransportConfig(initial_peers=honest.addresses(), request_timeout_s=5),
        swarm=SWARM,
        protocol=PROTOCOL,
        validate_own=False,
    )
    try:
        await eventually(honest.peers, lambda p: len(p) >= 1)
        await asyncio.sleep(1.5)  # one heartbeat: hostile is in honest's view of the topic
        ident = Identity.generate()
        w = now_window()
        good = make_record(ident, window=w, size=2000)
        tampered = bytearray(good)
        tampered[tampered.index(b"y" * 16)] = ord("z")
        other_swarm = encode_record(
            ident, kind="rollouts", swarm="another-swarm", seq=1, window=w, created=0.0, payload=_payload()
        )
        for frame in (bytes(tampered), other_swarm, b"\x00garbage"):
            await hostile.publish_raw(bytes([TAG_RECORD]) + frame)
        await hostile.publish_raw(b"\x07unknown tag")
        rej = await eventually(lambda: _async(honest.rejections()), lambda r: sum(r.values()) >= 4, timeout=20)
        assert rej.get("bad_signature", 0) >= 1 and rej.get("wrong_swarm", 0) >= 1
        assert rej.get("malformed", 0) >= 1
        assert await honest.fetch_recent([w]) == []
        # The hostile node's own valid record still gets through (it is judged per record, not per peer).
        await hostile.publish(good, window=w, sender=ident.peer_id)
        await eventually(lambda: honest.fetch_recent([w]), lambda r: r == [good])
    finally:
        await hostile.close()


async def test_own_invalid_record_is_refused_with_reason(make_transports):
    (a,) = await make_transports(1)
    ident = Identity.generate()
    bad = bytearray(make_record(ident))
    bad[bad.index(b"m")] ^= 1
    with pytest.raises(TransportError, match="bad_signature|malformed|non_canonical"):
        await a.publish(bytes(bad), window=now_window(), sender=ident.peer_id)


async def test_close_leaves_no_threads():
    before = len(_libp2p_threads())
    a = await _start([])
    b = await _start(a.addresses())
    await eventually(b.peers, lambda p: len(p) >= 1)
    await a.close()
    await b.close()
    await b.close()
    assert len(_libp2p_threads()) == before


async def test_bootstrap_failure_is_a_transport_error():
    bogus = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWCY9GtMZB47pjfuy1VLPuoYm4gHm15kLmLgu4UDnSDiSt"
    before = len(_libp2p_threads())
    with pytest.raises(TransportError):
        await _start([bogus], startup_timeout_s=10)
    assert len(_libp2p_threads()) == before


async def _async(value):
    return value


def _payload():
    from protocol.types import Completion, Group, RolloutBatch, TaskRef

    return RolloutBatch("m", 0, "t", (Group(TaskRef("chain_sum", {}, 0, 1), (Completion("x", 1),)),))
