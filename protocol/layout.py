"""The sharded key layout every DHT-like transport shares: keys, shards, signed index entries, bounded reads.

A record is stored once under a content-addressed key. It is *found* through its sender's **index entry**: one
signed, bounded list of the digests the sender published in a window (at most :data:`MAX_INDEX_DIGESTS`). The
entry is stored under

* the sender's **peer key** ``(window, sender)`` (followers read exactly the peers they follow), and
* one **shard key** ``(window, level, shard)`` per written level, as the subkey ``sender``: level ``l`` splits the
  window's senders over ``fanout ** l`` shards by a hash of ``(window, sender)``, so a reader who estimates the
  swarm at N senders reads a level where one shard holds about ``poll_senders / poll_shards`` entries, whatever N.

A poll (:class:`ShardReader`) reads a few shards at its level (the next ones of its own random walk over them, so
every shard is read once every ``shards / poll_shards`` polls), the peer keys of the senders it follows and one
random shard of the top level (an unbiased size estimate), then fetches at most ``poll_records`` new records:
followed senders' first, with ``poll_newcomer_records`` kept for senders it does not follow, drawn uniformly by
sender from the reader's own randomness. Nobody but the reader chooses what it reads, one sender can list at most
:data:`MAX_INDEX_DIGESTS` records per window, and a flood of sybil entries competes only for the newcomer slots.
Writers write their own reading level, the levels just below and above it, and the top
(:meth:`ShardReader.write_levels`), so no key collects every sender of a big swarm and a publish writes at most four
shard keys whatever the number of levels. ``protocol/SPEC.md`` section 7 is the normative description.

Knows nothing about how a transport stores or moves bytes (it is given async getters), nor about what a record
means beyond the digest it is listed under.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.codec import RecordDecodeError, RecordSignatureError, canonical_packb, require_canonical, strict_unpackb
from protocol.identity import PEER_ID_LEN, PUBLIC_KEY_LEN, Identity, peer_id_from_public, verify
from protocol.records import PEER_ID_RE, check_version, expect_keys, record_digest, split_signed
from protocol.schema import expect_bytes, expect_int, expect_str
from protocol.version import INCOMPATIBLE, format_version, local_version, parse_version

logger = logging.getLogger(__name__)

#: Prepended to an index entry's body before signing (never valid as a record signature, nor the reverse).
INDEX_DOMAIN = b"rl-swarm/index/v1\x00"
#: Prefix of the hash that places a sender in a shard.
SHARD_DOMAIN = b"rl-swarm/shard/v1\x00"
#: Bytes of a record digest in an index entry (the first 16 bytes of SHA-256 of the record).
DIGEST_BYTES = 16
#: Most records one sender can list per window (its entry replaces itself as it grows; more are not listed).
MAX_INDEX_DIGESTS = 64
#: Size cap of one encoded index entry (64 digests need ~1.2 KB).
MAX_INDEX_ENTRY_BYTES = 2048
#: Entries whose record could not be fetched this many times are given up (dangling or lost entries).
MAX_FETCH_ATTEMPTS = 3
#: Polls the top-level size estimate averages over.
ANCHOR_POLLS = 16
#: Entries the top-level samples must have met before they count: one lucky hit in a small swarm would otherwise
#: read as ``fanout ** top`` senders and push readers (and writers) to levels nobody else uses.
ANCHOR_MIN_HITS = 4
INDEX_KEYS = frozenset({"digests", "public_key", "sender", "swarm", "version", "window"})
#: Prefix of the work stamp's hash (SPEC 7.4): ties an index entry's proof of work to its swarm, window and sender.
WORK_DOMAIN = b"rl-swarm/work/v1\x00"
#: Leading zero bits of the work hash that make an entry *stamped* (counted in size estimates, read first). About
#: 4,096 SHA-256 evaluations (~3 ms of one CPU core in Python) per sender per window. Swarm-wide default.
WORK_BITS = 12
#: Largest nonce a stamp may carry (an int64, the data model's integers).
MAX_WORK_NONCE = (1 << 63) - 1
#: Rank of an entry without a work stamp: worse than every stamped one (ranks are 256-bit hashes, lower is better).
UNSTAMPED_RANK = 1 << 256
#: Most entries (sender subkeys) one shard key holds on an honest node; values are at most
#: :data:`MAX_INDEX_ENTRY_BYTES`, so a key holds at most 256 KiB of entries, far below p2pd's 4 MiB message.
SHARD_CAPACITY = 128
#: The first minor version of major 2 whose index entries may carry ``work``.
WORK_MINOR = 1


def record_digest_hex(data: bytes) -> str:
    """The id a record is listed and stored under: the first 16 bytes of :func:`protocol.records.record_digest`
    (SHA-256 of the record bytes), lowercase hex. The same digest, shortened for keys."""
    return record_digest(data)[:DIGEST_BYTES].hex()


def record_key(swarm: str, window: int, sender: str, digest: str) -> str:
    """Key of one record (content addressed)."""
    return f"{swarm}/rollouts/{window}/{sender}/{digest}"


def peer_key(swarm: str, window: int, sender: str) -> str:
    """Key of a sender's index entry for one window."""
    return f"{swarm}/peer/{window}/{sender}"


