"""A hivemind-transport node's membership of the swarm's GossipSub topic, so it shares one swarm with libp2p nodes.

The node's p2pd runs go-libp2p's GossipSub (``protocol.transport.hivemind.pubsub``) on the topic a libp2p-transport
node joins (``protocol.transport.gossip``), and serves and uses the same sync protocol over p2pd streams, so records
cross between the transports as the same bytes (``protocol/SPEC.md`` 7.6):

* publish: the record goes to the DHT (the transport) **and** to the topic, as ``0x01 || record`` (an announcement
  ``0x02 || {digest, size, window}`` above ``inline_max_bytes``, fetched with ``get`` from the node that published it);
* receive: every message of the topic passes the libp2p transport's edge validator (size, decode, signature, swarm,
  window horizon; ``protocol.transport.libp2p.edge``) and lands in a bounded store by window that ``fetch_recent``
  reads beside the DHT poll;
* sync ``/rl-swarm/sync/1.0.0``: this node answers ``have``/``get`` from that store (its own records included) and
  ``peers`` with its own signed advertisement and those its requesters sent; it pulls what it lacks from every
  connected peer at start and from one random connected peer every ``sync_interval_s`` (late joiners catch up on
  records that never went into the DHT).

go-libp2p's router forwards a message before this node sees it (p2pd has no validation hook): a hivemind node relays
what it would refuse, and its py-libp2p neighbours charge it the invalid message (SPEC 7.6). Runs on the DHT's loop;
knows nothing about the DHT layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

import msgpack
from hivemind.p2p import PeerID

from protocol.transport.base import RecordCheck
from protocol.transport.config import ProtocolConfig
from protocol.transport.gossip import (
    MAX_GET,
    MAX_HAVE,
    MAX_PX,
    MAX_REQUEST_BYTES,
    SYNC_PROTOCOL,
    TAG_RECORD,
    FrameTooLarge,
    ad_signer_ok,
    answer,
    frame,
    get_in_parts,
    make_ad,
    parse_frame,
    parse_have,
    parse_request,
    read_frame,
    record_frame,
)
from protocol.transport.hivemind.pubsub import DaemonPubsub
from protocol.transport.libp2p.edge import EdgeValidator
from protocol.transport.libp2p.store import Counters, RecordStore, digest_of
from protocol.transport.netkey import NetworkKey
from protocol.version import local_version

logger = logging.getLogger(__name__)

#: Announced records fetched at once, and advertisements of requesters kept to pass on.
MAX_FETCHES = 4
MAX_RELAYED_ADS = 64
#: Seconds an own advertisement is reused before it is signed again.
AD_RESIGN_S = 60.0
#: Digests remembered as too large for us (a peer with a larger ``max_record_bytes`` lists them), never asked again.


class TopicMember:
    """The node's store of gossiped records, its subscription and its sync client and server; build it once, then
    :meth:`attach` it to each p2pd the node runs (a restarted daemon gets the same store)."""

    def __init__(
        self,
        *,
        swarm: str,
        topic: str,
        protocol: ProtocolConfig,
        expiration_windows: int,
        hook: RecordCheck | None,
        key: NetworkKey,
        sync_interval_s: float,
        request_timeout_s: float,
        inline_max_bytes: int,
    ) -> None:
        self.swarm = swarm
        self.topic = topic
        self.protocol = protocol
        self.key = key
        self.sync_interval_s = sync_interval_s
        self.timeout = request_timeout_s
        self.inline_max_bytes = inline_max_bytes
        self.counters = Counters()
        self.store = RecordStore(expiration_windows, 4096)
        self.edge = EdgeValidator(
            swarm=swarm,
            protocol=protocol,
            expiration_windows=expiration_windows,
            hook=hook,
            store=self.store,
            counters=self.counters,
            clock=lambda: time.time() + protocol.clock_offset_s,
        )
        self._p2p: Any = None
        self._pubsub: DaemonPubsub | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fetching: set[bytes] = set()
        self._addresses: list[str] = []
        self._own_ad: tuple[float, bytes] | None = None
        self._ads: OrderedDict[bytes, bytes] = OrderedDict()
        self._too_large: OrderedDict[bytes, None] = OrderedDict()

    # -- lifecycle (on the DHT loop) -----------------------------------------------------------------------------

    async def attach(self, p2p: Any, addresses: list[str]) -> None:
        """Subscribe through ``p2p`` (a daemon started with pubsub), serve the sync protocol on it, pull the recent
        windows from every connected peer and start the sync loop."""
        self.detach()
        self._p2p, self._addresses = p2p, list(addresses)
        self._own_ad = None
        await p2p.add_binary_stream_handler(SYNC_PROTOCOL, self._serve)
        self._pubsub = DaemonPubsub(p2p, self.topic, self._on_message)
        await self._pubsub.subscribe()
        self._spawn(self._sync_loop(), "gossip-sync")

    def detach(self) -> None:
        """Stop reading the topic and the background tasks (the daemon's handlers die with it); idempotent."""
        if self._pubsub is not None:
            self._pubsub.close()
            self._pubsub = None
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        self._fetching.clear()

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- publish and read ------------------------------------------------------------------------------------------

    async def publish(self, data: bytes, window: int) -> None:
        """Keep our own record (so sync serves it) and publish it on the topic."""
        digest = digest_of(data)
        reason = self.edge.admit(data, digest)
        if reason is not None:
            raise ValueError(f"own record refused by the edge validator: {reason}")
        if self._pubsub is None:
            raise RuntimeError("not attached to a daemon")
        await self._pubsub.publish(record_frame(data, digest=digest, window=window, inline_max=self.inline_max_bytes))
        self.counters.stat("published")

    def records(self, windows: list[int]) -> list[bytes]:
        """Records of ``windows`` received over the topic or by sync, and our own."""
        self.store.prune(self.edge.now_window())
        return self.store.records(windows)

    def stats(self) -> dict[str, Any]:
        snap = self.counters.snapshot()
        if self._pubsub is not None:
            snap["resubscribes"] = self._pubsub.resubscribes
        return snap

    # -- receive path (never raises) --------------------------------------------------------------------------------

    def _on_message(self, msg: Any) -> None:
        if bytes(getattr(msg, "from")) == self.key.peer_id_bytes:
            return  # our own publish, echoed by the daemon: already stored
        try:
            tag, body = parse_frame(bytes(msg.data))
        except ValueError as e:
            self.counters.reject(str(e))
            return
        if tag == TAG_RECORD:
            if self.edge.admit(body) is None:
                self.counters.stat("topic_records")
            return
        digest, size = body
        if size > self.protocol.max_record_bytes:
            self.counters.reject("oversize")
            return
        if self.store.has(digest) or digest in self._fetching:
            return
        if len(self._fetching) >= MAX_FETCHES:
            self.counters.drop("announce_busy")  # sync heals it
            return
        self._fetching.add(digest)
        self._spawn(self._fetch_announced(bytes(getattr(msg, "from")), digest), "gossip-fetch")

    async def _fetch_announced(self, author: bytes, digest: bytes) -> None:
        """An announcement carries its author, not its forwarder (``PSMessage`` has no forwarder): ask the author."""
        try:
            got = await asyncio.wait_for(self._get(PeerID(author), [digest]), self.timeout)
            if got and self.edge.admit(got[0], digest) is None:
                self.counters.stat("fetched_large")
            elif not got:
                self.counters.drop("announce_unavailable")
        except Exception as e:
            self.counters.drop("announce_fetch_failed")
            logger.debug("fetch of an announced record failed: %s: %s", type(e).__name__, e)
        finally:
            self._fetching.discard(digest)

    # -- sync client ------------------------------------------------------------------------------------------------

    async def _request(self, peer: Any, req: dict[str, Any]) -> list[bytes]:
        _, reader, writer = await self._p2p.call_binary_stream_handler(peer, SYNC_PROTOCOL)
        try:
            writer.write(frame(msgpack.packb(req, use_bin_type=True)))
            await writer.drain()
            if req["op"] == "have":
                return [await read_frame(reader, MAX_HAVE * 48 + 16)]
            out = []
            for _ in range(len(req["digests"]) + 1):
                data = await read_frame(reader, self.protocol.max_record_bytes)
                if not data:
                    break
                out.append(data)
            return out
        finally:
            writer.close()

    async def _get(self, peer: Any, digests: list[bytes]) -> list[bytes]:
        wanted = set(digests)
        out = []
        for data in await self._request(peer, {"op": "get", "digests": digests}):
            if digest_of(data) in wanted:
                out.append(data)
            else:
                self.counters.drop("sync_unrequested")
        return out

    def _windows(self) -> list[int]:
        now = self.edge.now_window()
        return list(range(now - self.store.expiration_windows, now + self.protocol.max_future_windows + 1))

    async def sync_from(self, peer: Any) -> int:
        """Pull the records of the recent windows ``peer`` holds and we lack; how many new ones passed."""
        raw = await asyncio.wait_for(self._request(peer, {"op": "have", "windows": self._windows()}), self.timeout)
        missing = [d for d in parse_have(raw[0]) if not self.store.has(d) and d not in self._too_large]
        new = 0
        for i in range(0, len(missing), MAX_GET):
            got = await self._get_batch(peer, missing[i : i + MAX_GET])
            new += sum(1 for data in got if self.edge.admit(data) is None)
        self.counters.stat("synced", new)
        return new

    async def _get_batch(self, peer: Any, digests: list[bytes]) -> list[bytes]:
        """As the libp2p transport's sync client (:func:`get_in_parts`)."""

        def get(ds: list[bytes]) -> Awaitable[list[bytes]]:
            return asyncio.wait_for(self._get(peer, ds), self.timeout)

        return await get_in_parts(
            get, digests, self._too_large, lambda: self.counters.drop("sync_too_large"), FrameTooLarge
        )

    async def _sync_quietly(self, peer: Any) -> int:
        try:
            return await self.sync_from(peer)
        except Exception as e:  # a peer without the protocol (an older node) or one that went away
            self.counters.drop("sync_failed")
            logger.debug("sync with %s failed: %s: %s", peer, type(e).__name__, e)
            return 0

    async def _connected(self) -> list[Any]:
        with contextlib.suppress(Exception):
            return [i.peer_id for i in await asyncio.wait_for(self._p2p.list_peers(), self.timeout)]
        return []

    async def sync_all(self) -> int:
        """Pull from every connected peer (at start, and for tests); how many new records arrived."""
        total = 0
        for peer in await self._connected():
            total += await self._sync_quietly(peer)
        return total

    async def _sync_loop(self) -> None:
        await self.sync_all()
        while True:
            await asyncio.sleep(self.sync_interval_s * random.uniform(0.8, 1.2))
            self.store.prune(self.edge.now_window())
            peers = await self._connected()
            if peers:
                await self._sync_quietly(random.choice(peers))

    # -- sync server ------------------------------------------------------------------------------------------------

    async def _serve(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await asyncio.wait_for(read_frame(reader, MAX_REQUEST_BYTES), self.timeout)
            reply = answer(parse_request(raw), self.store, self._serve_peers)
            if reply is None:
                self.counters.drop("sync_bad_request")
            else:
                for data in reply:
                    writer.write(frame(data))
                    await asyncio.wait_for(writer.drain(), self.timeout)
                self.counters.stat("sync_served")
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as e:
            self.counters.drop("sync_serve_failed")
            logger.debug("sync stream failed while serving: %s: %s", type(e).__name__, e)
        except Exception as e:  # malformed or oversized frame, bad MessagePack
            self.counters.drop("sync_bad_request")
            logger.debug("bad sync request: %s: %s", type(e).__name__, e)
        finally:
            writer.close()

    def _serve_peers(self, requester_ad: Any) -> list[bytes]:
        """The ``peers`` op: keep the requester's advertisement if its signature verifies, answer ours and a random
        sample of those kept (receivers verify each in full)."""
        peer = ad_signer_ok(requester_ad, self.swarm)
        if peer is not None:
            self._ads.pop(peer, None)
            self._ads[peer] = requester_ad
            while len(self._ads) > MAX_RELAYED_ADS:
                self._ads.popitem(last=False)
        others = [ad for p, ad in self._ads.items() if p != peer]
        self.counters.stat("px_served")
        return [self._ad(), *random.sample(others, min(MAX_PX - 1, len(others)))]

    def _ad(self) -> bytes:
        now = time.time() + self.protocol.clock_offset_s
        if self._own_ad is None or now - self._own_ad[0] > AD_RESIGN_S:
            addrs = [a for a in self._addresses if a.endswith(f"/p2p/{self.key.peer_id}")]
            ad = make_ad(
                self.key.seed, self.key.peer_id_bytes, swarm=self.swarm, addrs=addrs, version=local_version(), now=now
            )
            self._own_ad = (now, ad)
        return self._own_ad[1]
