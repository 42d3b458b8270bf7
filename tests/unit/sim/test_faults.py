"""Fault wrappers: each distorts traffic as documented, they compose, and the validator catches the attacks."""

import random

from protocol.channel import Channel
from protocol.identity import Identity
from protocol.layout import IndexWriter
from protocol.records import encode_record
from protocol.transport.config import ProtocolConfig
from protocol.transport.memory import MemoryNetwork, MemoryTransport
from protocol.types import Completion, Group, RolloutBatch, TaskRef
from protocol.validation import RecordValidator
from sim.faults import Delay, Drop, Duplicate, Flood, Forge, Replay, Tamper, flip_bits

WS = 15


class Clock:
    def __init__(self, t=1_700_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def batch(i=0, reward=0.0) -> RolloutBatch:
    comps = (Completion("a", 1, reward_hint=reward), Completion("b", 1, reward_hint=reward))
    return RolloutBatch("m", i, "t", (Group(TaskRef("chain_sum", {}, 0, i), comps),))


def validator(clock, quota=16) -> RecordValidator:
    return RecordValidator("s", WS, 1 << 20, 1, 4, quota, clock=clock)


async def pair(clock, wrap_a=lambda t: t, wrap_b=lambda t: t, quota=16):
    net = MemoryNetwork(clock=clock)
    a = await Channel.create(Identity.generate(), wrap_a(MemoryTransport(net, "a")), validator(clock))
    b = await Channel.create(Identity.generate(), wrap_b(MemoryTransport(net, "b")), validator(clock, quota))
    return a, b


async def test_drop_all_and_none():
    clock = Clock()
    a, b = await pair(clock, wrap_a=lambda t: Drop(t, publish=1.0))
    await a.publish("rollouts", batch())
    assert await b.poll() == [] and a.transport.dropped == 1
    a, b = await pair(clock, wrap_b=lambda t: Drop(t, fetch=0.0))
    await a.publish("rollouts", batch())
    assert len(await b.poll()) == 1


def listed(ident: Identity, swarm: str = "s") -> IndexWriter:
    return IndexWriter(ident, swarm)


async def test_drop_on_fetch_is_seeded():
    net = MemoryNetwork()
    src = MemoryTransport(net, "src")
    writer = listed(Identity.generate())
    for i in range(50):
        data = bytes([i])
        await src.publish(data, window=1, sender=writer.identity.peer_id, index=writer.add(data, 1))
    big = ProtocolConfig(poll_records=64)
    r1 = await Drop(MemoryTransport(net, "r1", protocol=big), fetch=0.5, seed=4).fetch_recent([1])
    r2 = await Drop(MemoryTransport(net, "r2", protocol=big), fetch=0.5, seed=4).fetch_recent([1])
    assert r1 == r2 and 10 < len(r1) < 40


async def test_delay_holds_records_until_the_clock_passes():
    clock = Clock()
    a, b = await pair(clock, wrap_b=lambda t: Delay(t, fetch_s=5.0, clock=clock))
    await a.publish("rollouts", batch())
    assert await b.poll() == []
    clock.t += 5
    assert len(await b.poll()) == 1


async def test_duplicate_publish_and_fetch():
    net = MemoryNetwork()
    d = Duplicate(MemoryTransport(net, "a"), publish=1.0, fetch=1.0)
    writer = listed(Identity.generate())
    await d.publish(b"x", window=1, sender=writer.identity.peer_id, index=writer.add(b"x", 1))
    # The record is stored once (content addressed); the fetch side returns each record twice.
    assert net.stats["published"] == 2
    assert await d.fetch_recent([1]) == [b"x"] * 2


async def test_tamper_is_caught_by_the_validator():
    clock = Clock()
    a, b = await pair(clock, wrap_a=lambda t: Tamper(t, p=1.0, flips=3, seed=1))
    a.transport.list_as(a.index_writer)  # the attacker lists its tampered bytes under its own identity
    for i in range(20):
        await a.publish("rollouts", batch(i))
    assert await b.poll() == [] and await b.poll() == []  # 20 records: two polls' budget of 10
    m = b.metrics()
    assert m["rejected_total"] == 20 and m["received"] == 0


def test_flip_bits_changes_data():
    rng = random.Random(0)
    assert flip_bits(b"\x00" * 10, rng) != b"\x00" * 10 and flip_bits(b"", rng) == b""


async def test_replay_is_caught():
    clock = Clock()
    a, b = await pair(clock, wrap_a=lambda t: Replay(t, p=1.0, copies=2, seed=0))
    a.transport.list_as(a.index_writer)
    await a.publish("rollouts", batch(0))
    assert len(await b.poll()) == 1
    clock.t += WS  # next window: replays are stored under the new window key
    await a.publish("rollouts", batch(1))
    got = await b.poll()
    assert [e.payload.policy_version for e in got] == [1]
    assert a.transport.replayed == 2
    # identical bytes are skipped before validation; re-keyed copies reach the validator as replays
    assert b.metrics()["duplicates"] + b.metrics()["rejected"]["replay"] >= 1


async def test_replay_of_old_records_is_stale():
    clock = Clock()
    net = MemoryNetwork(clock=clock)
    victim = Identity.generate()
    old = encode_record(
        victim, kind="rollouts", swarm="s", seq=1, window=int(clock.t // WS) - 10, created=clock.t, payload=batch()
    )
    attacker = Replay(MemoryTransport(net, "x"), p=1.0).list_as(listed(Identity.generate()))
    attacker._history.append((old, victim.peer_id))
    b = await Channel.create(Identity.generate(), MemoryTransport(net, "b"), validator(clock))
    await attacker.publish(b"noise", window=int(clock.t // WS), sender="x")
    assert await b.poll() == []
    assert b.metrics()["rejected"]["stale"] == 1


async def test_flood_of_junk_and_of_valid_records():
    clock = Clock()
    a, b = await pair(clock, wrap_a=lambda t: Flood(t, copies=30, size=100))
    a.transport.list_as(a.index_writer)
    await a.publish("rollouts", batch())
    got = [e for _ in range(4) for e in await b.poll()]  # 31 listed records: four polls of at most 10
    assert len(got) == 1 and b.metrics()["rejected"]["malformed"] == 30

    flooder = Identity.generate()
    seqs = iter(range(10**6))

    def signed(i):
        w = int(clock.t // WS)
        return encode_record(
            flooder, kind="rollouts", swarm="s", seq=next(seqs), window=w, created=clock.t, payload=batch()
        )

    a, b = await pair(clock, wrap_a=lambda t: Flood(t, copies=30, make=signed), quota=5)
    a.transport.list_as(a.index_writer)
    await a.publish("rollouts", batch())
    got = [e for _ in range(4) for e in await b.poll()]
    assert sum(e.sender == flooder.peer_id for e in got) == 5
    assert b.metrics()["rejected"]["quota"] == 25


async def test_forge_impersonate_and_claim_are_rejected():
    clock = Clock()
    victim = Identity.generate()
    forger = Identity.generate()
    for mode, reason in (("impersonate", "bad_signature"), ("claim", "sender_mismatch")):
        a, b = await pair(clock, wrap_a=lambda t, m=mode: Forge(t, forger=forger, mode=m, victim=victim.public_bytes))
        a.transport.list_as(a.index_writer)
        await a.publish("rollouts", batch())
        # Filed under the victim, the record cannot be listed (only the victim signs its index entry)...
        assert await b.poll() == [] and a.transport.inner.network.stats["unlisted"] == 1
        # ...and listed by the forger under its own entry, the receiver's validator refuses it.
        forged, _ = a.transport.forge(
            encode_record(
                forger, kind="rollouts", swarm="s", seq=7, window=int(clock.t // WS), created=clock.t, payload=batch()
            )
        )
        await a.transport._inject(forged, window=int(clock.t // WS), sender=forger.peer_id)
        assert await b.poll() == []
        assert b.metrics()["rejected"][reason] == 1


async def test_forge_reward_passes_the_protocol_with_the_forgers_identity():
    clock = Clock()
    forger = Identity.generate()
    a, b = await pair(clock, wrap_a=lambda t: Forge(t, forger=forger, mode="reward", reward=1.0))
    a.transport.list_as(listed(forger))
    await a.publish("rollouts", batch(reward=0.0))
    (env,) = await b.poll()
    assert env.sender == forger.peer_id
    assert all(c.reward_hint == 1.0 for c in env.payload.groups[0].completions)


async def test_wrappers_compose():
    clock = Clock()
    a, b = await pair(
        clock,
        wrap_a=lambda t: Duplicate(Drop(t, publish=0.0), publish=1.0),
        wrap_b=lambda t: Drop(Duplicate(Delay(t, fetch_s=0.0, clock=clock), fetch=1.0), fetch=0.0),
    )
    await a.publish("rollouts", batch())
    assert len(await b.poll()) == 1
    assert b.addresses() == ["memory://b"]
    await b.close()
