"""Channel: signed publish, validated and deduplicated poll, metrics, and surviving a dead network."""

import asyncio
import logging

import pytest

from protocol.channel import Channel
from protocol.codec import EncodeError
from protocol.errors import TransportError
from protocol.identity import Identity
from protocol.transport.base import Transport
from protocol.transport.memory import MemoryNetwork, MemoryTransport
from protocol.types import Completion, Group, RolloutBatch, TaskRef
from protocol.validation import RecordValidator
from sim.faults import Duplicate

WS = 15


class Clock:
    def __init__(self, t=1_700_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def batch(i=0) -> RolloutBatch:
    return RolloutBatch("m", i, "t", (Group(TaskRef("chain_sum", {}, 0, i), (Completion(f"a{i}", 1),)),))


def validator(clock, swarm="s", **kw) -> RecordValidator:
    args = dict(max_bytes=1 << 20, max_future_windows=1, max_past_windows=4, quota_per_window=16, clock=clock)
    args.update(kw)
    return RecordValidator(swarm, WS, **args)


async def make_channels(n, clock, net=None, wrap=lambda t: t, **kw):
    net = net or MemoryNetwork(clock=clock)
    chans = []
    for i in range(n):
        ident = Identity.generate()
        chans.append(await Channel.create(ident, wrap(MemoryTransport(net, f"p{i}")), validator(clock, **kw)))
    return chans, net


async def test_publish_then_peers_poll_it_once():
    clock = Clock()
    (a, b, c), _ = await make_channels(3, clock)
    env = await a.publish("rollouts", batch(1))
    assert env.sender == a.peer_id and env.window == int(clock.t // WS) and env.payload == batch(1)
    got = await b.poll()
    assert [(e.sender, e.seq, e.payload) for e in got] == [(a.peer_id, env.seq, batch(1))]
    assert await b.poll() == []  # already delivered
    assert len(await c.poll()) == 1
    assert await a.poll() == []  # own records are never returned
    m = b.metrics()
    assert m["received"] == 1 and m["duplicates"] == 1 and m["rejected_total"] == 0 and m["bytes_in"] > 0
    assert a.metrics()["published"] == 1 and a.metrics()["bytes_out"] == env.size


async def test_seq_increases_and_poll_orders_deterministically():
    clock = Clock()
    (a, b), _ = await make_channels(2, clock)
    envs = [await a.publish("rollouts", batch(i)) for i in range(5)]
    assert [e.seq for e in envs] == sorted({e.seq for e in envs})
    got = await b.poll()
    assert [e.seq for e in got] == [e.seq for e in envs]


async def test_duplicates_from_the_network_are_delivered_once():
    clock = Clock()
    (a, b), _ = await make_channels(2, clock, wrap=lambda t: Duplicate(t, fetch=1.0))
    await a.publish("rollouts", batch())
    assert len(await b.poll()) == 1
    assert b.metrics()["duplicates"] >= 1


async def test_records_of_other_swarms_and_stale_windows_are_rejected():
    clock = Clock()
    net = MemoryNetwork(clock=clock)
    a = await Channel.create(Identity.generate(), MemoryTransport(net, "a"), validator(clock, swarm="other"))
    b = await Channel.create(Identity.generate(), MemoryTransport(net, "b"), validator(clock))
    await a.publish("rollouts", batch())
    assert await b.poll() == []
    assert b.metrics()["rejected"]["wrong_swarm"] == 1
    assert await b.poll() == [] and b.metrics()["rejected"]["wrong_swarm"] == 1  # counted once, not per poll


async def test_poll_sees_the_previous_window():
    clock = Clock(t=1_700_000_000.0 - 1)  # one second before a window boundary
    (a, b), _ = await make_channels(2, clock)
    await a.publish("rollouts", batch())
    clock.t += 2
    assert len(await b.poll()) == 1


async def test_encode_errors_propagate_to_the_caller():
    clock = Clock()
    (a,), _ = await make_channels(1, clock)
    with pytest.raises(EncodeError):
        await a.publish("nope", batch())


class Broken(Transport):
    def __init__(self, hang=False):
        self.hang = hang

    async def _fail(self):
        if self.hang:
            await asyncio.sleep(3600)
        raise TransportError("network is down")

    async def publish(self, data, *, window, sender):
        await self._fail()

    async def fetch_recent(self, windows):
        await self._fail()

    async def peers(self):
        await self._fail()

    def addresses(self):
        raise TransportError("no addresses")

    async def close(self):
        await self._fail()


@pytest.mark.parametrize("hang", [False, True])
async def test_a_dead_network_never_crashes_the_caller(hang, monkeypatch):
    # Our own handler on the channel's logger: other suites (hivemind, CLIs) reconfigure the root logger.
    warnings: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = warnings.append
    chan_logger = logging.getLogger("protocol.channel")
    monkeypatch.setattr(chan_logger, "level", logging.WARNING)
    chan_logger.addHandler(handler)
    monkeypatch.setattr(chan_logger, "handlers", [*chan_logger.handlers])
    clock = Clock()
    ch = Channel(Identity.generate(), Broken(hang), validator(clock), timeout_s=0.05)
    env = await ch.publish("rollouts", batch())
    assert env.payload == batch()
    await ch.publish("rollouts", batch(1))
    assert await ch.poll() == []
    assert await ch.peers() == [] and ch.addresses() == []
    m = ch.metrics()
    assert m["publish_errors"] == 2 and m["fetch_errors"] == 1 and m["published"] == 0
    chan_logger.removeHandler(handler)
    assert len(warnings) == 1  # warn once, not on every call
    await ch.close()
    await ch.close()


async def test_network_recovers_after_churn():
    clock = Clock()
    (a, b), net = await make_channels(2, clock)
    net.leave("p1")
    await a.publish("rollouts", batch(1))
    assert await b.poll() == [] and b.metrics()["fetch_errors"] == 1
    net.join("p1")
    assert len(await b.poll()) == 1


async def test_close_then_publish_and_poll_are_quiet():
    clock = Clock()
    (a, _b), _ = await make_channels(2, clock)
    await a.close()
    await a.publish("rollouts", batch())
    assert await a.poll() == []
    assert a.metrics()["publish_errors"] == 1


async def test_evictions_from_a_full_shard_key_reach_the_metrics_by_reason():
    """Evictions are counted beside refusals (issue 56): a transport's ``evictions()`` is the channel's ``evicted``."""

    class Evicting(MemoryTransport):
        def evictions(self):
            return {"outranked": 3, "trimmed": 1}

    clock = Clock()
    net = MemoryNetwork(clock=clock)
    ch = await Channel.create(Identity.generate(), Evicting(net, "p0"), validator(clock))
    plain = await Channel.create(Identity.generate(), MemoryTransport(net, "p1"), validator(clock))
    assert ch.metrics()["evicted"] == {"outranked": 3, "trimmed": 1}
    assert plain.metrics()["evicted"] == {}
    await ch.close()
    await plain.close()


async def test_peers_and_addresses():
    clock = Clock()
    (a, _b, _c), _ = await make_channels(3, clock)
    assert sorted(await a.peers()) == ["p1", "p2"]
    assert a.addresses() == ["memory://p0"]


async def test_records_of_a_previous_run_of_the_same_identity_are_not_delivered():
    clock = Clock()
    net = MemoryNetwork(clock=clock)
    ident = Identity.generate()
    old = await Channel.create(ident, MemoryTransport(net, "old"), validator(clock))
    await old.publish("rollouts", batch())
    await old.close()
    new = await Channel.create(ident, MemoryTransport(net, "new"), validator(clock))
    assert await new.poll() == [] and new.metrics()["own"] == 1


async def test_following_is_the_recent_senders_until_the_node_names_its_own():
    """SPEC 11 and 16: ``following`` (metrics.jsonl) is what the next poll reads directly."""
    clock = Clock()
    (a, b, c), _ = await make_channels(3, clock)
    assert c.following() == []
    await a.publish("rollouts", batch(1))
    await c.poll()
    await b.publish("rollouts", batch(2))
    await c.poll()
    assert c.following() == [b.peer_id, a.peer_id]  # most recently accepted first
    c.follow([a.peer_id] + [f"{i:032x}" for i in range(10)])
    assert c.following() == ([a.peer_id] + [f"{i:032x}" for i in range(10)])[: c.follow_senders]
    c.follow(None)
    assert c.following() == [b.peer_id, a.peer_id]
