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
from protocol.transport.libp2p.transport import TAG_RECORD, Libp2pTransport
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
    return await Libp2pTransport.create(config, swarm=SWARM, validate=validator.verdict, protocol=protocol)


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
    bad[-1] ^= 1  # the signature is the outer map's last value (canonical key order: body, sig)
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


# -- peer exchange: a mesh, not a star ---------------------------------------------------------------------------


async def test_peer_exchange_turns_a_star_into_a_mesh_that_survives_the_bootstrap_leaving(make_transports):
    # Every peer bootstraps from the first one; peer exchange runs by hand here (one round each) so the test does not
    # depend on the background period.
    boot, *rest = await make_transports(6, target_peers=3, peer_exchange_interval_s=3600)
    for t in rest:
        await t.exchange_peers_now()
    boot_id = boot.addresses()[0].rsplit("/p2p/", 1)[1]
    for t in rest:
        others = [p for p in await t.peers() if p != boot_id]
        assert len(others) >= 2, f"{t.addresses()[0]} is only connected to {await t.peers()}"
        assert t.stats()["known_peers"] >= 3
    await boot.close()
    ident = Identity.generate()
    w = now_window()
    data = make_record(ident, window=w, text="after the bootstrap left")
    await rest[0].publish(data, window=w, sender=ident.peer_id)
    for t in rest[1:]:
        await eventually(lambda t=t: t.fetch_recent([w]), lambda r: data in r)


def _host_key():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    kp = create_new_key_pair()
    return kp, ID.from_pubkey(kp.public_key)


def test_advertisements_verify_and_refuse_tampering_other_swarms_staleness_and_foreign_addresses():
    import time

    from protocol.transport.libp2p.peers import AdError, make_ad, verify_ad

    kp, pid = _host_key()
    now = time.time()
    addr = "/ip4/127.0.0.1/tcp/4001"
    raw = make_ad(kp, pid, swarm=SWARM, addrs=[addr], version=(1, 3), now=now)
    ad = verify_ad(raw, swarm=SWARM, now=now, ttl_s=600)
    assert ad.peer == pid.to_base58() and ad.version == (1, 3) and ad.addrs == (f"{addr}/p2p/{ad.peer}",)

    def reason(data: bytes, **kw) -> str:
        with pytest.raises(AdError) as e:
            verify_ad(data, **{"swarm": SWARM, "now": now, "ttl_s": 600, **kw})
        return e.value.reason

    tampered = raw.replace(b"4001", b"4002")
    assert reason(tampered) == "ad_bad_signature"
    assert reason(raw, swarm="other") == "ad_wrong_swarm"
    assert reason(raw, now=now + 601) == "ad_stale"
    assert reason(b"\x92garbage") == "ad_malformed"
    # An address naming another host is refused even when correctly signed.
    _, other = _host_key()
    foreign = make_ad(kp, pid, swarm=SWARM, addrs=[f"{addr}/p2p/{other.to_base58()}"], version=(1, 0), now=now)
    assert reason(foreign) == "ad_malformed"


async def test_a_peer_of_another_major_version_is_reported_once_counted_and_dropped(
    make_transports, monkeypatch, caplog
):
    """The newcomer of another major finishes joining (its peer exchange and its first sync with the bootstrap
    node) only after the bootstrap node has dropped it: neither side dials the other back and stays connected.
    (A CI run once saw the newcomer's first sync, which dials, reconnect the two for good.)"""
    import logging

    import trio

    from protocol import version

    release, joined = threading.Event(), threading.Event()
    plain_join = Libp2pTransport._t_join

    async def held_join(self, bootstrap):
        if self._version[0] == 7:
            await trio.to_thread.run_sync(release.wait, 60)
        await plain_join(self, bootstrap)
        if self._version[0] == 7:
            joined.set()

    monkeypatch.setattr(Libp2pTransport, "_t_join", held_join)
    monkeypatch.setattr(version, "_reported", set())
    (a,) = await make_transports(1, peer_exchange_interval_s=3600)
    version.override_local_version("7.2")
    other = await _start(a.addresses(), peer_exchange_interval_s=3600)
    try:
        version.override_local_version(None)
        caplog.set_level(logging.WARNING, logger="protocol.version")
        for _ in range(3):
            await a.exchange_peers_now()
        ours = version.format_version(version.PROTOCOL_VERSION)
        # Both nodes live in this process, so the 7.2 node's own line (naming our version as theirs) is here too.
        lines = [r.getMessage() for r in caplog.records if f"speaks 7.2, this node speaks {ours}" in r.getMessage()]
        assert len(lines) == 1, lines
        assert lines[0].startswith("incompatible protocol version: libp2p peer ")
        assert a.rejections().get("incompatible_version", 0) >= 1
        assert await a.peers() == []
        release.set()
        assert await asyncio.to_thread(joined.wait, 60)
        # Nothing dialled back while the newcomer joined (once, not eventually: our tick would hide a dial-back).
        assert await a.peers() == []
        await eventually(lambda: other.peers(), lambda peers: peers == [])
    finally:
        release.set()
        version.override_local_version(None)
        await other.close()


