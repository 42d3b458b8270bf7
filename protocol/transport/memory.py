"""In-process transport: a :class:`MemoryNetwork` shared by many :class:`MemoryTransport` peers, with fault hooks.

The network behaves like a DHT seen from its readers and holds the same sharded layout as the hivemind transport
(``protocol.layout``): records by ``(window, sender, digest)``, each sender's signed index entry under its peer key
and under one shard per written level, all in dicts, so a poll costs dict lookups for the keys the reader's
:class:`~protocol.layout.ShardReader` asks for, never a scan of the swarm. Index entries are checked at store time
as an honest replica checks them (refusals counted in ``MemoryNetwork.refused``); a record without a valid entry is
not kept. Records stay until they fall out of the retention horizon. Faults are
decided per (record, reader) by hashing ``(seed, record id, reader)``, so a run is deterministic given the
seed whatever order peers poll in:

* latency and jitter: a record (and the index entry version its publication stored) becomes visible to a reader
  ``latency_s + U(0, jitter_s)`` after it was published, measured on the network's injectable clock;
* loss: a reader never sees the record; duplication: a reader gets it twice per fetch;
* partitions: peers in different groups cannot see each other's records (until :meth:`MemoryNetwork.heal`);
* churn: :meth:`MemoryNetwork.leave` / :meth:`MemoryNetwork.join` take a peer offline and back; records it
  published stay stored (as in a DHT), an offline peer's publish and fetch raise :class:`TransportError`.

Knows nothing about record contents; the optional store-time check is applied on the reader's side.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from protocol.codec import RecordDecodeError, RecordSignatureError
from protocol.errors import TransportError
from protocol.layout import (
    WORK_BITS,
    ShardParams,
    ShardReader,
    decode_index_entry,
    record_digest_hex,
    shard_admit,
    shard_of,
)
from protocol.transport.base import RecordCheck, Transport
from protocol.transport.config import MemoryTransportConfig, ProtocolConfig

logger = logging.getLogger(__name__)

#: Most peers :meth:`MemoryTransport.peers` lists (about a Kademlia routing table's size).
MAX_PEERS_LISTED = 64


@dataclass(frozen=True)
class _Entry:
    rid: int
    window: int
    sender: str  # the sender the publisher claimed (its signed index entry proves it)
    publisher: str  # the transport peer that stored it (partitions are about who can reach whom)
    data: bytes
    published_at: float


@dataclass
class _Listing:
    """A sender's index entry for one window as stored, plus the version it replaced (still visible to readers
    the newer one has not reached yet)."""

    entry: bytes
    count: int
    rid: int  # the record whose publication stored this version (its delay is the entry's delay)
    publisher: str
    stored_at: float
    previous: _Listing | None = None
    rank: int = 0  # the entry's rank in a full shard (protocol.layout.work_rank, at the swarm's index_work_bits)


class MemoryNetwork:
    """The shared medium of many :class:`MemoryTransport` peers; mutate fault attributes at any time."""

    def __init__(
        self,
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
        latency_s: float = 0.0,
        jitter_s: float = 0.0,
        loss: float = 0.0,
        duplicate: float = 0.0,
        retention_windows: int = 8,
    ) -> None:
        self.seed = seed
        self.clock = clock
        self.latency_s = latency_s
        self.jitter_s = jitter_s
        self.loss = loss
        self.duplicate = duplicate
        self.retention_windows = retention_windows
        self._records: dict[tuple[int, str, str], _Entry] = {}  # (window, sender, digest) -> record
        self._peer_entries: dict[tuple[int, str], _Listing] = {}  # (window, sender) -> index entry
        self._shards: dict[tuple[int, int, int], dict[str, _Listing]] = {}  # (window, level, shard) -> sender -> entry
        # window -> keys of the three maps, for expiry
        self._window_keys: dict[int, tuple[list[Any], list[Any], list[Any]]] = {}
        self._newest_window: int | None = None
        self.refused: Counter[str] = Counter()  # index entries refused at store time, by reason
        #: Index entries a full shard key evicted, by reason (``outranked``: a better-ranked new entry took the place).
        self.evicted: Counter[str] = Counter()
        self._next_rid = 0
        self._online: set[str] = set()
        self._online_list: list[str] = []  # the same peers, for O(1) sampling
        self._online_pos: dict[str, int] = {}
        self._known: set[str] = set()
        self._group_of: dict[str, int] = {}
        self.stats = {
            "published": 0,
            "unlisted": 0,
            "fetches": 0,
            "delivered": 0,
            "lost": 0,
            "duplicated": 0,
            "delayed": 0,
        }

    @classmethod
    def from_config(cls, config: MemoryTransportConfig, clock: Callable[[], float] = time.time) -> MemoryNetwork:
        """A network with the faults of a :class:`MemoryTransportConfig`."""
        return cls(
            seed=config.seed,
            clock=clock,
            latency_s=config.latency_s,
            jitter_s=config.jitter_s,
            loss=config.loss,
            duplicate=config.duplicate,
            retention_windows=config.retention_windows,
        )

    # -- membership and partitions ---------------------------------------------------------------------

    def join(self, peer_id: str) -> None:
        """Bring ``peer_id`` online (first join, or rejoin after :meth:`leave`)."""
        if peer_id in self._online:
            raise ValueError(f"peer {peer_id!r} is already online")
        self._online.add(peer_id)
        self._online_pos[peer_id] = len(self._online_list)
        self._online_list.append(peer_id)
        self._known.add(peer_id)

    def leave(self, peer_id: str) -> None:
        """Take ``peer_id`` offline; its stored records stay until they expire."""
        self._online.discard(peer_id)
        pos = self._online_pos.pop(peer_id, None)
        if pos is not None:
            last = self._online_list.pop()
            if last != peer_id:
                self._online_list[pos] = last
                self._online_pos[last] = pos

    def is_online(self, peer_id: str) -> bool:
        return peer_id in self._online

    def online_peers(self) -> list[str]:
        """All online peers, sorted."""
        return sorted(self._online)

    def sample_peers(self, reader: str, k: int, rng: random.Random) -> list[str]:
        """Up to ``k`` online peers ``reader`` can reach, sorted: all of them in a small network, else a random
        sample (a DHT node knows its routing table, not the swarm; costs O(k), not O(N))."""
        n = len(self._online_list)
        if n <= k + 1:
            picks = set(self._online_list)
        else:  # a random window of the membership list: one random draw, O(k)
            start = rng.randrange(n)
            picks = set(self._online_list[start : start + k] + self._online_list[: max(0, start + k - n)])
        return sorted(p for p in picks if p != reader and self.can_reach(reader, p))

    def partition(self, *groups: Iterable[str]) -> None:
        """Split the network: peers in different groups cannot see each other; unlisted peers form one more group."""
        self._group_of = {}
        for i, group in enumerate(groups):
            for peer in group:
                if peer in self._group_of:
                    raise ValueError(f"peer {peer!r} is in two partition groups")
                self._group_of[peer] = i

    def heal(self) -> None:
        """Remove every partition."""
        self._group_of = {}

    def can_reach(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` are on the same side of the current partition."""
        return self._group_of.get(a, -1) == self._group_of.get(b, -1)

    # -- storage ---------------------------------------------------------------------------------------

    def _store(
        self,
        publisher: str,
        window: int,
        sender: str,
        data: bytes,
        index: bytes | None,
        levels: Sequence[int],
        fanout: int,
        work_bits: int = WORK_BITS,
    ) -> None:
        """Store a record and its sender's index entry, checked as an honest DHT replica checks them (signature,
        window, sender, lists this record); without a valid entry the record is not listed and not kept. A full
        shard key keeps the entries ranked best at ``work_bits`` (the swarm's ``index_work_bits``, SPEC 7.4)."""
        if index is None:
            self.stats["unlisted"] += 1
            return
        reason = _index_refusal(index, window, sender, data)
        if reason is not None:
            self.refused[reason] += 1
            raise TransportError(f"memory network refuses this index entry ({reason})")
        now = self.clock()
        entry = _Entry(self._next_rid, window, sender, publisher, bytes(data), now)
        self._next_rid += 1
        keys = self._window_keys.setdefault(window, ([], [], []))
        rkey = (window, sender, record_digest_hex(data))
        if rkey not in self._records:
            self._records[rkey] = entry
            keys[0].append(rkey)
        decoded = decode_index_entry(index, verify_signature=False)
        count = len(decoded.digests)
        old = self._peer_entries.get((window, sender))
        if old is None or count > old.count:
            listing = _Listing(index, count, entry.rid, publisher, now, old, decoded.rank_at(work_bits))
            if old is not None:
                old.previous = None  # keep one older version, not a chain
            else:
                keys[1].append((window, sender))
            self._peer_entries[(window, sender)] = listing
            for level in levels:
                skey = (window, level, shard_of(window, sender, level, fanout))
                shard = self._shards.get(skey)
                if shard is None:
                    shard = self._shards[skey] = {}
                    keys[2].append(skey)
                # SPEC 7.4: a shard key holds at most SHARD_CAPACITY entries, the lowest-ranked (most worked) ones.
                admit, evict = shard_admit({s: lst.rank for s, lst in shard.items()}, sender, listing.rank)
                if not admit:
                    self.refused["shard_full"] += 1
                    continue
                if evict is not None:
                    del shard[evict]
                    self.evicted["outranked"] += 1
                shard[sender] = listing
        self.stats["published"] += 1
        if self._newest_window is None or window > self._newest_window:
            self._newest_window = window
            horizon = window - self.retention_windows
            for w in [w for w in self._window_keys if w < horizon]:
                rkeys, pkeys, skeys = self._window_keys.pop(w)
                for k in rkeys:
                    self._records.pop(k, None)
                for k in pkeys:
                    self._peer_entries.pop(k, None)
                for k in skeys:
                    self._shards.pop(k, None)

    def _uniform(self, rid: int, reader: str, what: bytes) -> float:
        h = hashlib.blake2b(f"{self.seed}|{rid}|{reader}|".encode() + what, digest_size=8).digest()
        return int.from_bytes(h, "big") / 2.0**64

    @property
    def _faulty(self) -> bool:
        return self.latency_s > 0 or self.jitter_s > 0 or self.loss > 0 or self.duplicate > 0

    def _visible_at(self, rid: int, reader: str, published_at: float) -> float:
        return published_at + self.latency_s + self.jitter_s * self._uniform(rid, reader, b"jitter")

    def _listing_for(self, reader: str, listing: _Listing | None) -> bytes | None:
        """The newest version of an index entry that has reached ``reader``."""
        now = self.clock()
        while listing is not None:
            if listing.publisher == reader or (
                self.can_reach(reader, listing.publisher)
                and (not self._faulty or now >= self._visible_at(listing.rid, reader, listing.stored_at))
            ):
                return listing.entry
            listing = listing.previous
        return None

    def _get_shards(self, reader: str, addrs: list[tuple[int, int, int]]) -> dict[tuple[int, int, int], list[bytes]]:
        out: dict[tuple[int, int, int], list[bytes]] = {}
        # Without faults or partitions every reader sees the newest version of every entry: skip the per-entry
        # checks (a cold-start shard of a 10,000-node simulation holds every node's entry, read by every node).
        plain = not self._faulty and not self._group_of
        for addr in addrs:
            listings = self._shards.get(addr, {}).values()
            if plain:
                out[addr] = [lst.entry for lst in listings]
                continue
            values = [self._listing_for(reader, lst) for lst in listings]
            out[addr] = [v for v in values if v is not None]
        return out

    def _get_peers(self, reader: str, addrs: list[tuple[int, str]]) -> dict[tuple[int, str], bytes]:
        out: dict[tuple[int, str], bytes] = {}
        for addr in addrs:
            value = self._listing_for(reader, self._peer_entries.get(addr))
            if value is not None:
                out[addr] = value
        return out

    def _get_records(
        self, reader: str, addrs: list[tuple[int, str, str]], keep: Callable[[_Entry], bool] | None
    ) -> dict[tuple[int, str, str], list[bytes]]:
        self.stats["fetches"] += 1
        now = self.clock()
        faulty = self._faulty
        out: dict[tuple[int, str, str], list[bytes]] = {}
        for addr in addrs:
            e = self._records.get(addr)
            if e is None:
                continue
            if e.publisher != reader and not self.can_reach(reader, e.publisher):
                continue
            copies = 1
            if faulty and e.publisher != reader:
                if now < self._visible_at(e.rid, reader, e.published_at):
                    self.stats["delayed"] += 1
                    continue
                if self.loss > 0 and self._uniform(e.rid, reader, b"loss") < self.loss:
                    self.stats["lost"] += 1
                    continue
                if self.duplicate > 0 and self._uniform(e.rid, reader, b"dup") < self.duplicate:
                    self.stats["duplicated"] += 1
                    copies = 2
            if keep is not None and not keep(e):
                continue
            out[addr] = [e.data] * copies
            self.stats["delivered"] += copies
        return out


