"""The libp2p transport: signed records pushed over py-libp2p GossipSub, a sync protocol for catch-up, and peer
exchange so a swarm bootstrapped from one address becomes a mesh.

Wire layout (see ``protocol/SPEC.md`` section 7.3):

* one GossipSub topic per swarm, ``{topic_prefix}/{swarm}/records/1``; a message is one tag byte and a body:
  ``0x01 || record`` (records up to ``inline_max_bytes``) or ``0x02 || msgpack {window, digest, size}`` (an
  announcement of a larger record, fetched from the peer that forwarded it);
* the request/response protocol of :mod:`protocol.transport.libp2p.sync`: ``have``/``get`` pull the records a node
  misses from one random peer every ``sync_interval_s`` and from its bootstrap peers at start (anti-entropy: it
  heals every gossip drop and gives late joiners the recent windows); ``peers`` exchanges signed advertisements.

Mesh: every ``peer_exchange_interval_s`` a node swaps advertisements with one random connected peer and, while it
has fewer than ``target_peers`` connections, dials a few peers it learned of. A newcomer does this at once with
its bootstrap peers, so it ends up connected to about ``target_peers`` random members instead of to the bootstrap
node only (a star), and the swarm stays connected when the bootstrap node leaves.

Edge validation: every gossip message passes a GossipSub topic validator before it is delivered or forwarded
(:mod:`protocol.transport.libp2p.edge`). Invalid messages are not forwarded and lower the forwarder's GossipSub
score, so a peer that keeps sending them is eventually ignored. Announcements are only forwarded by peers that
fetched and validated the record, so every hop can fetch it from the previous one.

py-libp2p's silent limits are handled here: its per-topic spam limit is raised (``router_max_messages_per_s``)
and our own publishes are rate limited below it; the 32-message subscription buffer cannot lose records because
the validator stores them (the subscription is still drained at once); frames over 1 MiB are avoided by
announce-then-fetch. Every drop is counted by reason (:meth:`Libp2pTransport.stats`).

The host key is the node's identity key (``protocol.transport.netkey``): the same ``identity.key`` gives the same
``/p2p/`` id at every start, so peers holding a bootstrap node's address reach it again after it restarts (a node
alone dials its initial peers again). A transport built without a key makes a fresh one.

py-libp2p is trio-based: the host runs on a private thread (:mod:`protocol.transport.libp2p.bridge`). Received
records live in a bounded in-memory store by window, forgotten ``expiration_windows`` windows later, so
``fetch_recent`` is a local read.

This module and ``protocol.transport.libp2p`` are the only ones that import libp2p (hivemind and libp2p cannot share
a process). They know nothing about replay, quotas or what a record's payload means: the channel's validator does
those.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import msgpack
import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.tools.anyio_service import background_trio_service

from protocol.errors import TransportError
from protocol.transport.base import RecordCheck, Transport
from protocol.transport.config import Libp2pTransportConfig, ProtocolConfig
from protocol.transport.gossip import (
    MAX_GET,
    MAX_HAVE,
    MAX_PX,
    MAX_WINDOWS,
    SYNC_PROTOCOL,
    TAG_ANNOUNCE,
    TAG_RECORD,
    gossip_topic,
)
from protocol.transport.libp2p.bridge import TrioBridge
from protocol.transport.libp2p.edge import EdgeValidator
from protocol.transport.libp2p.gossipsub import GRAYLIST_THRESHOLD, PUBLISH_THRESHOLD, build_pubsub
from protocol.transport.libp2p.peers import AdError, PeerAd, PeerTable, make_ad, verify_ad
from protocol.transport.libp2p.stalls import ForwarderBackoff
from protocol.transport.libp2p.store import Counters, RecordStore, digest_of
from protocol.transport.libp2p.sync import SyncClient, SyncServer
from protocol.transport.netkey import NetworkKey
from protocol.version import INCOMPATIBLE, compatible, local_version, report_incompatible

logger = logging.getLogger(__name__)

__all__ = [
    "GRAYLIST_THRESHOLD",
    "MAX_GET",
    "MAX_HAVE",
    "MAX_WINDOWS",
    "PUBLISH_THRESHOLD",
    "SYNC_PROTOCOL",
    "TAG_ANNOUNCE",
    "TAG_RECORD",
    "Libp2pTransport",
    "digest_of",
    "gossip_topic",
]

#: Forwarders remembered per announced record being fetched, to ask if that fetch fails.
MAX_ANNOUNCE_ALTERNATES = 8
#: Most peers one peer-exchange round dials at once.
MAX_DIALS_PER_ROUND = 4
#: Announce fetches from one forwarder at a time, and how long (in request timeouts) a forwarder whose fetch failed
#: is at most held off (``protocol.transport.libp2p.stalls``).
MAX_FETCHES_PER_FORWARDER = 2
MAX_HOLD_OFF_TIMEOUTS = 6
#: How often a background retry looks again for an alternate forwarder that was busy (seconds).
ALTERNATE_WAIT_S = 0.25


class Libp2pTransport(Transport):
    """Transport over py-libp2p; build it with ``await Libp2pTransport.create(cfg, swarm=...)``."""

    def __init__(
        self,
        cfg: Libp2pTransportConfig,
        protocol: ProtocolConfig,
        swarm: str,
        validate: RecordCheck | None,
        *,
        validate_own: bool = True,
        clock: Callable[[], float] = time.time,
        key: NetworkKey | None = None,
    ) -> None:
        self.cfg = cfg
        self.protocol = protocol
        self.swarm = swarm
        self.topic = gossip_topic(cfg.topic_prefix, swarm)
        self.clock = clock
        self._validate_own = validate_own
        self._counters = Counters()
        self._store = RecordStore(cfg.expiration_windows, cfg.max_records_per_window)
        self._edge = EdgeValidator(
            swarm=swarm,
            protocol=protocol,
            expiration_windows=cfg.expiration_windows,
            hook=validate,
            store=self._store,
            counters=self._counters,
            clock=clock,
        )
        self._bridge = TrioBridge(f"libp2p-{swarm}")
        self._addresses: list[str] = []
        self._closed = False
        self._ready: concurrent.futures.Future[list[str]] = concurrent.futures.Future()
        self._host: Any = None
        self._key = key if key is not None else NetworkKey.generate()
        self._key_pair: Any = None
        self._pubsub: Any = None
        self._sync: SyncClient | None = None
        # digest of an announced record being fetched -> forwarders of the copies dropped meanwhile (they hold it)
        self._fetching: dict[bytes, list[ID]] = {}
        self._forwarders = ForwarderBackoff(
            cfg.request_timeout_s, cfg.request_timeout_s * MAX_HOLD_OFF_TIMEOUTS, MAX_FETCHES_PER_FORWARDER
        )
        self._nursery: trio.Nursery | None = None  # the trio thread's, for background fetches
        self._table = PeerTable(cfg.max_known_peers, cfg.advertisement_ttl_s, clock)
        self._own_ad: tuple[float, bytes] | None = None
        self._incompatible: set[str] = set()
        self._version = local_version()
        self._tokens = max(1.0, cfg.max_messages_per_s)
        self._tokens_at = time.monotonic()
        self._publish_lock = asyncio.Lock()

    @classmethod
    async def create(
        cls,
        cfg: Libp2pTransportConfig,
        *,
        swarm: str,
        validate: RecordCheck | None = None,
        protocol: ProtocolConfig | None = None,
        validate_own: bool = True,
        key: NetworkKey | None = None,
    ) -> Libp2pTransport:
        """Start a libp2p host, join the swarm's topic and connect to ``cfg.initial_peers`` (if any).

        ``validate`` is the stateless edge check (``RecordValidator.verdict``). ``validate_own=False`` lets
        this node publish messages its own validator would refuse (fault injection in tests only). ``key`` is
        the host key (the node's identity, :meth:`NetworkKey.of`): the same key gives the same ``/p2p/`` id at
        every start; None makes a fresh one.
        """
        protocol = protocol if protocol is not None else ProtocolConfig()
        self = cls(cfg, protocol, swarm, validate, validate_own=validate_own, key=key)
        self._bridge.start(self._t_main, self._on_thread_exit)
        try:
            self._addresses = await asyncio.wait_for(asyncio.wrap_future(self._ready), cfg.startup_timeout_s + 5.0)
        except BaseException as e:
            await self.close()
            if isinstance(e, asyncio.CancelledError):
                raise
            raise TransportError(f"libp2p transport could not start ({e.__class__.__name__}: {e})") from e
        logger.info("libp2p transport up for swarm %r at %s", swarm, ", ".join(self._addresses))
        return self

    # -- Transport interface -------------------------------------------------------------------------------------

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        """Keep the record locally, then gossip it (inline, or as an announcement when it is large); ``index`` is
        ignored (push delivers every record; no index to read)."""
        self._check_open()
        data = bytes(data)
        cap = self.protocol.max_record_bytes
        if len(data) > cap:
            raise TransportError(f"record of {len(data)} bytes exceeds max_record_bytes={cap}")
        digest = digest_of(data)
        reason = self._edge.admit(data, digest)
        if reason is not None and self._validate_own:
            raise TransportError(f"record refused by this node's edge validation: {reason}")
        if len(data) <= self.cfg.inline_max_bytes:
            frame = bytes([TAG_RECORD]) + data
        else:
            announce = {"digest": digest, "size": len(data), "window": window}
            frame = bytes([TAG_ANNOUNCE]) + msgpack.packb(announce, use_bin_type=True)
        async with self._publish_lock:
            await self._throttle()
            await self._bridge.call(self._t_publish, frame, timeout=self.cfg.request_timeout_s)
        self._counters.stat("published")

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        """Records received (pushed or synced) for ``windows``: a local read, records arrive in the background
        (``prefer`` is ignored: everything pushed is already here)."""
        self._check_open()
        self._store.prune(self._edge.now_window())
        return self._store.records(list(windows))

    async def peers(self) -> list[str]:
        """libp2p peer ids (base58) of the peers we are connected to."""
        self._check_open()
        return await self._bridge.call(self._t_peers, timeout=self.cfg.request_timeout_s)

    def addresses(self) -> list[str]:
        """Full multiaddrs other peers can bootstrap from (``/ip4/HOST/tcp/PORT/p2p/PEERID``)."""
        return list(self._addresses)

    async def close(self) -> None:
        """Leave the swarm: stop the trio thread (host, pubsub, sync tasks) and wait for it; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._bridge.request_stop()
        if not await self._bridge.join(self.cfg.request_timeout_s + 5.0):
            logger.warning("libp2p thread did not stop within %.0f s", self.cfg.request_timeout_s + 5.0)

    # -- extras ---------------------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters: records accepted at the edge, rejections and drops by reason, published, synced, fetched,
        peer exchange (``px_*``), seconds spent validating at the edge, and the peers known by advertisement."""
        return {**self._counters.snapshot(), "known_peers": len(self._table)}

    def rejections(self) -> dict[str, int]:
        """Records and advertisements refused at the edge (gossip, announce-then-fetch, sync, peer exchange), by
        reason."""
        return self._counters.rejections()

    async def publish_raw(self, frame: bytes) -> None:
        """Gossip an arbitrary frame (fault injection and tests only: a hostile peer built with
        ``validate_own=False`` uses it to try forged, tampered, oversized or wrong-swarm messages)."""
        self._check_open()
        await self._bridge.call(self._t_publish, bytes(frame), timeout=self.cfg.request_timeout_s)

    async def sync_now(self) -> int:
        """Pull missing records from every connected peer at once; returns how many new records arrived."""
        self._check_open()
        return await self._bridge.call(self._t_sync_all, timeout=self.cfg.request_timeout_s * 3)

    async def exchange_peers_now(self) -> int:
        """One peer-exchange round with every connected peer, then dial up to ``target_peers``; returns the number
        of connected peers after it (tests and benchmarks)."""
        self._check_open()
        return await self._bridge.call(self._t_exchange_all, timeout=self.cfg.request_timeout_s * 3)

    # -- shared helpers (either thread) -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("libp2p transport is closed")

    def _on_thread_exit(self, error: BaseException | None) -> None:
        self._closed = True
        if not self._ready.done():
            if error is not None:
                self._ready.set_exception(error if isinstance(error, Exception) else TransportError(repr(error)))
            else:
                self._ready.set_exception(TransportError("libp2p thread ended before it was ready"))

    async def _throttle(self) -> None:
        """Token bucket (capacity = one second of ``max_messages_per_s``) for our own publishes."""
        rate = self.cfg.max_messages_per_s
        now = time.monotonic()
        self._tokens = min(max(1.0, rate), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        if self._tokens < 1.0:
            self._counters.drop("publish_throttled")
            await asyncio.sleep((1.0 - self._tokens) / rate)
            self._tokens, self._tokens_at = 1.0, time.monotonic()
        self._tokens -= 1.0

    # -- trio thread: host and gossip ------------------------------------------------------------------------------

    async def _t_main(self) -> None:
        cfg = self.cfg
        listen = [multiaddr.Multiaddr(f"/ip4/{cfg.host}/tcp/{cfg.port}")]
        self._key_pair = create_new_key_pair(self._key.seed)
        host = new_host(key_pair=self._key_pair, listen_addrs=listen)
        pubsub, router = build_pubsub(host, cfg, self._counters.drop)
        self._host, self._pubsub = host, pubsub
        self._sync = SyncClient(
            host,
            self._store,
            self._counters,
            max_record_bytes=self.protocol.max_record_bytes,
            timeout=cfg.request_timeout_s,
            admit=self._edge.admit,
        )
        server = SyncServer(self._store, self._counters, cfg.request_timeout_s, self._t_serve_peers)
        async with (
            host.run(listen_addrs=listen),
            background_trio_service(pubsub),
            background_trio_service(router),
            trio.open_nursery() as nursery,
        ):
            try:
                with trio.fail_after(cfg.startup_timeout_s):
                    host.set_stream_handler(TProtocol(SYNC_PROTOCOL), server.handle)
                    await pubsub.wait_until_ready()
                    pubsub.set_topic_validator(self.topic, self._t_validate, True)
                    subscription = await pubsub.subscribe(self.topic)
                    nursery.start_soon(self._t_drain, subscription)
                    connected = await self._t_bootstrap()
            except BaseException as e:
                if not self._ready.done():
                    self._ready.set_exception(e if isinstance(e, Exception) else TransportError(repr(e)))
                nursery.cancel_scope.cancel()
                if isinstance(e, Exception):
                    return
                raise
            self._bridge.serve(nursery)
            self._nursery = nursery
            self._ready.set_result(self._t_full_addrs())
            nursery.start_soon(self._t_join, connected)
            nursery.start_soon(self._t_sync_loop)
            if cfg.peer_exchange:
                nursery.start_soon(self._t_mesh_loop)
            await self._bridge.wait_stop_requested()
            self._bridge.serve(None)
            self._nursery = None
            nursery.cancel_scope.cancel()

    def _t_full_addrs(self) -> list[str]:
        pid = self._host.get_id().to_base58()
        addrs = self.cfg.announce_maddrs or [str(a) for a in self._host.get_addrs()]
        return [a if "/p2p/" in a else f"{a}/p2p/{pid}" for a in addrs]

    async def _t_bootstrap(self) -> list[ID]:
        """Connect to the initial peers, retrying for most of the startup timeout (a loaded peer may be slow to
        complete the handshake); raise if none was reachable."""
        connected: dict[ID, None] = {}
        errors: dict[str, str] = {}
        pending = list(self.cfg.initial_peers)
        deadline = trio.current_time() + self.cfg.startup_timeout_s * 0.8
        delay = 0.5
        while pending:
            for addr in list(pending):
                try:
                    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
                    with trio.fail_after(self.cfg.request_timeout_s):
                        await self._host.connect(info)
                    connected[info.peer_id] = None
                    pending.remove(addr)
                except Exception as e:
                    errors[addr] = f"{e.__class__.__name__}: {e}"
                    logger.debug("could not connect to initial peer %s (%s)", addr, e)
            # One reachable peer is enough to join; keep trying the others only while none is.
            if connected or trio.current_time() + delay > deadline:
                break
            await trio.sleep(delay)
            delay = min(delay * 2, 4.0)
        for addr in pending:
            logger.warning("could not connect to initial peer %s (%s)", addr, errors.get(addr, "?"))
        if self.cfg.initial_peers and not connected:
            raise TransportError("no initial peer reachable: " + "; ".join(f"{a}: {e}" for a, e in errors.items()))
        return list(connected)

    async def _t_join(self, bootstrap: list[ID]) -> None:
        """Right after start: learn the bootstrap peers' peers and dial some (so we do not hang off one hub), then
        pull the recent windows."""
        if self.cfg.peer_exchange:
            for peer in bootstrap:
                await self._t_exchange_quietly(peer)
            await self._t_fill()
        for peer in bootstrap:
            if not self._t_incompatible(peer):
                await self._t_sync_quietly(peer)

    async def _t_drain(self, subscription: Any) -> None:
        # Records were already stored by the validator; draining at once keeps the 32-slot buffer from overflowing.
        async for _ in subscription:
            self._counters.stat("gossip_delivered")

    async def _t_publish(self, frame: bytes) -> None:
        await self._pubsub.publish(self.topic, frame)

    async def _t_peers(self) -> list[str]:
        return [p.to_base58() for p in self._host.get_connected_peers()]

    async def _t_validate(self, forwarder: ID, msg: Any) -> bool:
        """GossipSub topic validator: False drops the message, stops its propagation and costs the forwarder."""
        data = bytes(msg.data)
        if forwarder == self._host.get_id() and not self._validate_own:
            return True
        if not data:
            return self._reject_frame("malformed")
        tag, body = data[0], data[1:]
        if tag == TAG_RECORD:
            if self._edge.admit(body, digest_of(body)) is not None:
                return False
            self._counters.stat("gossip_records")
            return True
        if tag == TAG_ANNOUNCE:
            return await self._t_validate_announce(forwarder, body, msg)
        return self._reject_frame("malformed")

    def _reject_frame(self, reason: str) -> bool:
        self._counters.reject(reason)
        return False

    async def _t_validate_announce(self, forwarder: ID, body: bytes, msg: Any) -> bool:
        try:
            ann = msgpack.unpackb(body, raw=False, max_bin_len=64, max_str_len=64, max_array_len=0, max_map_len=8)
            digest, size = ann["digest"], ann["size"]
            if not (isinstance(digest, bytes) and len(digest) == 32 and isinstance(size, int)):
                raise ValueError("bad announcement fields")
        except Exception:
            return self._reject_frame("malformed_announce")
        if size > self.protocol.max_record_bytes:
            return self._reject_frame("oversize")
        if self._store.has(digest):
            return True
        if forwarder == self._host.get_id():
            return self._reject_frame("announce_unknown_record")
        assert self._sync is not None and self._pubsub is not None
        wait = self.cfg.request_timeout_s * 0.8  # inside pubsub's validation timeout (request_timeout_s)
        if digest in self._fetching:
            # Each neighbour forwards the announcement; one copy is being fetched. Waiting for that fetch would hold
            # one of py-libp2p's 10 validator slots per copy (it marks a message seen only once validated, unlike
            # go-libp2p), and under load those slots would all wait on a few fetches while new announcements time
            # out. So the copy is dropped at once, unjudged, and its forwarder (which holds the record: a peer
            # forwards an announcement only once it has it) is remembered in case that fetch fails.
            alternates = self._fetching[digest]
            if (
                forwarder not in alternates
                and len(alternates) < MAX_ANNOUNCE_ALTERNATES
                and not self._forwarders.held_off(forwarder, trio.current_time())
            ):
                alternates.append(forwarder)
            self._counters.stat("announce_copy_in_flight")
            self._pubsub.unjudged()
            return False
        refusal = self._forwarders.refusal(forwarder, trio.current_time())
        if refusal is not None:
            # A forwarder whose fetches failed lately, or that already has fetches running here, is not asked now, so
            # a peer that announces and never serves cannot fill the validator slots (SPEC 7.3). Dropped unjudged:
            # the same announcement from another forwarder is still validated, and sync heals the rest.
            self._counters.stat(refusal)
            self._pubsub.unjudged()
            return False
        self._fetching[digest] = []
        try:
            got = await self._t_fetch_announced(forwarder, digest, wait)
        except BaseException:
            # Cancelled from outside: py-libp2p's own validation timeout, which starts while a copy still queues
            # for a validator slot, or shutdown. The record must not stay marked as being fetched (every later copy
            # would be dropped as "in flight" for good): the forwarders of the dropped copies are asked instead.
            self._t_fetch_elsewhere(digest)
            raise
        if got is None:
            # Not proof of anything (the forwarder may just be slow): dropped without a penalty; the record is asked
            # of the forwarders of the copies dropped meanwhile, and anti-entropy sync heals the rest.
            self._counters.drop("announce_fetch_failed")
            self._pubsub.unjudged()
            self._t_fetch_elsewhere(digest)
            return False
        if not got:
            self._pubsub.forwarder_failed()  # its penalty; the next forwarder of the announcement is asked afresh
            self._t_fetch_elsewhere(digest)
            return self._reject_frame("announce_unavailable")
        del self._fetching[digest]
        if self._edge.admit(got[0], digest) is not None:
            return False
        self._counters.stat("fetched_large")
        return True

    async def _t_fetch_announced(self, forwarder: ID, digest: bytes, wait: float) -> list[bytes] | None:
        """Ask ``forwarder`` for an announced record: what it sent (empty: it does not hold it), or None if the fetch
        failed or ran past ``wait``; the forwarder's backoff learns which. Cancelled from outside, it frees the
        forwarder's place and says nothing about it."""
        assert self._sync is not None
        if self._t_incompatible(forwarder):
            return None  # another major: the request would dial it back, and its records are refused anyway
        self._forwarders.start(forwarder)
        got: list[bytes] | None = None
        served: bool | None = None  # stays None if cancelled from outside: no verdict on the forwarder
        try:
            with trio.fail_after(wait):
                got = await self._sync.get(forwarder, [digest])
            served = bool(got)
        except Exception as e:
            served = False
            logger.debug("announce fetch from %s failed: %s", forwarder, e)
        finally:
            self._forwarders.finish(forwarder, trio.current_time(), served=served)
        return got

    def _t_fetch_elsewhere(self, digest: bytes) -> None:
        """The fetch of an announced record failed: ask the forwarders of the copies dropped while it ran, in the
        background (outside py-libp2p's validator slots)."""
        if not self._fetching.get(digest) or self._nursery is None:
            self._fetching.pop(digest, None)
            return
        try:
            self._nursery.start_soon(self._t_fetch_from_alternates, digest)
        except RuntimeError:  # the host is closing
            self._fetching.pop(digest, None)

    async def _t_fetch_from_alternates(self, digest: bytes) -> None:
        tried: set[ID] = set()
        deadline = trio.current_time() + self.cfg.request_timeout_s
        try:
            while not self._store.has(digest):
                # copies arriving meanwhile are still dropped and add their forwarders here
                now = trio.current_time()
                known = self._fetching.get(digest, [])
                untried = [p for p in known if p not in tried and not self._forwarders.held_off(p, now)]
                ready = [p for p in untried if self._forwarders.refusal(p, now) is None]
                if not ready:
                    if not untried or now >= deadline:
                        return
                    await trio.sleep(ALTERNATE_WAIT_S)  # the untried ones are busy with other fetches: wait a little
                    continue
                tried.add(ready[0])
                got = await self._t_fetch_announced(ready[0], digest, self.cfg.request_timeout_s)
                if not got:
                    self._counters.drop("announce_retry_failed")
                    continue
                if self._edge.admit(got[0], digest) is None:
                    self._counters.stat("fetched_large_retry")
                return
        finally:
            self._fetching.pop(digest, None)

    # -- trio thread: anti-entropy ---------------------------------------------------------------------------------

    def _sync_windows(self) -> list[int]:
        now = self._edge.now_window()
        return list(range(now - self.cfg.expiration_windows, now + self.protocol.max_future_windows + 1))

    async def _t_sync_quietly(self, peer: ID) -> None:
        assert self._sync is not None
        try:
            await self._sync.sync_from(peer, self._sync_windows())
        except Exception as e:
            self._counters.drop("sync_failed")
            logger.debug("sync with %s failed: %s: %s", peer, e.__class__.__name__, e)

    async def _t_sync_all(self) -> int:
        assert self._sync is not None
        total = 0
        for peer in self._t_usable_peers():
            try:
                total += await self._sync.sync_from(peer, self._sync_windows())
            except Exception as e:
                self._counters.drop("sync_failed")
                logger.debug("sync with %s failed: %s", peer, e)
        return total

    async def _t_sync_loop(self) -> None:
        while True:
            await trio.sleep(self.cfg.sync_interval_s * random.uniform(0.8, 1.2))
            self._store.prune(self._edge.now_window())
            await self._t_drop_incompatible()
            peers = self._t_usable_peers()
            if peers:
                await self._t_sync_quietly(random.choice(peers))

    # -- trio thread: peer exchange and mesh -------------------------------------------------------------------------

    def _t_own_ad(self) -> bytes:
        """Our advertisement, re-signed when a tenth of its lifetime has passed."""
        now = self.clock()
        if self._own_ad is None or now - self._own_ad[0] > self.cfg.advertisement_ttl_s / 10:
            ad = make_ad(
                self._key_pair,
                self._host.get_id(),
                swarm=self.swarm,
                addrs=self._addresses or self._t_full_addrs(),
                version=self._version,
                now=now,
            )
            self._own_ad = (now, ad)
        return self._own_ad[1]

    def _t_learn(self, raw: Any) -> PeerAd | None:
        """Verify an advertisement and keep it if it is of a compatible peer; counts and reports what it refuses."""
        try:
            ad = verify_ad(raw, swarm=self.swarm, now=self.clock(), ttl_s=self.cfg.advertisement_ttl_s)
        except AdError as e:
            self._counters.reject(e.reason)
            return None
        if ad.peer == self._host.get_id().to_base58():
            return None
        if not compatible(ad.version, self._version):
            self._counters.reject(INCOMPATIBLE)
            report_incompatible(ad.version, f"libp2p peer {ad.peer}", self._version)
            self._incompatible.add(ad.peer)
            self._table.forget(ad.peer)
            return None
        self._table.add(ad)
        return ad

    def _t_serve_peers(self, requester_ad: Any) -> list[bytes]:
        """The ``peers`` op: learn the requester's advertisement, answer ours and a random sample of the others."""
        exclude: set[str] = set()
        if requester_ad is not None:
            ad = self._t_learn(requester_ad)
            if ad is not None:
                exclude.add(ad.peer)
        return [self._t_own_ad()] + [ad.raw for ad in self._table.sample(MAX_PX - 1, exclude=exclude)]

    def _t_incompatible(self, peer: ID) -> bool:
        """Whether ``peer``'s advertisement was of another major version."""
        return peer.to_base58() in self._incompatible

    def _t_usable_peers(self) -> list[ID]:
        """Connected peers not known to speak another major version (the only ones worth a request)."""
        return [p for p in self._host.get_connected_peers() if not self._t_incompatible(p)]

    async def _t_drop_incompatible(self) -> None:
        """Disconnect every connected peer known to speak another major version. Either side may have dialled
        again since it was found out (a request to a peer that is not connected dials it, and so does py-libp2p's
        own auto-connector), and a node of another version may not disconnect by itself, so this runs at every sync
        and mesh tick, not only after an exchange."""
        for peer in list(self._host.get_connected_peers()):
            if self._t_incompatible(peer):
                await self._t_hang_up(peer)

    async def _t_hang_up(self, peer: ID) -> None:
        """Disconnect a neighbour of another major (counted when it was connected) and forget its addresses, which
        py-libp2p's auto-connector would otherwise dial again."""
        if peer in self._host.get_connected_peers():
            self._counters.stat("px_disconnected_incompatible")
            try:
                with trio.move_on_after(self.cfg.request_timeout_s):
                    await self._host.disconnect(peer)
            except Exception as e:
                logger.debug("disconnecting %s failed: %s: %s", peer, e.__class__.__name__, e)
        self._host.get_peerstore().clear_addrs(peer)

    async def _t_exchange(self, peer: ID) -> None:
        assert self._sync is not None
        if not self._t_incompatible(peer):
            raws = await self._sync.peers(peer, self._t_own_ad())
            self._counters.stat("px_rounds")
            for raw in raws:
                self._t_learn(raw)
        if self._t_incompatible(peer):
            # A direct neighbour of another major version: nothing it sends is usable, so do not stay connected
            # (and, once known, do not ask it again: the request would dial it back).
            await self._t_hang_up(peer)

    async def _t_exchange_quietly(self, peer: ID) -> None:
        try:
            await self._t_exchange(peer)
        except Exception as e:
            self._counters.drop("px_failed")
            logger.debug("peer exchange with %s failed: %s: %s", peer, e.__class__.__name__, e)

    async def _t_exchange_all(self) -> int:
        for peer in list(self._host.get_connected_peers()):
            await self._t_exchange_quietly(peer)
        await self._t_fill()
        return len(self._host.get_connected_peers())

    async def _t_fill(self) -> None:
        """Dial known peers (at most a few at a time) while fewer than ``target_peers`` are connected."""
        connected = {p.to_base58() for p in self._host.get_connected_peers()}
        need = self.cfg.target_peers - len(connected)
        if need <= 0:
            return
        me = self._host.get_id().to_base58()
        exclude = connected | self._incompatible | {me}
        chosen = self._table.sample(min(need, MAX_DIALS_PER_ROUND), exclude=exclude)
        async with trio.open_nursery() as nursery:
            for ad in chosen:
                nursery.start_soon(self._t_dial, ad)

    async def _t_dial(self, ad: PeerAd) -> None:
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(ad.addrs[0]))
            with trio.fail_after(self.cfg.request_timeout_s):
                await self._host.connect(info)
            self._counters.stat("px_dialled")
        except Exception as e:
            # Gone or unreachable: forget it until someone advertises a newer one.
            self._counters.drop("px_dial_failed")
            self._table.forget(ad.peer)
            logger.debug("could not dial %s at %s: %s", ad.peer, ad.addrs[0], e)

    async def _t_mesh_loop(self) -> None:
        while True:
            await trio.sleep(self.cfg.peer_exchange_interval_s * random.uniform(0.8, 1.2))
            with trio.move_on_after(self.cfg.request_timeout_s * 2):
                await self._t_mesh_round()

    async def _t_mesh_round(self) -> None:
        """Swap advertisements with one random connected peer (or, alone, dial the initial peers again), then
        dial up to ``target_peers``."""
        await self._t_drop_incompatible()
        connected = self._t_usable_peers()
        if connected:
            await self._t_exchange_quietly(random.choice(connected))
        elif self.cfg.initial_peers and not len(self._table):
            for addr in self.cfg.initial_peers:
                try:
                    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
                    if self._t_incompatible(info.peer_id):
                        continue
                    with trio.fail_after(self.cfg.request_timeout_s):
                        await self._host.connect(info)
                except Exception as e:
                    logger.debug("initial peer %s still unreachable: %s", addr, e)
        await self._t_fill()
