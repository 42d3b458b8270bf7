"""The memory transport: the shared contract suite, plus its fault hooks (latency, loss, duplication,
partitions, churn, retention, store-time check)."""

import sys
from pathlib import Path

import pytest

from protocol.errors import TransportError
from protocol.identity import Identity
from protocol.transport.config import MemoryTransportConfig
from protocol.transport.memory import MemoryNetwork, MemoryTransport

# tests/unit has no __init__.py, so plain `pytest` does not put the repository root on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.contract.transport_contract import *  # noqa: F403
from tests.contract.transport_contract import make_record, now_window, publish_listed


@pytest.fixture
async def make_transports():
    made = []

    async def make(n):
        net = MemoryNetwork(seed=0)
        ts = [MemoryTransport(net, f"peer{i}") for i in range(n)]
        made.extend(ts)
        return ts

    yield make
    for t in made:
        await t.close()


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


IDENT = Identity.from_private_bytes(b"\x07" * 32)


async def publish_n(t, n, w=None):
    w = now_window() if w is None else w
    out = []
    for i in range(n):
        data = make_record(IDENT, window=w, text=f"r{i}")
        await publish_listed(t, IDENT, data, w)
        out.append(data)
    return out, w


async def test_latency_and_jitter_on_the_injected_clock():
    clock = Clock()
    net = MemoryNetwork(clock=clock, latency_s=2.0, jitter_s=1.0)
    a, b = MemoryTransport(net, "a"), MemoryTransport(net, "b")
    (data,), w = await publish_n(a, 1)
    assert await b.fetch_recent([w]) == []
    assert await a.fetch_recent([w]) == [data]  # own records are not delayed
    clock.t += 3.0
    assert await b.fetch_recent([w]) == [data]


async def test_loss_is_deterministic_given_the_seed():
    def run(seed):
        async def go():
            net = MemoryNetwork(seed=seed, loss=0.5)
            a, b = MemoryTransport(net, "a"), MemoryTransport(net, "b")
            sent, w = await publish_n(a, 10)  # one poll's budget: every listed record is tried once
            first = await b.fetch_recent([w])
            assert await b.fetch_recent([w]) == first  # a lost record stays lost for that reader
            return [sent.index(d) for d in first]

        return go()

    r1, r2, r3 = await run(1), await run(1), await run(2)
    assert r1 == r2 and r1 != r3 and 1 < len(r1) < 9


async def test_duplication():
    net = MemoryNetwork(duplicate=1.0)
    a, b = MemoryTransport(net, "a"), MemoryTransport(net, "b")
    (data,), w = await publish_n(a, 1)
    assert await b.fetch_recent([w]) == [data, data]


async def test_partition_and_heal():
    net = MemoryNetwork()
    a, b, c = (MemoryTransport(net, p) for p in "abc")
    net.partition(["a"], ["b"])  # c is in the implicit rest group
    (data,), w = await publish_n(a, 1)
    assert await b.fetch_recent([w]) == [] and await c.fetch_recent([w]) == []
    assert await a.peers() == [] and await b.peers() == []
    net.heal()
    assert await b.fetch_recent([w]) == [data]
    assert await a.peers() == ["b", "c"]


async def test_leave_and_rejoin():
    net = MemoryNetwork()
    a, b = MemoryTransport(net, "a"), MemoryTransport(net, "b")
    (data,), w = await publish_n(a, 1)
    net.leave("a")
    assert await b.peers() == []
    with pytest.raises(TransportError, match="offline"):
        await a.fetch_recent([w])
    with pytest.raises(TransportError):
        await publish_n(a, 1)
    assert await b.fetch_recent([w]) == [data]  # stored records outlive their publisher's presence
    net.join("a")
    assert await a.fetch_recent([w]) == [data]
    with pytest.raises(ValueError):
        net.join("a")


async def test_retention_forgets_old_windows():
    net = MemoryNetwork(retention_windows=2)
    a, b = MemoryTransport(net, "a"), MemoryTransport(net, "b")
    await publish_n(a, 1, w=100)
    await publish_n(a, 1, w=103)
    assert await b.fetch_recent([100]) == []


async def test_store_time_check_filters_on_the_readers_side():
    net = MemoryNetwork()
    a = MemoryTransport(net, "a")
    # A RecordCheck returns the verified envelope (anything but a str) to keep a record, a reason to refuse it.
    b = MemoryTransport(net, "b", validate=lambda data: object() if b"good" in data else "bad_signature")
    c = MemoryTransport(net, "c")
    await publish_listed(a, IDENT, b"good record", 1)
    await publish_listed(a, IDENT, b"bad record", 1)
    assert await b.fetch_recent([1]) == [b"good record"] and b.refused == 1
    assert len(await c.fetch_recent([1])) == 2


async def test_from_config():
    net = MemoryNetwork.from_config(MemoryTransportConfig(seed=3, loss=0.25, retention_windows=5))
    assert (net.seed, net.loss, net.retention_windows) == (3, 0.25, 5)
    assert MemoryTransport(net, "a").addresses() == ["memory://a"]