def shard_key(swarm: str, window: int, level: int, shard: int) -> str:
    """Key of one shard of one level of a window's index (subkeys: sender peer ids)."""
    return f"{swarm}/shard/{window}/{level}/{shard}"


def shard_hash(window: int, sender: str) -> int:
    """The 64-bit placement hash of a sender in a window: SHA-256(SHARD_DOMAIN || "window/sender")[:8], big endian."""
    return int.from_bytes(hashlib.sha256(SHARD_DOMAIN + f"{window}/{sender}".encode()).digest()[:8], "big")


def shard_of(window: int, sender: str, level: int, fanout: int) -> int:
    """The sender's shard at ``level``: ``shard_hash mod fanout**level`` (level l+1 splits each shard of level l)."""
    return shard_hash(window, sender) % int(fanout**level)


# -- work stamps and shard capacity ---------------------------------------------------------------------------


def work_hash(swarm: str, window: int, sender: str, nonce: int) -> bytes:
    """SHA-256(WORK_DOMAIN || "swarm/window/sender/nonce") (decimal window and nonce): the hash an entry's ``work``
    nonce is judged by. It does not cover the digests, so a sender stamps once per window, not per entry."""
    return hashlib.sha256(WORK_DOMAIN + f"{swarm}/{window}/{sender}/{nonce}".encode()).digest()


def work_rank(swarm: str, window: int, sender: str, nonce: int | None, bits: int = 0) -> int:
    """An entry's rank in a full shard (lower is kept): its work hash as a 256-bit big-endian integer, or
    :data:`UNSTAMPED_RANK` without a nonce or with fewer than ``bits`` work bits. Work below the swarm's bar
    (``index_work_bits``) counts as none (SPEC 7.4): a nonce is free to pick, and any nonce's hash is below 2**256, so
    without the bar a flood of junk nonces would outrank (and evict) every unstamped entry, honest ones included."""
    if nonce is None:
        return UNSTAMPED_RANK
    rank = int.from_bytes(work_hash(swarm, window, sender, nonce), "big")
    return rank if work_bits(rank) >= bits else UNSTAMPED_RANK


def work_bits(rank: int) -> int:
    """Leading zero bits of a rank (0 for an unstamped entry)."""
    return 0 if rank >= UNSTAMPED_RANK else 256 - rank.bit_length()


def mint_work(swarm: str, window: int, sender: str, bits: int = WORK_BITS) -> int:
    """The smallest nonce whose work hash has at least ``bits`` leading zero bits (2**bits hashes expected)."""
    prefix = hashlib.sha256(WORK_DOMAIN + f"{swarm}/{window}/{sender}/".encode())
    limit = 1 << (256 - bits)
    nonce = 0
    while True:
        h = prefix.copy()
        h.update(str(nonce).encode())
        if int.from_bytes(h.digest(), "big") < limit:
            return nonce
        nonce += 1


def shard_admit(
    ranks: Mapping[str, int], sender: str, rank: int, capacity: int = SHARD_CAPACITY
) -> tuple[bool, str | None]:
    """The retention rule of a full shard key (SPEC 7.4): whether an entry of ``sender`` with ``rank`` is stored
    beside the entries ``ranks`` (sender -> rank) the key holds, and which sender's entry it evicts.

    A sender already present is always updated in place (its entry grows within the window). A key with room takes
    every entry. A full key takes a new sender only if its rank is strictly lower than the worst rank held, and then
    evicts that worst entry (the highest rank; among equal ones the greatest sender id); otherwise it refuses it.
    So unstamped entries never displace stamped ones, and among unstamped entries the first ones stay."""
    if sender in ranks or len(ranks) < capacity:
        return True, None
    worst = max(ranks.items(), key=lambda kv: (kv[1], kv[0]))
    if rank < worst[1]:
        return True, worst[0]
    return False, None