async def test_a_neighbour_of_another_major_that_never_hangs_up_is_dropped_at_the_next_tick(
    make_transports, monkeypatch
):
    """A node of another major whose code does not disconnect (an older release, or a hostile one) stays dialled
    in and keeps syncing; our node found its version out only by serving its peer exchange, and drops it at its next
    sync tick without being asked."""
    from protocol import version

    class NeverSet(set):
        def add(self, item):
            pass

    plain_join = Libp2pTransport._t_join

    async def join_never_hanging_up(self, bootstrap):
        if self._version[0] == 7:
            self._incompatible = NeverSet()
        await plain_join(self, bootstrap)

    monkeypatch.setattr(Libp2pTransport, "_t_join", join_never_hanging_up)
    monkeypatch.setattr(version, "_reported", set())
    (a,) = await make_transports(1, peer_exchange_interval_s=3600, sync_interval_s=1.0)
    version.override_local_version("7.2")
    other = await _start(a.addresses(), peer_exchange_interval_s=3600)
    try:
        version.override_local_version(None)

        async def stats():
            return a.stats()

        # Counted as the tick starts the disconnect, so the peer list is read after the count.
        await eventually(stats, lambda st: st.get("px_disconnected_incompatible", 0) >= 1)
        await eventually(lambda: a.peers(), lambda peers: peers == [])
        assert a.rejections().get("incompatible_version", 0) >= 1
        assert other._incompatible == set()  # it never learnt to hang up: the drop was ours
    finally:
        version.override_local_version(None)
        await other.close()


def test_a_message_the_validator_cannot_judge_costs_nobody_score_and_is_not_cached():
    """A failed announce fetch (slow forwarder) or py-libp2p's validation timeout drops that copy only: the
    forwarder keeps its score and the next copy is validated afresh. A message judged invalid still costs its
    forwarder and its verdict is cached."""
    import trio
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID
    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.pubsub.pubsub import ValidationError

    from protocol.transport.libp2p.gossipsub import build_pubsub

    counted: list[str] = []
    cfg = Libp2pTransportConfig(request_timeout_s=0.2)  # py-libp2p's validation timeout
    pubsub, router = build_pubsub(new_host(key_pair=create_new_key_pair()), cfg, counted.append)
    forwarder = ID.from_pubkey(create_new_key_pair().public_key)
    topic = "t"
    verdicts: dict[bytes, str] = {b"slow": "unjudged", b"stuck": "timeout", b"bad": "invalid"}
    calls: list[bytes] = []

    async def validate(_peer, msg) -> bool:
        calls.append(msg.data)
        if verdicts[msg.data] == "unjudged":
            pubsub.unjudged()
        elif verdicts[msg.data] == "timeout":
            await trio.sleep(5)  # cancelled by py-libp2p's own timeout
        return False

    pubsub.set_topic_validator(topic, validate, True)
    scorer = router.scorer
    msgs = {d: rpc_pb2.Message(data=d, topicIDs=[topic], from_id=forwarder.to_bytes(), seqno=d) for d in verdicts}

    async def push(data: bytes) -> None:
        with pytest.raises(ValidationError):
            await pubsub.validate_msg(forwarder, msgs[data])
        scorer.on_invalid_message(forwarder, topic)  # what push_msg does right after a failed validation

    async def main() -> None:
        await push(b"slow")
        await push(b"slow")  # not cached: the validator runs again
        assert calls == [b"slow", b"slow"] and counted == ["unjudged", "unjudged"]
        await push(b"stuck")  # py-libp2p's validation timeout is no verdict either
        await push(b"stuck")
        assert calls == [b"slow", b"slow", b"stuck", b"stuck"] and counted.count("unjudged") == 4
        assert scorer.score(forwarder, [topic]) == 0.0
        await push(b"bad")
        await push(b"bad")  # cached: refused without running the validator, penalized again
        assert calls == [b"slow", b"slow", b"stuck", b"stuck", b"bad"]
        assert scorer.score(forwarder, [topic]) < 0.0

    trio.run(main)


