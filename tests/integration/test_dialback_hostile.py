"""Dial-back abuse (SPEC 9): no single peer, and no crowd of peers in one network, takes a reachable node out of the
DHT; answers from two networks do.

Every node is a real hivemind DHT with its own p2pd on the loopback interface. Linux routes all of 127.0.0.0/8 to
loopback and go-libp2p dials from its listening address, so a peer bound to 127.1.0.1 is seen at 127.1.0.1: peers
bound in distinct /16s of 127/8 stand for peers in distinct networks (``reach.network_of``).
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter

import msgpack
import pytest
from hivemind.p2p import P2P

from protocol.transport.config import HivemindTransportConfig, ProtocolConfig
from protocol.transport.hivemind import reach
from protocol.transport.hivemind.transport import HivemindTransport
from protocol.validation import RecordValidator
from tests.contract.transport_contract import SWARM, WINDOW_SECONDS

pytestmark = [pytest.mark.network, pytest.mark.timeout(150)]

PROTOCOL = ProtocolConfig(window_seconds=WINDOW_SECONDS)


async def _start(initial_peers: list[str], **cfg) -> HivemindTransport:
    validator = RecordValidator.from_config(SWARM, PROTOCOL)
    config = HivemindTransportConfig(initial_peers=initial_peers, request_timeout_s=5, **cfg)
    return await HivemindTransport.create(config, swarm=SWARM, validate=validator.verdict, protocol=PROTOCOL)


async def _connected(t: HivemindTransport, n: int) -> None:
    """Wait until ``t``'s daemon has at least ``n`` connected peers."""

    async def count() -> int:
        return len(await t._node.p2p.list_peers())

    for _ in range(100):
        if await t._runner.call(count(), timeout=10) >= n:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"fewer than {n} peers connected")


async def _recheck(t: HivemindTransport) -> None:
    """One reachability check of ``t``, as its background loop runs it (probe, then serve or stop serving)."""
    await t._runner.call(t._reach_step(), timeout=60)


def _serving(t: HivemindTransport) -> bool:
    return t.stats()["client_mode"] == 0.0


async def test_lying_silent_and_hanging_up_probers_cannot_demote_a_serving_node():
    """The independent client's finding: one peer answering "no port open" made a reachable node that had started
    the swarm a DHT client. Here two liars (one network), a peer that never answers and one that closes the stream
    at once are all the node's peers; it keeps serving and a newcomer still bootstraps from it."""
    asked: Counter[str] = Counter()
    release = asyncio.Event()

    def prober(kind: str):
        async def handle(info, reader, writer) -> None:
            asked[kind] += 1
            if kind == "closes":
                writer.close()
                return
            await reader.read(256)
            if kind == "silent":
                await release.wait()  # holds the stream open, saying nothing, until the test ends
            writer.write(msgpack.packb({"ip": "127.0.0.1", "open": []}))
            await writer.drain()
            writer.close()

        return handle

    a = await _start([])
    hostile: list[P2P] = []
    newcomer = None
    try:
        assert _serving(a)
        for host, kind in [("127.1.0.1", "lies"), ("127.1.0.2", "lies"), ("127.2.0.1", "silent"),
                           ("127.3.0.1", "closes")]:  # fmt: skip
            p2p = await P2P.create(initial_peers=a.addresses(), host_maddrs=[f"/ip4/{host}/tcp/0"])
            await p2p.add_binary_stream_handler(reach.DIALBACK, prober(kind))
            hostile.append(p2p)
        await _connected(a, 4)
        for _ in range(5):  # until every prober took a probe (a busy machine may delay a stream): each one is a try
            await _recheck(a)
            assert _serving(a), "two liars in one network made a reachable node a DHT client"
            assert a.reachability != reach.UNREACHABLE
            if asked["lies"] >= 2 and asked["silent"] >= 1 and asked["closes"] >= 1:
                break
        assert asked["lies"] >= 2 and asked["silent"] >= 1 and asked["closes"] >= 1, asked
        # still a DHT server: a newcomer's bootstrap ping is answered and puts it in the newcomer's table
        newcomer = await _start(a.addresses(), host="127.4.0.1")
        assert await newcomer.peers(), "the node stopped answering DHT pings"
    finally:
        release.set()
        for t in (newcomer, a):
            if t is not None:
                await t.close()
        for p2p in hostile:
            await p2p.shutdown()


async def test_honest_answers_from_two_networks_demote_a_node_nobody_can_dial(monkeypatch):
    """A node that announces a port nobody listens on (a broken port forward) is unreachable there. One honest peer
    saying so is not enough (it could be lying); peers in two networks saying so are, and the node stops serving."""
    monkeypatch.setattr(reach, "PROBE_COOLDOWN_S", 0.0)  # the answerers run in this process: re-ask at once
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen, closed = s.getsockname()[1], None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    a = await _start([], port=listen, announce_maddrs=[f"/ip4/127.0.0.1/tcp/{closed}"])
    peers: list[HivemindTransport] = []
    try:
        peer_id = a.addresses()[0].rsplit("/p2p/", 1)[1]
        boot = [f"/ip4/127.0.0.1/tcp/{listen}/p2p/{peer_id}"]
        peers.append(await _start(boot, host="127.1.0.1"))
        await _connected(a, 1)
        await _recheck(a)
        assert _serving(a), "one peer's answer demoted the node"
        peers.append(await _start(boot, host="127.2.0.1"))
        await _connected(a, 2)
        for _ in range(5):  # a probe that missed an answer (a stream slow to open on a busy machine) decides nothing
            await _recheck(a)
            if not _serving(a):
                break
        assert not _serving(a), await a._runner.call(a._probe(), timeout=60)
        assert a.reachability == reach.UNREACHABLE
    finally:
        for t in (*peers, a):
            await t.close()
