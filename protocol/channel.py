"""The node-facing API of the protocol: publish own records, poll peers' validated records, over any transport.

:meth:`Channel.publish` stamps (seq, window, created), encodes, signs and hands the bytes to the transport with
the identity's signed index entry for the window (``protocol.layout``); :meth:`Channel.poll` fetches the recent
windows (a sharded transport returns a bounded sample, the followed senders' records first), skips bytes it has
already processed (own records, records already delivered or rejected), validates the rest and returns only new
envelopes from other peers, in a deterministic order. Network failures and timeouts are logged and counted, never
raised: a node that loses the network keeps training.

Knows nothing about what payloads mean, how a transport moves bytes, or when the node polls.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from protocol.identity import Identity
from protocol.layout import WORK_BITS, IndexWriter
from protocol.records import SequenceCounter, encode_record, record_digest
from protocol.transport.base import Transport
from protocol.types import Envelope
from protocol.validation import RecordValidator
from protocol.version import INCOMPATIBLE, local_version

logger = logging.getLogger(__name__)


class Channel:
    """Signed publish + validated, deduplicated poll for one identity in one swarm; create with :meth:`create`."""

    def __init__(
        self,
        identity: Identity,
        transport: Transport,
        validator: RecordValidator,
        *,
        fetch_past_windows: int = 1,
        timeout_s: float = 30.0,
        seen_capacity: int = 200_000,
        follow_senders: int = 6,
        work_bits: int | None = WORK_BITS,
    ) -> None:
        self.identity = identity
        self.transport = transport
        self.validator = validator
        self.fetch_past_windows = fetch_past_windows
        self.timeout_s = timeout_s
        self.seen_capacity = seen_capacity
        self.follow_senders = follow_senders
        self._seq = SequenceCounter(clock=validator.clock)
        self._index = IndexWriter(identity, validator.swarm_id, work_bits=work_bits)
        # Senders whose records we accepted, most recent last (bounded): the peers a sampling transport follows
        # unless the node names its own (``follow``).
        self._recent_senders: dict[str, int] = {}
        self._follow: list[str] | None = None
        self.follow_limit = 64
        # digest of every record already handled -> our window when first handled (dict keeps insertion order)
        self._seen: dict[bytes, int] = {}
        self._closed = False
        self._net_ok = True
        self._metrics: dict[str, int] = dict.fromkeys(
            (
                "published",
                "publish_errors",
                "polls",
                "fetch_errors",
                "fetched",
                "received",
                "duplicates",
                "own",
                "bytes_in",
                "bytes_out",
            ),
            0,
        )

    @classmethod
    async def create(
        cls,
        identity: Identity,
        transport: Transport,
        validator: RecordValidator,
        *,
        fetch_past_windows: int = 1,
        timeout_s: float = 30.0,
        work_bits: int | None = WORK_BITS,
    ) -> Channel:
        """A channel over an already started transport (the transport's lifetime becomes the channel's);
        ``work_bits``: the work stamp of its index entries (``ProtocolConfig.index_work_bits``; None: unstamped)."""
        return cls(
            identity,
            transport,
            validator,
            fetch_past_windows=fetch_past_windows,
            timeout_s=timeout_s,
            work_bits=work_bits,
        )

    @property
    def swarm_id(self) -> str:
        return self.validator.swarm_id

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def transport_follow_limit(self) -> int:
        """How many followed senders the transport reads directly per poll (``ProtocolConfig.follow_senders``)."""
        return self.follow_senders

    @property
    def index_writer(self) -> IndexWriter:
        """This identity's index entries (shared with fault wrappers that inject records in its name)."""
        return self._index

    def _fetch_windows(self, now_window: int) -> list[int]:
        ahead = min(1, self.validator.max_future_windows)  # peers whose clocks run slightly ahead
        return list(range(now_window - self.fetch_past_windows, now_window + ahead + 1))

    def _net_failure(self, what: str, e: BaseException) -> None:
        # Warn once when the network goes away, then stay quiet at debug level until it comes back.
        if self._net_ok:
            logger.warning("%s failed (%s: %s); continuing without the network", what, e.__class__.__name__, e)
        else:
            logger.debug("%s failed again: %s: %s", what, e.__class__.__name__, e)
        self._net_ok = False

    def _net_success(self) -> None:
        if not self._net_ok:
            logger.info("network is back")
        self._net_ok = True

    async def publish(self, kind: str, payload: Any) -> Envelope:
        """Sign and publish one record; returns its envelope even if the network failed (counted, logged).

        Raises :class:`~protocol.records.EncodeError` if the payload itself is invalid or too large: that is a
        bug or a batch to split, not a network fault.
        """
        now = self.validator.clock()
        window = self.validator.current_window()
        seq = self._seq.next()
        data = encode_record(
            self.identity,
            kind=kind,
            swarm=self.swarm_id,
            seq=seq,
            window=window,
            created=now,
            payload=payload,
            max_bytes=self.validator.max_bytes,
        )
        self._seen[record_digest(data)] = window
        major, minor = local_version()
        env = Envelope(
            schema_version=major,
            minor=minor,
            kind=kind,
            swarm=self.swarm_id,
            sender=self.peer_id,
            public_key=self.identity.public_bytes,
            seq=seq,
            window=window,
            created=float(now),
            payload=payload,
            size=len(data),
        )
        if self._closed:
            self._metrics["publish_errors"] += 1
            logger.debug("publish on a closed channel dropped")
            return env
        if not self._index.stamped(window):
            # The window's work stamp (2**work_bits hashes, once per window) is minted off the event loop.
            await asyncio.to_thread(self._index.stamp, window)
        index = self._index.add(data, window)
        if index is None:
            logger.warning("more than %d records in one window: this one is stored but not listed", 64)
        try:
            await asyncio.wait_for(
                self.transport.publish(data, window=window, sender=self.peer_id, index=index), self.timeout_s
            )
        except Exception as e:  # TransportError, TimeoutError, or whatever a backend raises: the node goes on
            self._metrics["publish_errors"] += 1
            self._net_failure("publish", e)
        else:
            self._metrics["published"] += 1
            self._metrics["bytes_out"] += len(data)
            self._net_success()
        return env

    async def poll(self) -> list[Envelope]:
        """New, valid records from other peers since the last poll, ordered by (window, sender, seq)."""
        if self._closed:
            return []
        self._metrics["polls"] += 1
        now_window = self.validator.current_window()
        try:
            blobs = await asyncio.wait_for(
                self.transport.fetch_recent(self._fetch_windows(now_window), prefer=self.preferred()), self.timeout_s
            )
        except Exception as e:
            self._metrics["fetch_errors"] += 1
            self._net_failure("fetch", e)
            return []
        self._net_success()
        out: list[Envelope] = []
        for data in blobs:
            self._metrics["fetched"] += 1
            if not isinstance(data, bytes | bytearray | memoryview):
                self.validator.check(data)  # counted as malformed
                continue
            data = bytes(data)
            self._metrics["bytes_in"] += len(data)
            digest = record_digest(data)
            if digest in self._seen:
                self._metrics["duplicates"] += 1
                continue
            self._seen[digest] = now_window
            env = self.validator.check(data, digest)
            if env is None:
                continue
            if env.sender == self.peer_id:
                self._metrics["own"] += 1  # e.g. published by a previous run of this identity
                continue
            self._recent_senders.pop(env.sender, None)
            self._recent_senders[env.sender] = env.window
            while len(self._recent_senders) > self.follow_limit:
                del self._recent_senders[next(iter(self._recent_senders))]
            out.append(env)
        self._prune_seen(now_window)
        out.sort(key=lambda e: (e.window, e.sender, e.seq))
        self._metrics["received"] += len(out)
        return out

    def preferred(self) -> list[str]:
        """Senders whose new records the transport fetches first, most wanted first: the node's own choice
        (:meth:`follow`) if it made one, else those we accepted records from most recently."""
        if self._follow is not None:
            return list(self._follow)
        return list(reversed(self._recent_senders))

    def following(self) -> list[str]:
        """The senders a sharded transport reads directly at the next poll: the first ``follow_senders`` of
        :meth:`preferred` (SPEC 7.4, 11)."""
        return self.preferred()[: self.follow_senders]

    def follow(self, senders: list[str] | None) -> None:
        """Name the senders to follow, most wanted first (e.g. peers whose groups proved useful); None restores
        the default (most recently accepted senders)."""
        self._follow = None if senders is None else list(dict.fromkeys(senders))

    def _prune_seen(self, now_window: int) -> None:
        # Records older than the acceptance horizon are never fetched again by an honest transport; if one is,
        # the validator rejects it as stale.
        horizon = now_window - self.validator.max_past_windows - self.fetch_past_windows - 2
        while self._seen:
            digest, first = next(iter(self._seen.items()))
            if first >= horizon and len(self._seen) <= self.seen_capacity:
                break
            del self._seen[digest]

    def metrics(self) -> dict[str, Any]:
        """Counters: published/received records, errors, duplicates, own, bytes in/out, rejections by reason.

        ``rejected`` holds the receive-path reasons plus the transport's store-time refusals, prefixed ``store_``
        (what the DHT guard refused to store for peers or in their responses), so both reach ``metrics.jsonl``;
        ``incompatible_version`` (a peer of another major, SPEC.md 15) keeps its name wherever it was counted.
        ``transport`` holds the transport's cost counters (index and record reads); ``evicted`` the index entries its
        storage dropped from a full shard key to make room for better-ranked ones, by reason (SPEC 7.4).
        """
        v = self.validator.metrics()
        rejected = dict(v["rejected"])
        try:
            store = self.transport.rejections()
            evicted = self.transport.evictions()
            stats = self.transport.stats()
        except Exception:  # a metrics read must never break a step
            logger.debug("transport counters unavailable", exc_info=True)
            store, evicted, stats = {}, {}, {}
        for k, n in store.items():
            # a peer of another major is one condition whichever check met it first: one name in the metrics
            name = k if k == INCOMPATIBLE else f"store_{k}"
            rejected[name] = rejected.get(name, 0) + int(n)
        return {
            **self._metrics,
            "accepted": v["accepted"],
            "rejected": rejected,
            "rejected_total": sum(rejected.values()),
            "evicted": dict(evicted),
            "transport": dict(stats),
        }

    async def peers(self) -> list[str]:
        """Transport-level ids of reachable peers ([] when the network is down)."""
        try:
            return list(await asyncio.wait_for(self.transport.peers(), self.timeout_s))
        except Exception as e:
            self._net_failure("peers", e)
            return []

    def addresses(self) -> list[str]:
        """Addresses other nodes can bootstrap from."""
        try:
            return list(self.transport.addresses())
        except Exception as e:
            self._net_failure("addresses", e)
            return []

    async def close(self) -> None:
        """Close the transport (idempotent); later publishes are dropped and polls return []."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(self.transport.close(), self.timeout_s)
        except Exception as e:
            logger.warning("transport did not close cleanly: %s: %s", e.__class__.__name__, e)


async def open_channel(
    transport_cfg: Any,
    protocol_cfg: Any,
    swarm_id: str,
    identity: Identity,
    *,
    network: Any = None,
) -> Channel:
    """Validator + transport (from its config) + channel, the one call a node makes to get on the network; the
    identity that signs the node's records is also its transport's libp2p key (a stable ``/p2p/`` id)."""
    from protocol.transport.factory import create_transport

    validator = RecordValidator.from_config(swarm_id, protocol_cfg)
    transport = await create_transport(
        transport_cfg,
        swarm=swarm_id,
        peer_id=identity.peer_id,
        validate=validator.verdict,
        protocol=protocol_cfg,
        network=network,
        identity=identity,
    )
    return await Channel.create(identity, transport, validator, work_bits=protocol_cfg.index_work_bits)