def _scored_pubsub():
    """A CountingPubsub (not started) with its router's scorer, a topic, and a message maker."""
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID
    from libp2p.pubsub.pb import rpc_pb2

    from protocol.transport.libp2p.gossipsub import build_pubsub

    counted: list[str] = []
    pubsub, router = build_pubsub(new_host(key_pair=create_new_key_pair()), Libp2pTransportConfig(), counted.append)
    origin = ID.from_pubkey(create_new_key_pair().public_key)

    def message(seqno: bytes):
        return rpc_pb2.Message(data=b"announce", topicIDs=["t"], from_id=origin.to_bytes(), seqno=seqno)

    def peers(n: int) -> list:
        return [ID.from_pubkey(create_new_key_pair().public_key) for _ in range(n)]

    async def push(forwarder, msg) -> None:
        """A copy from ``forwarder`` that fails validation, scored as py-libp2p's push_msg scores it."""
        from libp2p.pubsub.pubsub import ValidationError

        with pytest.raises(ValidationError):
            await pubsub.validate_msg(forwarder, msg)
        router.scorer.on_invalid_message(forwarder, "t")

    return pubsub, router.scorer, counted, message, peers, push


def test_copies_of_one_message_that_fail_unjudged_together_cost_none_of_their_forwarders():
    """Every neighbour forwards an announcement, so several copies of one message are validated at the same time.
    When each of them ends unjudged, no forwarder loses score and no verdict is cached; a copy later judged invalid
    still costs its forwarder."""
    import trio

    pubsub, scorer, counted, message, peers, push_copy = _scored_pubsub()
    forwarders = peers(4)
    msg = message(b"1")
    calls = 0
    judge = False

    async def validate(_peer, m) -> bool:
        nonlocal calls
        calls += 1
        await release.wait()
        if not judge:
            pubsub.unjudged()
        return False

    pubsub.set_topic_validator("t", validate, True)

    async def push(forwarder) -> None:
        await push_copy(forwarder, msg)

    async def main() -> None:
        nonlocal judge
        async with trio.open_nursery() as nursery:
            for f in forwarders:
                nursery.start_soon(push, f)
            await trio.sleep(0.05)
            assert calls == len(forwarders)  # all copies are in validation at the same time
            release.set()
        assert [scorer.score(f, ["t"]) for f in forwarders] == [0.0] * len(forwarders)
        assert counted.count("unjudged") == len(forwarders)
        judge = True
        await push(forwarders[0])  # not cached: validated afresh, and this time judged invalid
        await push(forwarders[1])  # that verdict is cached: refused without the validator, penalized
        assert calls == len(forwarders) + 1
        assert scorer.score(forwarders[0], ["t"]) < 0.0 and scorer.score(forwarders[1], ["t"]) < 0.0

    release = trio.Event()
    trio.run(main)


def _race_an_unjudged_copy_against_a_failing_forwarder() -> None:
    import trio

    pubsub, scorer, _, message, peers, push_copy = _scored_pubsub()
    slow, empty = peers(2)
    msg = message(b"1")
    release = trio.Event()

    async def validate(peer, m) -> bool:
        await release.wait()
        if peer == slow:
            pubsub.unjudged()
        else:
            pubsub.forwarder_failed()
        return False

    pubsub.set_topic_validator("t", validate, True)

    async def push(forwarder) -> None:
        await push_copy(forwarder, msg)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(push, slow)
            nursery.start_soon(push, empty)
            await trio.sleep(0.01)
            release.set()  # both validations end in the same scheduler round, in trio's (random) order

    trio.run(main)
    assert scorer.score(slow, ["t"]) == 0.0 and scorer.score(empty, ["t"]) < 0.0
    assert pubsub._msg_id_constructor(msg) not in pubsub.validation_cache.cache