# -- signed index entries -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexEntry:
    """A decoded index entry: ``sender`` lists ``digests`` (hex) for ``window`` of ``swarm``."""

    swarm: str
    sender: str
    window: int
    digests: tuple[str, ...]
    data: bytes = b""
    work: int | None = None

    @property
    def count(self) -> int:
        return len(self.digests)

    @property
    def rank(self) -> int:
        """The rank of its work hash alone, whatever its bits (:func:`work_rank` without a bar; lower is better)."""
        return work_rank(self.swarm, self.window, self.sender, self.work)

    def rank_at(self, bits: int) -> int:
        """Its rank in a full shard of a swarm whose bar is ``bits`` (``index_work_bits``): work below it counts as
        none (:data:`UNSTAMPED_RANK`)."""
        return work_rank(self.swarm, self.window, self.sender, self.work, bits)


def encode_index_entry(
    identity: Identity, swarm: str, window: int, digests: Sequence[str], *, work: int | None = None
) -> bytes:
    """Sign the list of ``digests`` (hex, distinct, at most :data:`MAX_INDEX_DIGESTS`) ``identity`` published, with
    the work stamp ``work`` (a nonce from :func:`mint_work`; None: unstamped)."""
    if not 1 <= len(digests) <= MAX_INDEX_DIGESTS or len(set(digests)) != len(digests):
        raise ValueError(f"an index entry lists 1..{MAX_INDEX_DIGESTS} distinct digests, got {len(digests)}")
    fields: dict[str, Any] = {
        "digests": b"".join(bytes.fromhex(d) for d in digests),
        "public_key": identity.public_bytes,
        "sender": identity.peer_id,
        "swarm": swarm,
        "version": format_version(local_version()),
        "window": window,
    }
    if work is not None:
        if not 0 <= work <= MAX_WORK_NONCE:
            raise ValueError(f"work nonce {work} is outside 0..2**63-1")
        fields["work"] = work
    body = canonical_packb(fields)
    return canonical_packb({"body": body, "sig": identity.sign(INDEX_DOMAIN + body)})


def decode_index_entry(data: bytes, *, verify_signature: bool = True) -> IndexEntry:
    """Decode (and by default authenticate) an index entry; raises ``RecordDecodeError``/``RecordSignatureError``
    with the reasons of SPEC.md section 6 (``oversize``, ``malformed``, ``non_canonical``, ``unsupported_version``,
    ``incompatible_version``, ``schema``, ``sender_mismatch``, ``bad_signature``). The version is checked first."""
    if type(data) is not bytes:
        raise RecordDecodeError("malformed", f"expected bytes, got {type(data).__name__}")
    outer, body_bytes, sig = split_signed(data, MAX_INDEX_ENTRY_BYTES, "index entry")
    if verify_signature:  # readers of guard-checked entries skip the re-encoding (the guard did it)
        require_canonical(outer, data, "index entry")
    body = strict_unpackb(body_bytes, max_bytes=MAX_INDEX_ENTRY_BYTES)
    if verify_signature:
        require_canonical(body, body_bytes, "index body")
    if type(body) is not dict:
        raise RecordDecodeError("schema", "index: expected map")
    # 1.x entries had no version key; a body with neither key is no index entry of any version (e.g. a record put
    # under a shard key), a schema error rather than a claim to speak 1.x.
    if "version" not in body and "digests" not in body:
        raise RecordDecodeError("schema", "index: neither 'version' nor 'digests'")
    # Only a missing key means 1.x: a ``version`` string is held to the MAJOR.MINOR form (SPEC 15), so the literal
    # "1.x" (the name a report gives such entries, never a version a writer states) is ``unsupported_version``.
    major: int | None
    minor: int | None
    if "version" not in body:
        major, minor = 1, -1
    else:
        try:
            major, minor = parse_version(body["version"])
        except (TypeError, AttributeError, ValueError):
            major = minor = None
    newer = check_version(major, minor, body.get("sender"))
    # ``work`` is optional from 2.1 on (in any later major too: a node speaking 3.0 stamps its entries); an entry of
    # an older version has exactly that version's keys. ``major`` is ours here (another one was refused above).
    stamped = "work" in body and minor is not None and (major, minor) >= (2, WORK_MINOR)
    expect_keys(body, "index", INDEX_KEYS | {"work"} if stamped else INDEX_KEYS, newer=newer)
    raw = expect_bytes(body["digests"], "index.digests", max_len=DIGEST_BYTES * MAX_INDEX_DIGESTS)
    if not raw or len(raw) % DIGEST_BYTES:
        raise RecordDecodeError("schema", f"index.digests: {len(raw)} bytes is not 1..{MAX_INDEX_DIGESTS} digests")
    digests = tuple(raw[i : i + DIGEST_BYTES].hex() for i in range(0, len(raw), DIGEST_BYTES))
    if len(set(digests)) != len(digests):
        raise RecordDecodeError("schema", "index.digests: repeated digest")
    public_key = expect_bytes(body["public_key"], "index.public_key", length=PUBLIC_KEY_LEN)
    sender = expect_str(body["sender"], "index.sender", min_len=PEER_ID_LEN, max_len=PEER_ID_LEN)
    if not PEER_ID_RE.fullmatch(sender):  # the record header's rule (SPEC 3), so both refuse a bad id as "schema"
        raise RecordDecodeError("schema", "index.sender: expected 32 lowercase hex characters")
    swarm = expect_str(body["swarm"], "index.swarm", min_len=1, max_len=64)
    window = expect_int(body["window"], "index.window", lo=0)
    work = expect_int(body["work"], "index.work", lo=0, hi=MAX_WORK_NONCE) if stamped else None
    if verify_signature:
        if peer_id_from_public(public_key) != sender:
            raise RecordSignatureError("sender_mismatch", "index sender is not the peer id of public_key")
        if not verify(public_key, INDEX_DOMAIN + body_bytes, sig):
            raise RecordSignatureError("bad_signature", f"index entry from {sender[:8]}")
    return IndexEntry(swarm, sender, window, digests, data, work)