def _index_refusal(index: bytes, window: int, sender: str, data: bytes) -> str | None:
    try:
        entry = decode_index_entry(index)
    except (RecordDecodeError, RecordSignatureError) as e:
        return e.reason
    if entry.window != window or entry.sender != sender:
        return "key_mismatch"
    if record_digest_hex(data) not in entry.digests:
        return "index_mismatch"
    return None


class MemoryTransport(Transport):
    """One peer on a :class:`MemoryNetwork`; joins it on construction, leaves it on :meth:`close`."""

    def __init__(
        self,
        network: MemoryNetwork,
        peer_id: str,
        *,
        validate: RecordCheck | None = None,
        protocol: ProtocolConfig | None = None,
        swarm: str | None = None,
        seed: int | None = None,
    ) -> None:
        self.network = network
        self.peer_id = peer_id
        self._closed = False
        self._verdicts: dict[int, bool] = {}  # record id -> store-time verdict (the check is stateless)
        self.refused = 0
        self.params = ShardParams.from_config(protocol or ProtocolConfig())
        # swarm None: read every swarm's entries (tests that share one network across swarms set it).
        self.reader = ShardReader(
            swarm, self.params, seed=network.seed * 1_000_003 + _stable(peer_id) if seed is None else seed
        )
        self.set_record_validator(validate)
        network.join(peer_id)

    def _check_usable(self) -> None:
        if self._closed:
            raise TransportError(f"memory transport {self.peer_id} is closed")
        if not self.network.is_online(self.peer_id):
            raise TransportError(f"memory peer {self.peer_id} is offline")

    def _keep(self, e: _Entry) -> bool:
        check = self._record_validator
        if check is None:
            return True
        ok = self._verdicts.get(e.rid)
        if ok is None:
            try:
                ok = not isinstance(check(e.data), str)
            except Exception:
                ok = False
            if len(self._verdicts) > 100_000:
                self._verdicts.clear()
            self._verdicts[e.rid] = ok
            if not ok:
                self.refused += 1
        return ok

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        self._check_usable()
        levels = self.reader.write_levels()
        self.network._store(
            self.peer_id, window, sender, data, index, levels, self.params.fanout, self.params.work_bits
        )
        if index is not None:
            self.reader.remember_own(bytes(data), window)
        await asyncio.sleep(0)  # a network call yields to the loop; keeps schedules realistic

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        self._check_usable()
        await asyncio.sleep(0)
        net, me = self.network, self.peer_id
        keep = self._keep if self._record_validator else None

        async def shards(addrs: list[Any]) -> dict[Any, Any]:
            return net._get_shards(me, addrs)

        async def peers(addrs: list[Any]) -> dict[Any, Any]:
            return net._get_peers(me, addrs)

        async def records(addrs: list[Any]) -> dict[Any, Any]:
            return net._get_records(me, addrs, keep)

        return await self.reader.poll(windows, prefer, shards, peers, records)

    def rejections(self) -> dict[str, int]:
        """Records this peer's store-time check refused (``invalid_record``) and index entries its reader dropped
        (``index_wrong_swarm``, ...). Entries the network refused at store time are counted by the network
        (``MemoryNetwork.refused``): in a DHT the replicas that refused them count them."""
        out = dict(self.reader.dropped)
        if self.refused:
            out["invalid_record"] = self.refused
        return out

    def stats(self) -> dict[str, float]:
        """The sharded reader's cost counters (index and record reads, entries, bytes) and its size estimate."""
        return {
            **self.reader.stats,
            "swarm_estimate": self.reader.estimate or 0.0,
            "read_level": self.reader.read_level(),
        }

    async def peers(self) -> list[str]:
        self._check_usable()
        return self.network.sample_peers(self.peer_id, MAX_PEERS_LISTED, self.reader.rng)

    def addresses(self) -> list[str]:
        return [f"memory://{self.peer_id}"]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.network.leave(self.peer_id)

    def __repr__(self) -> str:
        return f"MemoryTransport({self.peer_id!r})"


def _stable(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")