def test_concurrent_copies_each_get_their_own_qualifier():
    """One copy's validation ends unjudged and another's with its forwarder failing, in the same scheduler round:
    only the failing forwarder loses score (a qualifier must not pass from one copy to the other)."""
    for _ in range(20):
        _race_an_unjudged_copy_against_a_failing_forwarder()


def test_a_qualifier_outside_a_validation_is_a_clear_error():
    pubsub, *_ = _scored_pubsub()
    with pytest.raises(RuntimeError, match="topic validator"):
        pubsub.unjudged()


def test_an_announcement_its_forwarder_cannot_serve_costs_that_forwarder_only():
    """A forwarder that announced a record and then did not serve it pays a P4 point; the announcement itself is not
    judged, so the same message from another forwarder is validated afresh (and here passes)."""
    import trio
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID
    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.pubsub.pubsub import ValidationError

    from protocol.transport.libp2p.gossipsub import build_pubsub

    pubsub, router = build_pubsub(new_host(key_pair=create_new_key_pair()), Libp2pTransportConfig(), lambda r: None)
    empty, serving = (ID.from_pubkey(create_new_key_pair().public_key) for _ in range(2))
    topic = "t"
    msg = rpc_pb2.Message(data=b"announce", topicIDs=[topic], from_id=serving.to_bytes(), seqno=b"1")
    asked: list[ID] = []

    async def validate(peer, m) -> bool:
        asked.append(peer)
        if peer == empty:
            pubsub.forwarder_failed()
            return False
        return True

    pubsub.set_topic_validator(topic, validate, True)
    scorer = router.scorer

    async def main() -> None:
        with pytest.raises(ValidationError):
            await pubsub.validate_msg(empty, msg)
        scorer.on_invalid_message(empty, topic)  # what push_msg does right after a failed validation
        await pubsub.validate_msg(serving, msg)  # not refused from the cache: asked afresh, and valid
        assert asked == [empty, serving]
        assert scorer.score(empty, [topic]) < 0.0 and scorer.score(serving, [topic]) == 0.0

    trio.run(main)


class _AnnounceRig:
    """A transport whose announce validator runs against fakes for the host, the sync client and pubsub (the
    constructor starts nothing). ``serve[peer]`` says what a fetch from that peer does: "ok", "empty", "fail" or
    "hang" (until the fetch times out)."""

    def __init__(self, n_forwarders: int) -> None:
        import trio
        from libp2p.crypto.ed25519 import create_new_key_pair
        from libp2p.peer.id import ID

        self.records: dict[bytes, bytes] = {}
        self.body = self.announcement()
        self.digest, self.record = next(iter(self.records.items()))
        me, *self.forwarders = (ID.from_pubkey(create_new_key_pair().public_key) for _ in range(n_forwarders + 1))
        self.serve = {f: "ok" for f in self.forwarders}
        self.fetched: list = []
        self.qualified: list[str] = []
        self.release = None
        rig = self

        class Sync:
            async def get(self, peer, digests):
                rig.fetched.append(peer)
                if rig.release is not None:
                    await rig.release.wait()
                if rig.serve[peer] == "fail":
                    raise ConnectionError("stream reset")
                if rig.serve[peer] == "hang":
                    await trio.sleep_forever()
                return [rig.records[digests[0]]] if rig.serve[peer] == "ok" else []

        class Host:
            def get_id(self):
                return me

        class Pubsub:
            def unjudged(self):
                rig.qualified.append("unjudged")

            def forwarder_failed(self):
                rig.qualified.append("forwarder_failed")

        validator = RecordValidator.from_config(SWARM, PROTOCOL)
        self.t = Libp2pTransport(Libp2pTransportConfig(inline_max_bytes=1024), PROTOCOL, SWARM, validator.verdict)
        self.t._sync, self.t._host, self.t._pubsub = Sync(), Host(), Pubsub()

    def announcement(self) -> bytes:
        """The announcement body of a new record that every "ok" forwarder serves."""
        import msgpack

        from protocol.transport.libp2p.store import digest_of

        record = make_record(Identity.generate(), window=now_window(), size=2000)
        self.records[digest_of(record)] = record
        return msgpack.packb({"digest": digest_of(record), "size": len(record)}, use_bin_type=True)

    async def validate(self, i: int, verdicts: dict[int, bool], body: bytes | None = None) -> None:
        verdicts[i] = await self.t._t_validate_announce(self.forwarders[i], body or self.body, object())