class IndexWriter:
    """A publisher's own index entries: the digests it published per window, re-signed after each record, stamped
    with a work nonce of ``work_bits`` bits minted once per window (``work_bits`` None: unstamped entries)."""

    def __init__(
        self, identity: Identity, swarm: str, keep_windows: int = 8, work_bits: int | None = WORK_BITS
    ) -> None:
        self.identity = identity
        self.swarm = swarm
        self.keep_windows = keep_windows
        self.work_bits = work_bits
        self._digests: dict[int, list[str]] = {}
        self._work: dict[int, int] = {}

    def stamped(self, window: int) -> bool:
        """Whether this window's work nonce is minted already (or none is wanted)."""
        return self.work_bits is None or window in self._work

    def stamp(self, window: int) -> int | None:
        """This window's work nonce, minted on first use (2**work_bits hashes expected: run it off the event loop,
        see :meth:`protocol.channel.Channel.publish`)."""
        if self.work_bits is None:
            return None
        nonce = self._work.get(window)
        if nonce is None:
            nonce = self._work[window] = mint_work(self.swarm, window, self.identity.peer_id, self.work_bits)
        return nonce

    def add(self, data: bytes, window: int) -> bytes | None:
        """The entry listing ``data`` and everything published before in ``window``; None once the window holds
        :data:`MAX_INDEX_DIGESTS` records (the record is still stored, just not listed)."""
        listed = self._digests.setdefault(window, [])
        digest = record_digest_hex(data)
        if digest not in listed:
            if len(listed) >= MAX_INDEX_DIGESTS:
                return None
            listed.append(digest)
        for w in [w for w in self._digests if w < window - self.keep_windows]:
            del self._digests[w]
        for w in [w for w in self._work if w < window - self.keep_windows]:
            del self._work[w]
        return encode_index_entry(self.identity, self.swarm, window, listed, work=self.stamp(window))

    def discard(self, data: bytes, window: int) -> None:
        """Forget ``data`` (listed by :meth:`add` but never stored, e.g. rewritten by a fault wrapper)."""
        listed = self._digests.get(window, [])
        digest = record_digest_hex(data)
        if digest in listed:
            listed.remove(digest)


