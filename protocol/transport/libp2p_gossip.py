"""The libp2p transport: signed records pushed over py-libp2p GossipSub, plus a direct sync protocol for catch-up.

Wire layout (see ``protocol/SPEC.md`` section 7.3):

* one GossipSub topic per swarm, ``{topic_prefix}/{swarm}/records/1``; a message is one tag byte and a body:
  ``0x01 || record`` (records up to ``inline_max_bytes``) or ``0x02 || msgpack {window, digest, size}`` (an
  announcement of a larger record, fetched from the peer that forwarded it);
* a request/response stream protocol, :data:`SYNC_PROTOCOL`: ``have`` lists the ``(window, digest)`` pairs a peer
  holds for some windows, ``get`` returns records by SHA-256 digest. Nodes pull what they miss from one random
  peer every ``sync_interval_s`` and from their bootstrap peers at start (anti-entropy: it heals every gossip drop
  and gives late joiners the recent windows).

Edge validation: every gossip message passes a GossipSub topic validator before it is delivered or forwarded. It
decodes the record (size cap, schema, Ed25519 signature), checks the swarm and the window horizon and runs the
caller's stateless hook (``RecordValidator.is_storable``). Invalid messages are not forwarded and lower the
forwarder's GossipSub score (``P4``), so a peer that keeps sending them is eventually ignored. Announcements are
only forwarded by peers that fetched and validated the record, so every hop can fetch it from the previous one.

py-libp2p's silent limits are handled here: its per-topic spam limit is raised (``router_max_messages_per_s``)
and our own publishes are rate limited below it; the 32-message subscription buffer cannot lose records because
the validator stores them (the subscription is still drained at once); frames over 1 MiB are avoided by
announce-then-fetch. Every drop is counted by reason (:meth:`Libp2pTransport.stats`).

py-libp2p is trio-based: the host runs in ``trio.run`` on a private thread. Callers' coroutines submit work
into that thread's nursery and await a future; every call has a timeout. Received records live in a bounded
in-memory store by window, forgotten ``expiration_windows`` windows later, so ``fetch_recent`` is a local read.

This is the only module of the project that imports libp2p (hivemind and libp2p cannot share a process). It
knows nothing about replay, quotas or what a record's payload means: the channel's validator does those.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

import msgpack
import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.score import ScoreParams, TopicScoreParams
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from protocol.errors import TransportError
from protocol.records import RecordDecodeError, RecordSignatureError, decode_record, window_of
from protocol.transport.base import RecordCheck, Transport
from protocol.transport.config import Libp2pTransportConfig, ProtocolConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Stream protocol for anti-entropy and announce-then-fetch.
SYNC_PROTOCOL = "/rl-swarm/sync/1.0.0"
#: Gossip message tags.
TAG_RECORD = 0x01
TAG_ANNOUNCE = 0x02
#: Largest sync request accepted (a request names windows or digests only).
MAX_REQUEST_BYTES = 64 * 1024
#: Most digests one ``get`` request may name, and most (window, digest) pairs one ``have`` reply may list.
MAX_GET = 32
MAX_HAVE = 8192
#: Most windows one ``have`` request may name.
MAX_WINDOWS = 64
#: GossipSub score: each invalid message costs a forwarder 1 point (decaying 1% per heartbeat); below
#: -PUBLISH_THRESHOLD its messages are refused, below -GRAYLIST_THRESHOLD it is ignored altogether.
PUBLISH_THRESHOLD = 20.0
GRAYLIST_THRESHOLD = 50.0


def digest_of(data: bytes) -> bytes:
    """The content digest used by announcements and the sync protocol: SHA-256 (32 bytes)."""
    return hashlib.sha256(data).digest()


def gossip_topic(prefix: str, swarm: str) -> str:
    """The GossipSub topic of a swarm."""
    return f"{prefix}/{swarm}/records/1"


class _RecordStore:
    """Validated records by window and digest, thread safe, bounded per window, forgotten after a horizon."""

    def __init__(self, expiration_windows: int, max_per_window: int) -> None:
        self.expiration_windows = expiration_windows
        self.max_per_window = max_per_window
        self._windows: dict[int, OrderedDict[bytes, bytes]] = {}
        self._where: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def has(self, digest: bytes) -> bool:
        with self._lock:
            return digest in self._where

    def get(self, digest: bytes) -> bytes | None:
        with self._lock:
            w = self._where.get(digest)
            return None if w is None else self._windows[w].get(digest)

    def add(self, window: int, digest: bytes, data: bytes) -> int:
        """Store a record; returns how many older records of that window were evicted to make room."""
        evicted = 0
        with self._lock:
            if digest in self._where:
                return 0
            records = self._windows.setdefault(window, OrderedDict())
            while len(records) >= self.max_per_window:
                old, _ = records.popitem(last=False)
                del self._where[old]
                evicted += 1
            records[digest] = data
            self._where[digest] = window
        return evicted

    def records(self, windows: Sequence[int]) -> list[bytes]:
        with self._lock:
            return [data for w in dict.fromkeys(windows) for data in self._windows.get(w, {}).values()]

    def inventory(self, windows: Sequence[int], limit: int) -> list[tuple[int, bytes]]:
        with self._lock:
            out = [(w, d) for w in dict.fromkeys(windows) for d in self._windows.get(w, {})]
        return out[:limit]

    def prune(self, now_window: int) -> None:
        horizon = now_window - self.expiration_windows
        with self._lock:
            for w in [w for w in self._windows if w < horizon]:
                for d in self._windows.pop(w):
                    del self._where[d]


class _CountingGossipSub(GossipSub):
    """GossipSub that counts what its spam protection drops (it only logs them)."""

    count: Callable[[str], None] = staticmethod(lambda reason: None)

    def _check_spam_protection(self, peer_id: ID, msg: Any) -> bool:
        ok = super()._check_spam_protection(peer_id, msg)
        if not ok:
            self.count("spam_protection")
        return ok


class _CountingPubsub(Pubsub):
    """Pubsub that counts messages its subscription buffer drops (it only logs them).

    Nothing is lost by such a drop here (the topic validator already stored the record), but it is counted.
    """

    count: Callable[[str], None] = staticmethod(lambda reason: None)

    def notify_subscriptions(self, publish_message: Any) -> None:
        for topic in publish_message.topicIDs:
            if topic in self.topic_ids:
                try:
                    self.subscribed_topics_send[topic].send_nowait(publish_message)
                except trio.WouldBlock:
                    self.count("subscription_overflow")


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
    ) -> None:
        self.cfg = cfg
        self.protocol = protocol
        self.swarm = swarm
        self.topic = gossip_topic(cfg.topic_prefix, swarm)
        self.clock = clock
        self._record_validator = validate
        self._validate_own = validate_own
        self._store = _RecordStore(cfg.expiration_windows, cfg.max_records_per_window)
        self._lock = threading.Lock()
        self._rejected: Counter[str] = Counter()
        self._drops: Counter[str] = Counter()
        self._stats: Counter[str] = Counter()
        self._edge_seconds = 0.0  # CPU spent in edge validation (for the benchmark's codec share)
        self._addresses: list[str] = []
        self._closed = False
        self._ready: concurrent.futures.Future[list[str]] = concurrent.futures.Future()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._host: Any = None
        self._pubsub: Any = None
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
    ) -> Libp2pTransport:
        """Start a libp2p host, join the swarm's topic and connect to ``cfg.initial_peers`` (if any).

        ``validate`` is the stateless edge check (``RecordValidator.is_storable``). ``validate_own=False`` lets
        this node publish messages its own validator would refuse (fault injection in tests only).
        """
        protocol = protocol if protocol is not None else ProtocolConfig()
        self = cls(cfg, protocol, swarm, validate, validate_own=validate_own)
        self._thread = threading.Thread(target=self._thread_main, name=f"libp2p-{swarm}", daemon=True)
        self._thread.start()
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
        reason = self._admit(data, digest)
        if reason is not None and self._validate_own:
            raise TransportError(f"record refused by this node's edge validation: {reason}")
        if len(data) <= self.cfg.inline_max_bytes:
            frame = bytes([TAG_RECORD]) + data
        else:
            announce = {"digest": digest, "size": len(data), "window": window}
            frame = bytes([TAG_ANNOUNCE]) + msgpack.packb(announce, use_bin_type=True)
        async with self._publish_lock:
            await self._throttle()
            await self._call(self._t_publish, frame, timeout=self.cfg.request_timeout_s)
        self._count_stat("published")

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        """Records received (pushed or synced) for ``windows``: a local read, records arrive in the background
        (``prefer`` is ignored: everything pushed is already here)."""
        self._check_open()
        self._store.prune(self._now_window())
        return self._store.records(list(windows))

    async def peers(self) -> list[str]:
        """libp2p peer ids (base58) of the peers we are connected to."""
        self._check_open()
        return await self._call(self._t_peers, timeout=self.cfg.request_timeout_s)

    def addresses(self) -> list[str]:
        """Full multiaddrs other peers can bootstrap from (``/ip4/HOST/tcp/PORT/p2p/PEERID``)."""
        return list(self._addresses)

    async def close(self) -> None:
        """Leave the swarm: stop the trio thread (host, pubsub, sync tasks) and wait for it; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._stop.set)
        thread = self._thread
        deadline = time.monotonic() + self.cfg.request_timeout_s + 5.0
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if thread is not None and thread.is_alive():
            logger.warning("libp2p thread did not stop within %.0f s", self.cfg.request_timeout_s + 5.0)

    # -- extras ---------------------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters: records accepted at the edge, rejections and drops by reason, published, synced, fetched,
        seconds spent validating at the edge."""
        with self._lock:
            return {
                **dict(self._stats),
                "edge_seconds": self._edge_seconds,
                "rejected": dict(self._rejected),
                "rejected_total": sum(self._rejected.values()),
                "drops": dict(self._drops),
                "drops_total": sum(self._drops.values()),
            }

    def rejections(self) -> dict[str, int]:
        """Records refused by edge validation (gossip, announce-then-fetch, sync), by reason."""
        with self._lock:
            return dict(self._rejected)

    async def publish_raw(self, frame: bytes) -> None:
        """Gossip an arbitrary frame (fault injection and tests only: a hostile peer built with
        ``validate_own=False`` uses it to try forged, tampered, oversized or wrong-swarm messages)."""
        self._check_open()
        await self._call(self._t_publish, bytes(frame), timeout=self.cfg.request_timeout_s)

    async def sync_now(self) -> int:
        """Pull missing records from every connected peer at once; returns how many new records arrived."""
        self._check_open()
        return await self._call(self._t_sync_all, timeout=self.cfg.request_timeout_s * 3)

    # -- shared helpers (either thread) -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("libp2p transport is closed")

    def _now_window(self) -> int:
        return window_of(self.clock(), self.protocol.window_seconds)

    def _count_drop(self, reason: str) -> None:
        with self._lock:
            self._drops[reason] += 1

    def _count_stat(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._stats[name] += n

    def _admit(self, data: bytes, digest: bytes) -> str | None:
        """Validate a record and store it; None if it is (now) stored, else the rejection reason (counted)."""
        if self._store.has(digest):
            return None
        reason = self._check(data)
        if reason is not None:
            with self._lock:
                self._rejected[reason] += 1
            logger.debug("edge validation refused a record (%s), %d bytes", reason, len(data))
            return reason
        return None

    def _check(self, data: bytes) -> str | None:
        start = time.perf_counter()
        try:
            return self._check_untimed(data)
        finally:
            with self._lock:
                self._edge_seconds += time.perf_counter() - start

    def _check_untimed(self, data: bytes) -> str | None:
        if len(data) > self.protocol.max_record_bytes:
            return "oversize"
        try:
            env = decode_record(data, self.protocol.max_record_bytes)
        except (RecordDecodeError, RecordSignatureError) as e:
            return e.reason
        except Exception:  # the receive path never raises
            logger.debug("unexpected decode failure", exc_info=True)
            return "malformed"
        if env.swarm != self.swarm:
            return "wrong_swarm"
        now = self._now_window()
        if env.window > now + self.protocol.max_future_windows:
            return "future"
        if env.window < now - self.cfg.expiration_windows:
            return "stale"
        hook = self._record_validator
        if hook is not None:
            try:
                ok = bool(hook(data))
            except Exception:
                ok = False
            if not ok:
                return "invalid_record"
        evicted = self._store.add(env.window, digest_of(data), data)
        if evicted:
            self._count_drop_n("store_evicted", evicted)
        self._count_stat("accepted")
        return None

    def _count_drop_n(self, reason: str, n: int) -> None:
        with self._lock:
            self._drops[reason] += n

    async def _throttle(self) -> None:
        """Token bucket (capacity = one second of ``max_messages_per_s``) for our own publishes."""
        rate = self.cfg.max_messages_per_s
        now = time.monotonic()
        self._tokens = min(max(1.0, rate), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        if self._tokens < 1.0:
            self._count_drop("publish_throttled")
            await asyncio.sleep((1.0 - self._tokens) / rate)
            self._tokens, self._tokens_at = 1.0, time.monotonic()
        self._tokens -= 1.0

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float) -> T:
        """Run ``fn(*args)`` in the trio thread's nursery; ``TimeoutError`` past ``timeout``."""
        token, nursery = self._token, self._nursery
        if token is None or nursery is None:
            raise TransportError("libp2p transport is not running")
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def spawn() -> None:
            nursery.start_soon(self._t_run_call, fut, fn, args, timeout)

        try:
            token.run_sync_soon(spawn)
        except trio.RunFinishedError as e:
            raise TransportError("libp2p transport has stopped") from e
        try:
            # The outer bound is a safety net in case the trio thread itself is stuck.
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout + 5.0)
        except TimeoutError:
            fut.cancel()
            raise

    # -- trio thread -------------------------------------------------------------------------------------------------

    async def _t_run_call(self, fut: concurrent.futures.Future[Any], fn: Callable[..., Awaitable[Any]], args, timeout):
        if not fut.set_running_or_notify_cancel():
            return
        try:
            with trio.fail_after(timeout):
                result = await fn(*args)
        except trio.TooSlowError:
            fut.set_exception(TimeoutError(f"libp2p call {fn.__name__} timed out after {timeout} s"))
        except trio.Cancelled:
            fut.set_exception(TransportError("libp2p transport closed during the call"))
            raise
        except TransportError as e:
            fut.set_exception(e)
        except Exception as e:
            fut.set_exception(TransportError(f"libp2p {fn.__name__} failed: {e.__class__.__name__}: {e}"))
        else:
            fut.set_result(result)

    def _thread_main(self) -> None:
        try:
            trio.run(self._t_main)
        except BaseException as e:
            logger.warning("libp2p thread ended with %s: %s", e.__class__.__name__, e, exc_info=True)
            if not self._ready.done():
                self._ready.set_exception(e if isinstance(e, Exception) else TransportError(repr(e)))
        finally:
            self._closed = True
            if not self._ready.done():
                self._ready.set_exception(TransportError("libp2p thread ended before it was ready"))

    async def _t_main(self) -> None:
        cfg = self.cfg
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        listen = [multiaddr.Multiaddr(f"/ip4/{cfg.host}/tcp/{cfg.port}")]
        host = new_host(key_pair=create_new_key_pair(), listen_addrs=listen)
        score = ScoreParams(
            p4_invalid_messages=TopicScoreParams(weight=1.0, cap=1000.0, decay=0.99),
            publish_threshold=-PUBLISH_THRESHOLD,
            gossip_threshold=-PUBLISH_THRESHOLD,
            graylist_threshold=-GRAYLIST_THRESHOLD,
        )
        router = _CountingGossipSub(
            protocols=[PROTOCOL_ID_V11, PROTOCOL_ID],
            degree=cfg.degree,
            degree_low=max(1, cfg.degree - 2),
            degree_high=2 * cfg.degree,
            heartbeat_interval=cfg.heartbeat_interval_s,
            max_messages_per_topic_per_second=cfg.router_max_messages_per_s,
            score_params=score,
        )
        router.count = self._count_drop
        gate = router.scorer.allow_publish

        def allow_publish(peer: ID, topics: list[str]) -> bool:
            ok = gate(peer, topics)
            if not ok:
                self._count_drop("low_peer_score")
            return ok

        router.scorer.allow_publish = allow_publish
        pubsub = _CountingPubsub(host, router, validation_timeout=cfg.request_timeout_s)
        pubsub.count = self._count_drop
        self._host, self._pubsub = host, pubsub
        async with (
            host.run(listen_addrs=listen),
            background_trio_service(pubsub),
            background_trio_service(router),
            trio.open_nursery() as nursery,
        ):
            try:
                with trio.fail_after(cfg.startup_timeout_s):
                    host.set_stream_handler(SYNC_PROTOCOL, self._t_serve)
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
            self._nursery = nursery
            addrs = [str(a) for a in host.get_addrs()]
            pid = host.get_id().to_base58()
            self._ready.set_result([a if "/p2p/" in a else f"{a}/p2p/{pid}" for a in addrs])
            for peer in connected:
                nursery.start_soon(self._t_sync_quietly, peer)
            nursery.start_soon(self._t_sync_loop)
            await self._stop.wait()
            self._nursery = None
            nursery.cancel_scope.cancel()

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

    async def _t_drain(self, subscription: Any) -> None:
        # Records were already stored by the validator; draining at once keeps the 32-slot buffer from overflowing.
        async for _ in subscription:
            self._count_stat("gossip_delivered")

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
            if self._admit(body, digest_of(body)) is not None:
                return False
            self._count_stat("gossip_records")
            return True
        if tag == TAG_ANNOUNCE:
            return await self._t_validate_announce(forwarder, body)
        return self._reject_frame("malformed")

    def _reject_frame(self, reason: str) -> bool:
        with self._lock:
            self._rejected[reason] += 1
        return False

    async def _t_validate_announce(self, forwarder: ID, body: bytes) -> bool:
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
        try:
            # Inside pubsub's validation timeout (request_timeout_s), so a slow fetch is our drop, not a penalty.
            with trio.fail_after(self.cfg.request_timeout_s * 0.8):
                got = await self._t_get(forwarder, [digest])
        except Exception as e:
            logger.debug("announce fetch from %s failed: %s", forwarder, e)
            self._count_drop("announce_fetch_failed")
            return False
        if not got:
            return self._reject_frame("announce_unavailable")
        if self._admit(got[0], digest) is not None:
            return False
        self._count_stat("fetched_large")
        return True

    # -- sync protocol ---------------------------------------------------------------------------------------------

    async def _t_serve(self, stream: Any) -> None:
        with trio.move_on_after(self.cfg.request_timeout_s):
            try:
                raw = await read_varint_prefixed_bytes_limited(stream, MAX_REQUEST_BYTES)
                req = msgpack.unpackb(raw, raw=False, max_bin_len=64, max_array_len=MAX_HAVE, max_map_len=4)
                op = req.get("op") if isinstance(req, dict) else None
                if op == "have":
                    windows = [w for w in req.get("windows", [])[:MAX_WINDOWS] if isinstance(w, int)]
                    inv = self._store.inventory(windows, MAX_HAVE)
                    reply = msgpack.packb([[w, d] for w, d in inv], use_bin_type=True)
                    await stream.write(encode_varint_prefixed(reply))
                elif op == "get":
                    for d in req.get("digests", [])[:MAX_GET]:
                        data = self._store.get(d) if isinstance(d, bytes) else None
                        if data is not None:
                            await stream.write(encode_varint_prefixed(data))
                    await stream.write(encode_varint_prefixed(b""))
                else:
                    self._count_drop("sync_bad_request")
            except Exception as e:
                self._count_drop("sync_bad_request")
                logger.debug("sync request failed: %s: %s", e.__class__.__name__, e)
        with contextlib.suppress(Exception), trio.move_on_after(2):
            await stream.close()

    async def _t_request(self, peer: ID, req: dict[str, Any]) -> Any:
        stream = await self._host.new_stream(peer, [SYNC_PROTOCOL])
        try:
            await stream.write(encode_varint_prefixed(msgpack.packb(req, use_bin_type=True)))
            if req["op"] == "have":
                raw = await read_varint_prefixed_bytes_limited(stream, MAX_HAVE * 48 + 16)
                return msgpack.unpackb(raw, raw=False, max_bin_len=64, max_array_len=MAX_HAVE)
            out: list[bytes] = []
            for _ in range(len(req["digests"]) + 1):
                data = await read_varint_prefixed_bytes_limited(stream, self.protocol.max_record_bytes)
                if not data:
                    break
                out.append(bytes(data))
            return out
        finally:
            with contextlib.suppress(Exception), trio.move_on_after(2):
                await stream.close()

    async def _t_get(self, peer: ID, digests: list[bytes]) -> list[bytes]:
        wanted = set(digests)
        out = []
        for data in await self._t_request(peer, {"op": "get", "digests": digests}):
            if digest_of(data) in wanted:
                out.append(data)
            else:
                self._count_drop("sync_unrequested")
        return out

    async def _t_sync_from(self, peer: ID) -> int:
        now = self._now_window()
        windows = list(range(now - self.cfg.expiration_windows, now + self.protocol.max_future_windows + 1))
        with trio.fail_after(self.cfg.request_timeout_s):
            inv = await self._t_request(peer, {"op": "have", "windows": windows})
        missing = []
        for item in inv if isinstance(inv, list) else []:
            ok = isinstance(item, list) and len(item) == 2 and isinstance(item[1], bytes) and len(item[1]) == 32
            if ok and not self._store.has(item[1]):
                missing.append(item[1])
        new = 0
        for i in range(0, len(missing), MAX_GET):
            with trio.fail_after(self.cfg.request_timeout_s):
                got = await self._t_get(peer, missing[i : i + MAX_GET])
            for data in got:
                if self._admit(data, digest_of(data)) is None:
                    new += 1
        self._count_stat("synced", new)
        return new

    async def _t_sync_quietly(self, peer: ID) -> None:
        try:
            await self._t_sync_from(peer)
        except Exception as e:
            self._count_drop("sync_failed")
            logger.debug("sync with %s failed: %s: %s", peer, e.__class__.__name__, e)

    async def _t_sync_all(self) -> int:
        total = 0
        for peer in list(self._host.get_connected_peers()):
            try:
                total += await self._t_sync_from(peer)
            except Exception as e:
                self._count_drop("sync_failed")
                logger.debug("sync with %s failed: %s", peer, e)
        return total

    async def _t_sync_loop(self) -> None:
        while True:
            await trio.sleep(self.cfg.sync_interval_s * random.uniform(0.8, 1.2))
            self._store.prune(self._now_window())
            peers = list(self._host.get_connected_peers())
            if peers:
                await self._t_sync_quietly(random.choice(peers))