def test_copies_of_an_announcement_being_fetched_are_dropped_at_once_and_the_record_is_fetched_once():
    """py-libp2p validates every copy of a message until one passes, each in one of its 10 validator slots; copies
    of an announcement whose record is being fetched must not sit in those slots waiting for that fetch."""
    import trio

    rig = _AnnounceRig(3)
    verdicts: dict[int, bool] = {}

    async def main() -> None:
        rig.release = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rig.validate, 0, verdicts)
            await trio.sleep(0.05)  # the first copy is fetching
            for i in (1, 2):
                nursery.start_soon(rig.validate, i, verdicts)
            await trio.sleep(0.05)
            assert verdicts == {1: False, 2: False}, "later copies are dropped without waiting for the fetch"
            assert rig.qualified == ["unjudged", "unjudged"], "and unjudged (no penalty, no cache)"
            rig.release.set()
        assert verdicts[0] is True and rig.fetched == [rig.forwarders[0]] and rig.t._store.has(rig.digest)
        assert rig.t.stats().get("announce_copy_in_flight") == 2 and not rig.t._fetching

    trio.run(main)


@pytest.mark.parametrize("first", ["fail", "empty"])
def test_when_the_fetch_fails_the_forwarders_of_the_dropped_copies_are_asked(first):
    """They hold the record (a peer forwards an announcement only once it has it): after the first fetch fails
    (a timeout is no verdict; an empty answer costs that forwarder), they are asked in turn, in the background."""
    import trio

    rig = _AnnounceRig(3)
    rig.serve[rig.forwarders[0]] = first
    rig.serve[rig.forwarders[1]] = "fail"
    verdicts: dict[int, bool] = {}

    async def main() -> None:
        rig.release = trio.Event()
        async with trio.open_nursery() as nursery:
            rig.t._nursery = nursery
            nursery.start_soon(rig.validate, 0, verdicts)
            await trio.sleep(0.05)
            for i in (1, 2, 1):  # forwarder 1 twice: remembered once
                nursery.start_soon(rig.validate, i, verdicts)
                await trio.sleep(0.01)
            rig.release.set()
        assert verdicts[0] is False and rig.fetched == rig.forwarders[:3]
        assert rig.qualified[-1] == ("unjudged" if first == "fail" else "forwarder_failed")
        assert rig.t._store.has(rig.digest) and rig.t.stats().get("fetched_large_retry") == 1
        assert rig.t.stats()["drops"].get("announce_retry_failed") == 1 and not rig.t._fetching
        if first == "empty":
            assert rig.t.rejections().get("announce_unavailable") == 1

    trio.run(main)