# -- levels and the size estimate -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardParams:
    """The layout's settings (``fanout``/``levels`` are swarm-wide; the rest is each reader's budget)."""

    fanout: int = 4
    levels: int = 7
    poll_shards: int = 1
    poll_senders: int = 12
    poll_records: int = 10
    poll_newcomer_records: int = 4
    follow_senders: int = 6
    work_bits: int = WORK_BITS

    @classmethod
    def from_config(cls, cfg: Any) -> ShardParams:
        """From a :class:`~protocol.transport.config.ProtocolConfig` (or anything with the same fields)."""
        return cls(
            fanout=cfg.shard_fanout,
            levels=cfg.shard_levels,
            poll_shards=cfg.poll_shards,
            poll_senders=cfg.poll_senders,
            poll_records=cfg.poll_records,
            poll_newcomer_records=cfg.poll_newcomer_records,
            follow_senders=cfg.follow_senders,
            work_bits=cfg.index_work_bits,
        )

    @property
    def top(self) -> int:
        return self.levels - 1

    @property
    def max_shard_entries(self) -> int:
        """Most entries a reader decodes from one shard read (a uniform sample beyond): twice what a shard one level
        below the reading level holds on average (writers write there too), so it binds only on a cold start or
        a flood."""
        return 2 * self.fanout * self.poll_senders

    def shards(self, level: int) -> int:
        return int(self.fanout**level)

    def is_stamped(self, entry: IndexEntry) -> bool:
        """Whether ``entry`` carries at least ``work_bits`` bits of work (every entry when ``work_bits`` is 0)."""
        return work_bits(entry.rank) >= self.work_bits

    def level_for(self, n_senders: float) -> int:
        """The lowest level where reading ``poll_shards`` shards means at most ``poll_senders`` entries."""
        for level in range(self.levels):
            if min(self.poll_shards, self.shards(level)) * n_senders / self.shards(level) <= self.poll_senders:
                return level
        return self.top


# -- the reader -----------------------------------------------------------------------------------------------

ShardAddr = tuple[int, int, int]  # (window, level, shard)
PeerAddr = tuple[int, str]  # (window, sender)
RecordAddr = tuple[int, str, str]  # (window, sender, digest hex)

GetShards = Callable[[list[ShardAddr]], Awaitable[dict[ShardAddr, list[bytes]]]]
GetPeers = Callable[[list[PeerAddr]], Awaitable[dict[PeerAddr, bytes]]]
GetRecords = Callable[[list[RecordAddr]], Awaitable[dict[RecordAddr, list[bytes]]]]


@dataclass
class PollPlan:
    """What one poll reads: shards at the reading level, followed peers' keys, one top-level anchor shard."""

    level: int
    shards: list[ShardAddr] = field(default_factory=list)
    peers: list[PeerAddr] = field(default_factory=list)
    anchor: ShardAddr | None = None


