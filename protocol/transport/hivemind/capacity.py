"""Shard capacity on a hivemind node: no shard key it stores (or caches, or serves) holds more than
:data:`~protocol.layout.SHARD_CAPACITY` entries, the lowest-ranked (most worked) ones (``protocol/SPEC.md`` 7.4).

The store guard (``protocol.transport.hivemind.guard``) judges each value alone and keeps no state; a cap is about
what a key already holds, so it lives in the node's storage: :class:`CappedStorage` replaces hivemind's
``DHTLocalStorage`` (the node's storage and its cache, :func:`install`) and applies
:func:`~protocol.layout.shard_admit` whenever a new subkey would join a key's dictionary. Only shard keys have
subkeys in this layout, so every dictionary value is a shard. Without the cap a flood of identities grew one shard key
past p2pd's 4 MiB message, and then no peer could read that key at all.

Knows nothing about the DHT's lifecycle or the network; values reaching it have already passed the guard.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter, OrderedDict
from typing import Any

import msgpack
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue

from protocol.layout import (
    MAX_INDEX_ENTRY_BYTES,
    SHARD_CAPACITY,
    UNSTAMPED_RANK,
    WORK_BITS,
    decode_index_entry,
    shard_admit,
)

logger = logging.getLogger(__name__)

#: Ranks remembered by value hash (one SHA-256 and a decode per entry, instead of per entry per store).
RANK_CACHE_SIZE = 65_536


class CappedStorage(DHTLocalStorage):  # type: ignore[misc]  # hivemind ships no type information
    """hivemind's local storage with the shard capacity rule of SPEC 7.4 applied to every dictionary value."""

    def __init__(self, maxsize: int | None = None, capacity: int = SHARD_CAPACITY, work_bits: int = WORK_BITS) -> None:
        super().__init__(maxsize=maxsize)
        self.capacity = capacity
        #: The swarm's ``index_work_bits``: an entry's work below it ranks as none (SPEC 7.4).
        self.work_bits = work_bits
        self._ranks: OrderedDict[bytes, int] = OrderedDict()
        #: Entries refused by a full key (``shard_full``).
        self.counts: Counter[str] = Counter()
        #: Entries evicted from a full key, by reason (SPEC 7.4): ``outranked`` (a new sender's entry of a strictly
        #: lower rank took the worst one's place), ``trimmed`` (a merged lookup result cut to capacity when cached).
        self.evicted: Counter[str] = Counter()
        #: The most entries, and the most value bytes, one key has held here.
        self.max_entries = 0
        self.max_bytes = 0

    def rank(self, value: bytes) -> int:
        """The rank of a stored shard value (a msgpack bin holding an index entry); unstamped if it is none."""
        digest = hashlib.sha256(value).digest()
        rank = self._ranks.get(digest)
        if rank is not None:
            self._ranks.move_to_end(digest)
            return rank
        try:
            entry = decode_index_entry(
                msgpack.unpackb(value, raw=True, max_bin_len=MAX_INDEX_ENTRY_BYTES), verify_signature=False
            )
            rank = entry.rank_at(self.work_bits)
        except Exception:  # the guard has judged it already; an odd value just ranks last
            rank = UNSTAMPED_RANK
        self._ranks[digest] = rank
        while len(self._ranks) > RANK_CACHE_SIZE:
            self._ranks.popitem(last=False)
        return rank

    def store_subkey(self, key: Any, subkey: Any, value: bytes, expiration_time: float) -> bool:
        current = self.get(key)
        if current is not None and isinstance(current.value, DictionaryDHTValue):
            shard = current.value
            if subkey not in shard and len(shard) >= self.capacity:
                ranks = {sk: self.rank(item.value) for sk, item in shard.items()}
                admit, evict = shard_admit(ranks, subkey, self.rank(value), self.capacity)
                if not admit:
                    self.counts["shard_full"] += 1
                    return False
                del shard[evict]
                self.evicted["outranked"] += 1
                logger.debug("shard key full: evicted %s for a better-ranked entry", evict)
        ok: bool = super().store_subkey(key, subkey, value, expiration_time)
        if ok:
            held = self.get(key)
            if held is not None and isinstance(held.value, DictionaryDHTValue):
                self.max_entries = max(self.max_entries, len(held.value))
                self.max_bytes = max(self.max_bytes, sum(len(item.value) for _, item in held.value.items()))
        return ok

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        if isinstance(value, DictionaryDHTValue) and len(value) > self.capacity:
            value = self._trimmed(value)  # a merged lookup result being cached: keep what a replica would keep
        ok: bool = super().store(key, value, expiration_time)
        return ok

    def _trimmed(self, shard: DictionaryDHTValue) -> DictionaryDHTValue:
        items = sorted(shard.items(), key=lambda kv: (self.rank(kv[1].value), str(kv[0])))
        out = DictionaryDHTValue()
        for subkey, item in items[: self.capacity]:
            out.store(subkey, item.value, item.expiration_time)
        self.evicted["trimmed"] += len(items) - self.capacity
        return out


def install(node: Any, work_bits: int = WORK_BITS) -> tuple[CappedStorage, CappedStorage]:
    """Give a started ``DHTNode`` capped storage and cache (ranking entries with the swarm's ``work_bits``), moving
    over what they already hold. Call it on the node's own event loop (the DHT's thread), before the node is handed
    out."""
    protocol = node.protocol
    storage = CappedStorage(work_bits=work_bits)
    cache = CappedStorage(maxsize=_finite(protocol.cache.maxsize), work_bits=work_bits)
    for old, new in ((protocol.storage, storage), (protocol.cache, cache)):
        for key, item in list(old.items()):
            if isinstance(item.value, DictionaryDHTValue):
                for subkey, sub in item.value.items():
                    new.store_subkey(key, subkey, sub.value, sub.expiration_time)
            else:
                new.store(key, item.value, item.expiration_time)
    protocol.storage, protocol.cache = storage, cache
    return storage, cache


def _finite(maxsize: float) -> int | None:
    return None if maxsize == float("inf") else int(maxsize)