def test_a_forwarder_that_stalls_holds_at_most_two_validator_slots_and_is_then_held_off():
    """A peer that announces records and never serves them must not fill py-libp2p's validator slots, however fast
    it announces (SPEC 7.3): two of its fetches at a time, then none until its backoff runs out; other forwarders of
    the same announcements are still asked."""
    import trio
    import trio.testing

    rig = _AnnounceRig(2)
    staller, honest = rig.forwarders
    rig.serve[staller] = "hang"
    bodies = [rig.body] + [rig.announcement() for _ in range(3)]
    verdicts: dict[int, bool] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            rig.t._nursery = nursery
            for i in range(3):  # one at a time: trio runs tasks started together in a random order
                nursery.start_soon(lambda i=i: _record_verdict(rig, staller, bodies[i], verdicts, i))
                await trio.sleep(0.01)
            assert verdicts == {2: False} and rig.t.stats().get("announce_forwarder_busy") == 1, "third: busy"
            await trio.sleep(10)  # both fetches time out (0.8 x request_timeout_s = 8 s)
            assert verdicts == {0: False, 1: False, 2: False} and rig.fetched == [staller, staller]
            await _record_verdict(rig, staller, bodies[3], verdicts, 3)
            assert verdicts[3] is False and rig.fetched == [staller, staller], "held off: not asked at all"
            assert rig.t.stats().get("announce_forwarder_held_off") == 1
            await _record_verdict(rig, honest, bodies[3], verdicts, 4)
            assert verdicts[4] is True and rig.fetched[-1] == honest, "the same announcement from another forwarder"
            await trio.sleep(12)  # 14 s after the failures (at 8 s): past the base backoff (10 s), not its double
            await _record_verdict(rig, staller, bodies[2], verdicts, 5)
            assert verdicts[5] is False and rig.t.stats().get("announce_forwarder_held_off") == 2, "doubled"
            await trio.sleep(8)  # 22 s after: past the doubled backoff (20 s)
            nursery.start_soon(lambda: _record_verdict(rig, staller, bodies[2], verdicts, 6))
            await trio.sleep(1)
            assert rig.fetched[-1] == staller, "asked again once its backoff has run out"
            nursery.cancel_scope.cancel()
        assert rig.qualified.count("unjudged") == 5 and "forwarder_failed" not in rig.qualified, "no score lost"

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_announce_fetch_cancelled_from_outside_does_not_leave_its_record_marked_as_being_fetched():
    """py-libp2p's validation timeout starts while a copy still queues for a validator slot, so it can cancel our
    fetch. Later copies of the announcement must still be fetched (from their own forwarders), and the cancelled
    fetch's forwarder must not be held off for it."""
    import trio

    rig = _AnnounceRig(2)
    first, second = rig.forwarders
    rig.serve[first] = "hang"
    verdicts: dict[int, bool] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            rig.t._nursery = nursery
            with trio.move_on_after(1):  # cancels the validation long before its own 0.8 x timeout
                await _record_verdict(rig, first, rig.body, verdicts, 0)
            assert 0 not in verdicts and rig.fetched == [first] and rig.digest not in rig.t._fetching
            assert rig.t._forwarders.refusal(first, trio.current_time()) is None, "no verdict on the forwarder"
            await _record_verdict(rig, second, rig.body, verdicts, 1)
        assert verdicts[1] is True and rig.fetched == [first, second] and rig.t._store.has(rig.digest)

    trio.run(main)


async def _record_verdict(rig: _AnnounceRig, forwarder, body: bytes, verdicts: dict[int, bool], i: int) -> None:
    verdicts[i] = await rig.t._t_validate_announce(forwarder, body, object())


class _ScriptedStream:
    """A sync stream whose request bytes are given and whose writes fail with ``write_error`` (if any)."""

    def __init__(self, request: bytes, write_error: Exception | None = None):
        self.data = request
        self.write_error = write_error
        self.written: list[bytes] = []

    async def read(self, n: int = -1) -> bytes:
        out, self.data = (self.data, b"") if n < 0 else (self.data[:n], self.data[n:])
        return out

    async def write(self, data: bytes) -> None:
        if self.write_error is not None:
            raise self.write_error
        self.written.append(data)

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("request_bytes", "write_error", "reason"),
    [
        (b"\x05garbage", None, "sync_bad_request"),  # a frame that is not MessagePack
        (b"\xff\xff\xff\xff\x0f", None, "sync_bad_request"),  # a length prefix past the request limit
        ("have", "reset", "sync_serve_failed"),  # a fine request whose requester went away mid-answer
        (b"\x10abc", None, "sync_serve_failed"),  # a frame cut short: the stream ended under it
    ],
)
def test_sync_server_tells_a_bad_request_from_a_broken_stream(request_bytes, write_error, reason):
    import msgpack
    import trio
    from libp2p.network.stream.exceptions import StreamReset
    from libp2p.utils.varint import encode_varint_prefixed

    from protocol.transport.libp2p.store import Counters, RecordStore
    from protocol.transport.libp2p.sync import SyncServer

    if request_bytes == "have":
        request_bytes = encode_varint_prefixed(msgpack.packb({"op": "have", "windows": [1]}))
    stream = _ScriptedStream(request_bytes, StreamReset("reset") if write_error else None)
    counters = Counters()
    server = SyncServer(RecordStore(4, 64), counters, timeout=5, on_peers=lambda ad: [])
    trio.run(server.handle, stream)
    assert dict(counters.drops) == {reason: 1}