class ShardReader:
    """One reader's bounded sample of the sharded index, plus its cache of fetched records.

    Keeps an estimate of the senders per window (for the reading and writing levels), the records it fetched
    (returned again on later polls of the same windows, like a DHT value cache), and entries it gave up on.
    Memory is bounded by ``poll_records`` x the polls of the cached windows.
    """

    def __init__(
        self, swarm: str | None, params: ShardParams, *, seed: int | None = None, keep_windows: int = 8
    ) -> None:
        self.swarm = swarm
        self.p = params
        self.rng = random.Random(seed)
        self.keep_windows = keep_windows
        self.estimate: float | None = None  # senders per window
        self._anchors: deque[float] = deque(maxlen=ANCHOR_POLLS)
        #: (window, level) -> the reader's walk over that level's shards (see :class:`ShardWalk`)
        self._walks: dict[tuple[int, int], ShardWalk] = {}
        self.cache: dict[int, OrderedDict[str, bytes]] = {}  # window -> digest -> record bytes
        self.misses: dict[RecordAddr, int] = {}
        #: (window, sender) -> failed fetches of its records while none resolved (-1 once one did): entries whose
        #: digests do not resolve are read last, and a sender not followed is given up after MAX_FETCH_ATTEMPTS.
        self.sender_misses: dict[PeerAddr, int] = {}
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "index_reads",
                "index_entries",
                "index_bytes",
                "record_reads",
                "records_fetched",
                "record_bytes",
                "record_misses",
                "entries_given_up",
                "entries_over_budget",
                "entries_skipped",
            ),
            0,
        )
        #: Index entries this reader dropped (undecodable, another swarm's, filed under another window), by reason.
        self.dropped: dict[str, int] = {}

    # -- levels --------------------------------------------------------------------------------------------

    def read_level(self) -> int:
        return 0 if self.estimate is None else self.p.level_for(self.estimate)

    def write_levels(self) -> list[int]:
        """Levels a publisher writes its entry to: its reading level and the ones above and below it (readers whose
        estimate is up to ``fanout`` times smaller or larger find it), and the top (the anchor every reader samples).
        Before its first poll a node knows nothing of the swarm's size and writes every level."""
        if self.estimate is None:
            return list(range(self.p.levels))
        level = self.read_level()
        return sorted({*range(max(0, level - 1), min(self.p.top, level + 1) + 1), self.p.top})

    def remember_own(self, data: bytes, window: int) -> None:
        self.cache.setdefault(window, OrderedDict())[record_digest_hex(data)] = data

    # -- one poll ------------------------------------------------------------------------------------------

    def plan(self, windows: Sequence[int], prefer: Collection[str]) -> PollPlan:
        level = self.read_level()
        n = self.p.shards(level)
        plan = PollPlan(level)
        for w in windows:
            walk = self._walks.get((w, level))
            if walk is None:
                walk = self._walks[(w, level)] = ShardWalk(n, self.rng)
            picked = set(walk.take(min(self.p.poll_shards, n)))
            plan.shards.extend((w, level, s) for s in sorted(picked))
            for sender in list(prefer)[: self.p.follow_senders]:
                if shard_of(w, sender, level, self.p.fanout) not in picked:
                    plan.peers.append((w, sender))
        if windows and level != self.p.top:
            complete = min(windows)  # the oldest window asked for has stopped filling up
            plan.anchor = (complete, self.p.top, self.rng.randrange(self.p.shards(self.p.top)))
        return plan

    async def poll(
        self,
        windows: Sequence[int],
        prefer: Collection[str],
        get_shards: GetShards,
        get_peers: GetPeers,
        get_records: GetRecords,
    ) -> list[bytes]:
        """Read the plan's keys, fetch at most ``poll_records`` new records, return the cached records of
        ``windows`` (plus an extra copy of a record the network delivered twice)."""
        windows = sorted(set(windows))
        prefer = [s for s in dict.fromkeys(prefer)][: self.p.follow_senders]
        plan = self.plan(windows, prefer)
        keys = plan.shards + ([plan.anchor] if plan.anchor else [])
        shard_values, peer_values = await asyncio.gather(
            get_shards(keys) if keys else _nothing(), get_peers(plan.peers) if plan.peers else _nothing()
        )
        self.stats["index_reads"] += len(keys) + len(plan.peers)
        entries: dict[tuple[int, str], IndexEntry] = {}
        seen_per_window: dict[int, int] = {}
        for shard in plan.shards:
            decoded = self._decode_shard(shard_values.get(shard, []), shard[0])
            # Only stamped entries count toward the size estimate: a flood of free, unstamped entries cannot
            # push readers to levels where an honest newcomer's shard is one of thousands.
            stamped = [e for e in decoded if self.p.is_stamped(e)]
            seen_per_window[shard[0]] = seen_per_window.get(shard[0], 0) + len(stamped)
            cap = self.p.max_shard_entries
            if len(decoded) > cap:
                # A shard far fuller than the reading level intends (a cold start, when every node still writes
                # level 0, or a flood of entries): keep a uniform sample, stamped entries first, so a poll's CPU
                # stays bounded and unstamped entries cannot crowd stamped ones out.
                self.stats["entries_skipped"] += len(decoded) - cap
                unstamped = [e for e in decoded if not self.p.is_stamped(e)]
                self.rng.shuffle(stamped)
                self.rng.shuffle(unstamped)
                decoded = (stamped + unstamped)[:cap]
            for entry in decoded:
                self._keep(entry, entries)
        for peer in plan.peers:
            raw = peer_values.get(peer)
            taken = self._take(raw, peer[0]) if raw is not None else None
            if taken is not None:
                self._keep(taken, entries)
        if plan.anchor is not None:
            anchor = self._decode_shard(shard_values.get(plan.anchor, []), plan.anchor[0], count=False)
            self._anchors.append(sum(1 for e in anchor if self.p.is_stamped(e)))
        self._update_estimate(plan, windows, seen_per_window)
        wanted = self._select(entries, set(prefer))
        extra: list[bytes] = []
        if wanted:
            self.stats["record_reads"] += len(wanted)
            got = await get_records(wanted)
            for addr in wanted:
                copies = [d for d in got.get(addr, []) if record_digest_hex(d) == addr[2]]
                if copies:
                    self.cache.setdefault(addr[0], OrderedDict())[addr[2]] = copies[0]
                    self.misses.pop(addr, None)
                    self.sender_misses[addr[:2]] = -1  # resolved once: no longer suspected of listing nothing
                    self.stats["records_fetched"] += 1
                    self.stats["record_bytes"] += len(copies[0])
                    extra.extend(copies[1:])
                else:
                    self.stats["record_misses"] += 1
                    self.misses[addr] = self.misses.get(addr, 0) + 1
                    if self.sender_misses.get(addr[:2], 0) >= 0:
                        self.sender_misses[addr[:2]] = self.sender_misses.get(addr[:2], 0) + 1
                    if self.misses[addr] == MAX_FETCH_ATTEMPTS:
                        self.stats["entries_given_up"] += 1
        self._prune(windows)
        return [d for w in windows for d in self.cache.get(w, {}).values()] + extra

    def _decode_shard(self, values: list[bytes], window: int, *, count: bool = True) -> list[IndexEntry]:
        """The entries of one shard read that decode and belong here; at most ``4 * SHARD_CAPACITY`` decoded (an
        honest replica holds at most :data:`SHARD_CAPACITY`; a lookup merges a few replicas)."""
        limit = 4 * SHARD_CAPACITY
        if len(values) > limit:
            values = self.rng.sample(values, limit)
        out = []
        for raw in values:
            entry = self._take(raw, window, count=count)
            if entry is not None:
                out.append(entry)
        return out

    def _take(self, raw: bytes, window: int, *, count: bool = True) -> IndexEntry | None:
        if count:
            self.stats["index_entries"] += 1
            self.stats["index_bytes"] += len(raw)
        try:
            # Entries were authenticated where they were stored (an honest replica's guard); this reader only
            # needs their fields. Records are validated in full by the channel.
            entry = decode_index_entry(raw, verify_signature=False)
        except (RecordDecodeError, RecordSignatureError) as e:
            self._drop(e.reason if e.reason == INCOMPATIBLE else f"index_{e.reason}")
            return None
        if self.swarm is not None and entry.swarm != self.swarm:
            self._drop("index_wrong_swarm")
            return None
        if entry.window != window:
            self._drop("index_key_mismatch")
            return None
        return entry

    @staticmethod
    def _keep(entry: IndexEntry, entries: dict[tuple[int, str], IndexEntry]) -> None:
        old = entries.get((entry.window, entry.sender))
        if old is None or entry.count > old.count:
            entries[(entry.window, entry.sender)] = entry

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _select(self, entries: dict[tuple[int, str], IndexEntry], prefer: set[str]) -> list[RecordAddr]:
        """Followed senders' new records first, then unknown senders', each group round robin *by sender* (one
        record per sender per turn, oldest window first) in the reader's random order, within ``poll_records`` of
        which ``poll_newcomer_records`` are kept for unknown senders. So every followed sender gets a record each
        poll (``follow_senders <= poll_records - poll_newcomer_records``) however much anyone else lists."""
        todo: dict[str, list[RecordAddr]] = {}
        for (w, sender), entry in sorted(entries.items()):
            have: Mapping[str, bytes] = self.cache.get(w, {})
            todo.setdefault(sender, []).extend(
                (w, sender, d)
                for d in entry.digests
                if d not in have and self.misses.get((w, sender, d), 0) < MAX_FETCH_ATTEMPTS
            )
        followed = [t for s, t in todo.items() if t and s in prefer]
        self.rng.shuffle(followed)
        # Senders not followed: stamped entries first, then unstamped ones, then unstamped senders whose listed
        # records did not resolve yet (dangling entries, one try a poll); an unstamped sender none of whose records
        # resolved in MAX_FETCH_ATTEMPTS tries is given up for that window. A stamped sender costs work to mint, and a
        # record just published may not be visible everywhere yet: it keeps its place (and the per-digest limit).
        tiers: list[list[list[RecordAddr]]] = [[], [], []]
        for s, t in todo.items():
            if not t or s in prefer:
                continue
            if self.p.is_stamped(entries[t[0][:2]]):
                tiers[0].append(t)
                continue
            missed = self.sender_misses.get(t[0][:2], 0)
            if missed >= MAX_FETCH_ATTEMPTS:
                continue
            if missed > 0:
                tiers[2].append(t[:1])
            else:
                tiers[1].append(t)
        for tier in tiers:
            self.rng.shuffle(tier)
        unknown = tiers[0] + tiers[1] + tiers[2]
        budget = self.p.poll_records
        reserve = min(self.p.poll_newcomer_records, budget) if unknown else 0
        out = _round_robin(followed, budget - reserve)
        out += _round_robin(unknown, budget - len(out))
        if len(out) < budget:
            out += _round_robin(followed, budget - len(out), skip=set(out))
        self.stats["entries_over_budget"] += sum(len(t) for t in followed + unknown) - len(out)
        return out

    def _update_estimate(self, plan: PollPlan, windows: Sequence[int], seen: dict[int, int]) -> None:
        if not windows:
            return
        n_read = min(self.p.poll_shards, self.p.shards(plan.level))
        # Any window's count is a lower bound of its senders (the newest is still filling up): take the largest.
        level_est = max(seen.values(), default=0) * self.p.shards(plan.level) / n_read
        hits = sum(self._anchors)
        anchor_est = hits * self.p.shards(self.p.top) / len(self._anchors) if hits >= ANCHOR_MIN_HITS else 0.0
        sample = max(level_est, anchor_est, 1.0)
        self.estimate = sample if self.estimate is None else 0.5 * self.estimate + 0.5 * sample

    def _prune(self, windows: Sequence[int]) -> None:
        if not windows:
            return
        oldest = max(windows) - self.keep_windows
        for w in [w for w in self.cache if w < oldest]:
            del self.cache[w]
        for k in [k for k in self.misses if k[0] < oldest]:
            del self.misses[k]
        for pk in [pk for pk in self.sender_misses if pk[0] < oldest]:
            del self.sender_misses[pk]
        for walk in [walk for walk in self._walks if walk[0] < oldest]:
            del self._walks[walk]


