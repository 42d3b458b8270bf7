"""The Transport contract: every implementation must pass these tests.

Use it from a test module by importing the tests and providing a ``make_transports`` fixture::

    from tests.contract.transport_contract import *  # noqa: F403

    @pytest.fixture
    async def make_transports():
        made = []
        async def make(n: int) -> list[Transport]:
            ts = [...]  # n connected transports of one swarm called SWARM
            made.extend(ts)
            return ts
        yield make
        for t in made:
            await t.close()

Transports that bootstrap from a first peer's addresses can use :func:`bootstrapped_transports` instead::

    make_transports = bootstrapped_transports(start)  # start(initial_peers, **cfg) -> one started transport

Transports must be configured for swarm :data:`SWARM` with ``window_seconds`` :data:`WINDOW_SECONDS` (the
records published here are real signed records of the current window, so store-time validation may be on).
Visibility is awaited with :func:`eventually` up to :data:`VISIBILITY_TIMEOUT_S`, so slow real networks pass.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from protocol.errors import TransportError
from protocol.identity import Identity
from protocol.layout import IndexWriter
from protocol.records import encode_record, window_of
from protocol.types import Completion, Group, RolloutBatch, TaskRef

SWARM = "contract-swarm"
WINDOW_SECONDS = 15
VISIBILITY_TIMEOUT_S = 30.0

__all__ = [
    "SWARM",
    "VISIBILITY_TIMEOUT_S",
    "WINDOW_SECONDS",
    "eventually",
    "make_record",
    "publish_listed",
    "test_contract_close_is_idempotent_and_later_calls_raise",
    "test_contract_every_peer_sees_every_peer",
    "test_contract_fetch_empty_windows",
    "test_contract_fetch_only_returns_requested_windows",
    "test_contract_large_record",
    "test_contract_latest_record_per_sender_and_window_is_kept",
    "test_contract_peers_and_addresses",
    "test_contract_publish_is_visible_to_another_peer",
]

T = TypeVar("T")
_seq = [0]


def bootstrapped_transports(start: Callable[..., Awaitable[T]]):
    """A ``make_transports`` fixture over ``start(initial_peers, **cfg)``: ``make(n, **cfg)`` starts one transport,
    then ``n - 1`` that bootstrap from its addresses; every transport made is closed at teardown."""

    @pytest.fixture
    async def make_transports():
        made: list = []

        async def make(n: int, **cfg) -> list[T]:
            first = await start([], **cfg)
            made.append(first)
            for _ in range(n - 1):
                made.append(await start(first.addresses(), **cfg))
            return made[-n:]

        yield make
        for t in made:
            await t.close()

    return make_transports


def now_window() -> int:
    return window_of(time.time(), WINDOW_SECONDS)


def make_record(identity: Identity, *, window: int | None = None, text: str = "x", size: int = 0) -> bytes:
    """A valid signed record of :data:`SWARM` (``size`` pads the completion text to roughly that many bytes)."""
    _seq[0] += 1
    w = now_window() if window is None else window
    body = text + "y" * max(0, size - len(text))
    batch = RolloutBatch("m", 0, "t", (Group(TaskRef("chain_sum", {}, 0, _seq[0]), (Completion(body, 1),)),))
    return encode_record(
        identity,
        kind="rollouts",
        swarm=SWARM,
        seq=int(time.time() * 1000) + _seq[0],
        window=w,
        created=time.time(),
        payload=batch,
    )


# One writer per (transport, identity, swarm): an identity's entry lists what it published through that network.
_writers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def publish_listed(transport, identity: Identity, data: bytes, window: int, swarm: str = SWARM) -> None:
    """Publish ``data`` as ``identity`` would: with its signed index entry for ``window`` (sharded transports list
    a record only through it; push transports ignore it)."""
    mine = _writers.setdefault(transport, {})
    writer = mine.setdefault(f"{identity.peer_id}/{swarm}", IndexWriter(identity, swarm))
    index = writer.add(data, window)
    await transport.publish(data, window=window, sender=identity.peer_id, index=index)


async def eventually(
    fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], timeout: float = VISIBILITY_TIMEOUT_S
) -> T:
    """Call ``fn`` until ``ok(result)``; fail the test after ``timeout`` seconds with the last result."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        result = await asyncio.wait_for(fn(), timeout)
        if ok(result):
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s; last result: {str(result)[:200]}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def test_contract_publish_is_visible_to_another_peer(make_transports):
    a, b = await make_transports(2)
    ident = Identity.generate()
    w = now_window()
    data = make_record(ident, window=w)
    await asyncio.wait_for(publish_listed(a, ident, data, w), VISIBILITY_TIMEOUT_S)
    got = await eventually(lambda: b.fetch_recent([w]), lambda r: data in r)
    assert all(isinstance(x, bytes) for x in got)


async def test_contract_every_peer_sees_every_peer(make_transports):
    ts = await make_transports(3)
    w = now_window()
    records = []
    for t in ts:
        ident = Identity.generate()
        data = make_record(ident, window=w)
        records.append(data)
        await asyncio.wait_for(publish_listed(t, ident, data, w), VISIBILITY_TIMEOUT_S)
    for t in ts:
        await eventually(lambda t=t: t.fetch_recent([w]), lambda r: all(d in r for d in records))


async def test_contract_fetch_only_returns_requested_windows(make_transports):
    a, b = await make_transports(2)
    ident = Identity.generate()
    w = now_window()
    old, new = make_record(ident, window=w - 1), make_record(ident, window=w)
    await publish_listed(a, ident, old, w - 1)
    await publish_listed(a, ident, new, w)
    await eventually(lambda: b.fetch_recent([w - 1, w]), lambda r: old in r and new in r)
    only_new = await b.fetch_recent([w])
    assert new in only_new and old not in only_new
    only_old = await b.fetch_recent([w - 1])
    assert old in only_old and new not in only_old


async def test_contract_latest_record_per_sender_and_window_is_kept(make_transports):
    a, b = await make_transports(2)
    ident = Identity.generate()
    w = now_window()
    first, second = make_record(ident, window=w, text="first"), make_record(ident, window=w, text="second")
    await publish_listed(a, ident, first, w)
    await publish_listed(a, ident, second, w)
    await eventually(lambda: b.fetch_recent([w]), lambda r: second in r)


async def test_contract_large_record(make_transports):
    a, b = await make_transports(2)
    ident = Identity.generate()
    w = now_window()
    data = make_record(ident, window=w, size=200_000)
    assert len(data) > 200_000
    await asyncio.wait_for(publish_listed(a, ident, data, w), VISIBILITY_TIMEOUT_S)
    await eventually(lambda: b.fetch_recent([w]), lambda r: data in r)


async def test_contract_fetch_empty_windows(make_transports):
    (a,) = await make_transports(1)
    assert await a.fetch_recent([now_window() + 3]) == []
    assert await a.fetch_recent([]) == []


async def test_contract_peers_and_addresses(make_transports):
    a, b = await make_transports(2)
    addrs = a.addresses()
    assert addrs and all(isinstance(x, str) and x for x in addrs)
    await eventually(a.peers, lambda p: len(p) >= 1)
    assert all(isinstance(p, str) for p in await b.peers())


async def test_contract_close_is_idempotent_and_later_calls_raise(make_transports):
    (a,) = await make_transports(1)
    await a.close()
    await a.close()
    ident = Identity.generate()
    with pytest.raises(TransportError):
        await a.publish(make_record(ident), window=now_window(), sender=ident.peer_id)
    with pytest.raises(TransportError):
        await a.fetch_recent([now_window()])