def test_py_libp2p_derives_the_spec_peer_id_from_the_identity_seed():
    """SPEC 1: the host key built from an identity's seed is that identity's key pair, and py-libp2p's own peer id
    of it is the one SPEC gives for the example key (what ``NetworkKey.peer_id`` computes)."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    from protocol.transport.netkey import NetworkKey

    alice = Identity.from_private_bytes(bytes(range(32)))
    kp = create_new_key_pair(NetworkKey.of(alice).seed)
    assert kp.public_key.to_bytes() == alice.public_bytes
    assert ID.from_pubkey(kp.public_key).to_base58() == "12D3KooWA4Xop1JaT3MHxwYMkCepYsv4iPVopMXwCz5iHYdBfeSB"
    for ident in (Identity.generate(), Identity.generate()):
        kp = create_new_key_pair(NetworkKey.of(ident).seed)
        assert ID.from_pubkey(kp.public_key).to_base58() == NetworkKey.of(ident).peer_id


async def test_the_factory_gives_the_host_the_identity_key_and_a_fresh_key_without_one():
    from protocol.transport.factory import create_transport
    from protocol.transport.netkey import NetworkKey

    ident = Identity.generate()
    cfg = Libp2pTransportConfig(request_timeout_s=5)
    t = await create_transport(cfg, swarm=SWARM, peer_id=ident.peer_id, protocol=PROTOCOL, identity=ident)
    try:
        assert t.addresses() and all(a.endswith(f"/p2p/{NetworkKey.of(ident).peer_id}") for a in t.addresses())
    finally:
        await t.close()
    other = await create_transport(cfg, swarm=SWARM, peer_id="x", protocol=PROTOCOL)
    try:
        assert not any(NetworkKey.of(ident).peer_id in a for a in other.addresses())
    finally:
        await other.close()


def test_py_libp2p_builds_and_accepts_the_spec_gossip_trace():
    """SPEC 7.6's trace is what py-libp2p signs and checks: its own protobuf of the same fields is the same bytes, its
    signature validator accepts it, and the advertisement a hivemind node makes (without libp2p) verifies here."""
    import time

    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.pubsub.validators import signature_validator

    from protocol.transport.gossip import make_ad
    from protocol.transport.libp2p.peers import verify_ad
    from protocol.transport.netkey import NetworkKey
    from tests.unit.protocol.test_gossip_vector import SEQNO, crossing
    from tests.unit.protocol.test_records import ALICE

    c = crossing()
    key = NetworkKey.of(ALICE)
    msg = rpc_pb2.Message(from_id=key.peer_id_bytes, data=c["data"], seqno=SEQNO, topicIDs=["rl-swarm/spec/records/1"])
    assert msg.SerializeToString() == c["unsigned"]
    msg.signature = c["signature"]
    msg.key = key.public_protobuf()
    assert msg.SerializeToString() == c["message"]
    assert signature_validator(msg)
    msg.ClearField("key")  # as go-libp2p sends it
    assert msg.SerializeToString() == c["message_go"] and signature_validator(msg)
    msg.data = c["data"][:-1] + b"\x00"
    assert not signature_validator(msg)

    addr = f"/ip4/127.0.0.1/tcp/1/p2p/{key.peer_id}"
    ad = make_ad(key.seed, key.peer_id_bytes, swarm=SWARM, addrs=[addr], version=(2, 2), now=time.time())
    assert verify_ad(ad, swarm=SWARM, now=time.time(), ttl_s=600).addrs == (addr,)


async def test_a_record_over_our_cap_does_not_block_sync_with_the_peer_that_holds_it(make_transports):
    """A peer whose ``max_record_bytes`` is larger lists a record we cannot take: the sync batch that holds it is asked
    again record by record, the large one is remembered and never asked for again, and the others arrive."""
    (a,) = await make_transports(1)  # max_record_bytes 1 MiB
    ident = Identity.generate()
    w = now_window()
    large = make_record(ident, window=w, text="large", size=200_000)
    small = make_record(ident, window=w, text="small")
    for data in (large, small):
        await a.publish(data, window=w, sender=ident.peer_id)
    await asyncio.sleep(4.0)  # past GossipSub's gossip window: only sync can bring them now
    late = await _start(a.addresses(), ProtocolConfig(window_seconds=WINDOW_SECONDS, max_record_bytes=128 * 1024))
    try:
        await eventually(lambda: late.fetch_recent([w]), lambda r: small in r)
        await late.sync_now()
        drops = late.stats()["drops"]
        assert drops.get("sync_too_large") == 1 and not drops.get("sync_failed"), drops
        assert large not in await late.fetch_recent([w])
    finally:
        await late.close()