class ShardWalk:
    """A reader's own order of the ``n`` shards of one window's level: a random permutation read a few shards per
    poll, then another one. Every shard is read once in every ``n / poll_shards`` polls (independent draws would
    leave a shard unread for ``n`` polls with probability ``(1 - 1/n)**n``, about 1/e), and where the walk starts
    and how it steps are the reader's randomness, so no writer can place itself early in anyone's walk.

    The permutation is affine, ``shard_i = (start + i * step) mod n`` with ``step`` coprime to ``n``: O(1) memory
    at any level (the top of a big layout has millions of shards)."""

    def __init__(self, n: int, rng: random.Random) -> None:
        self.n = n
        self.rng = rng
        self._new_cycle()

    def _new_cycle(self) -> None:
        self.start = self.rng.randrange(self.n)
        self.step = 1
        if self.n > 2:
            self.step = self.rng.randrange(1, self.n)
            while math.gcd(self.step, self.n) != 1:
                self.step = self.rng.randrange(1, self.n)
        self.i = 0

    def take(self, k: int) -> list[int]:
        """The next ``k`` distinct shards (``k <= n``) of the walk; a cycle that runs out starts a new one."""
        out: list[int] = []
        while len(out) < min(k, self.n):
            if self.i == self.n:
                self._new_cycle()
            shard = (self.start + self.i * self.step) % self.n
            self.i += 1
            if shard not in out:  # a new cycle's first shards may repeat the old one's last, within one poll
                out.append(shard)
        return out


async def _nothing() -> dict[Any, Any]:
    return {}


def _round_robin(lists: list[list[RecordAddr]], n: int, skip: set[RecordAddr] | None = None) -> list[RecordAddr]:
    out: list[RecordAddr] = []
    depth = 0
    while len(out) < n:
        progressed = False
        for todo in lists:
            if depth < len(todo):
                progressed = True
                if skip is None or todo[depth] not in skip:
                    out.append(todo[depth])
                    if len(out) >= n:
                        break
        if not progressed:
            break
        depth += 1
    return out


def expected_reach(
    n_senders: int, params: ShardParams, polls: int, records_per_poll: float = 1.0, live_polls: int | None = None
) -> float:
    """SPEC.md 7.5: the expected share of the other nodes that fetch a given record within ``polls`` polls, in a
    swarm of ``n_senders`` nodes that each publish ``records_per_poll`` records per poll and follow
    ``follow_senders`` others (so a record's sender is followed by that many readers, who fetch it at once).

    A reader that does not follow the sender walks the ``S`` shards of its level ``m`` at a time in its own random
    order (:class:`ShardWalk`), so within ``k`` polls it reads the record's shard ``floor(k m / S)`` times, or once
    more with probability ``frac(k m / S)``. At each read it fetches the record with probability
    ``q = min(1, B_u S / (m U r))``: its budget left after the followed senders' records, ``B_u = max(B - F r,
    B_new)``, shared among the new records of the ``m U / S`` unknown senders it sees (``U`` of them in all, ``r``
    records per poll each). Only the ``live_polls`` polls while the record's window is still polled count (None:
    all ``polls``).
    """
    if live_polls is not None:
        polls = min(polls, live_polls)
    others = max(1, n_senders - 1)
    r = records_per_poll
    followed = min(params.follow_senders, others)
    f = followed / others
    unknown = others - followed
    if unknown == 0:
        return 1.0
    shards = params.shards(params.level_for(n_senders))
    m = min(params.poll_shards, shards)
    budget_u = max(params.poll_records - followed * r, params.poll_newcomer_records)
    q = min(1.0, budget_u * shards / (m * unknown * r))
    visits = polls * m / shards
    whole, part = math.floor(visits), visits - math.floor(visits)
    missed = (1 - part) * (1 - q) ** whole + part * (1 - q) ** (whole + 1)
    return f + (1 - f) * (1 - missed)
