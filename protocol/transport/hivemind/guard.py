"""The hivemind transport's store guard: what an honest DHT node agrees to store and accepts from a peer.

:class:`DHTRecordGuard` is a hivemind ``RecordValidatorBase`` that every honest node runs on everything it is asked
to store and on every value a peer returns: a record must decode as a signed record of this swarm whose
``(window, sender, digest)`` reproduces the key it is stored under, and must pass the caller's ``validate`` hook; an
index entry must be signed by its sender, name this swarm, and sit under a key (and subkey) its own
``(window, sender)`` produces. Refusals are counted by reason. Key ids are hivemind's (:func:`key_id`, SPEC 9).
:func:`keep_valid_subkeys` makes a node judge a shard key's entries one by one, where hivemind drops them all for
one bad entry.

Knows nothing about the DHT node's lifecycle or the event loop it runs on (``protocol.transport.hivemind.loop``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter, OrderedDict
from typing import Any

import msgpack
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import get_dht_time

from protocol.codec import RecordDecodeError, RecordSignatureError, strict_unpackb
from protocol.layout import (
    MAX_INDEX_ENTRY_BYTES,
    ShardParams,
    decode_index_entry,
    peer_key,
    record_digest_hex,
    record_key,
    shard_key,
    shard_of,
)
from protocol.records import decode_record
from protocol.transport.base import RecordCheck
from protocol.types import Envelope
from protocol.version import INCOMPATIBLE

logger = logging.getLogger(__name__)

#: Records remembered as already validated by a node's guard (about 2 KB of memory per 64 entries).
PASSED_CACHE_SIZE = 4096


#: Most bytes msgpack's bin header adds to a value (bin32: 1 tag byte + 4 length bytes).
BIN_HEADER_MAX = 5

#: How hivemind serializes "no subkey" (a plain value).
NO_SUBKEY = msgpack.packb(None)


def key_id(key: str) -> bytes:
    """The DHT id of a key string, as hivemind derives it: SHA-1 of the MessagePack encoding of the string (20
    bytes, big endian). SPEC.md 9 gives test vectors."""
    data: bytes = DHTID.generate(source=key).to_bytes()
    return data


def answer_pings_during_create() -> None:
    """Work around a hivemind 1.1.12 race: ``DHTProtocol.create`` registers its RPC handlers before it sets
    ``node_info``, so a ping that arrives in between -- a peer re-pinging a node whose DHT is restarting after p2pd
    died -- raised ``AttributeError`` inside hivemind (logged as a traceback, the ping unanswered). Until ``create``
    sets the instance's own, a protocol answers with an empty ``NodeInfo``, as a client-mode node always does: the
    pinging peer learns nothing and asks again later. Idempotent."""
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.proto import dht_pb2

    if "node_info" not in vars(DHTProtocol):
        DHTProtocol.node_info = dht_pb2.NodeInfo()


def keep_valid_subkeys(protocol: Any) -> None:
    """Make a hivemind ``DHTProtocol`` judge a dictionary value (a shard key's entries, SPEC 9) one subkey at a time.

    hivemind validates a dictionary as a unit: one subkey its validator refuses drops the whole value, so a hostile
    replica that returns one bad entry beside the valid ones in a shard would hide them all. With this, a lookup
    response (or a whole dictionary a peer asks to store) keeps the subkeys that pass and drops only those that do not,
    each counted by the guard under its reason; a value left with no subkey is dropped as before."""

    def validate_dictionary(key_bytes: bytes, dictionary: DictionaryDHTValue) -> bool:
        validator = protocol.record_validator
        if validator is None:
            return True
        refused = []
        with dictionary.freeze():
            for subkey, (value_bytes, expiration_time) in dictionary.items():
                record = DHTRecord(key_bytes, protocol.serializer.dumps(subkey), value_bytes, expiration_time)
                if not validator.validate(record):
                    refused.append(subkey)
        for subkey in refused:
            del dictionary[subkey]
        return not refused or len(dictionary) > 0

    protocol._validate_dictionary = validate_dictionary


def _is_index_entry(value: bytes) -> bool:
    """Whether a stored value is shaped like an index entry (its body has ``digests``) rather than a record."""
    if len(value) > MAX_INDEX_ENTRY_BYTES:
        return False
    try:
        outer = strict_unpackb(value, max_bytes=MAX_INDEX_ENTRY_BYTES)
        body = strict_unpackb(outer["body"], max_bytes=MAX_INDEX_ENTRY_BYTES)
        return isinstance(body, dict) and "digests" in body
    except Exception:
        return False


class DHTRecordGuard(RecordValidatorBase):  # type: ignore[misc]  # hivemind ships no type information
    """Store-time and fetch-time check of every DHT entry; refuses anything that is not ours, counted by reason.

    Stateless by design (no replay or quota memory): hivemind validates the same entry on every store, every
    lookup response and every cache refresh, so a stateful check would refuse honest repeats.
    """

    def __init__(
        self,
        swarm: str,
        *,
        max_bytes: int,
        max_ttl_s: float,
        validate: RecordCheck | None = None,
        params: ShardParams | None = None,
        clock_offset_s: float = 0.0,
    ):
        self.swarm = swarm
        self.clock_offset_s = clock_offset_s
        self.params = params or ShardParams()
        self.max_bytes = max_bytes
        self.max_ttl_s = max_ttl_s
        self.hook = validate
        self.rejections: Counter[str] = Counter()
        self.accepted = 0
        # hivemind re-validates one record on every store, lookup response and cache refresh: remember records
        # that passed (by key and content hash) for a short while so each node verifies each record about once.
        self._passed: OrderedDict[tuple[bytes, bytes, bytes], float] = OrderedDict()
        self._pass_ttl_s = max(1.0, max_ttl_s / 8)
        # Time spent validating, for the benchmark's codec share: wall seconds (which count the time this DHT thread
        # waits for the GIL or a core while other threads run) and the thread's own CPU seconds.
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self._lock = threading.Lock()

    def validate(self, record: DHTRecord) -> bool:
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            reason = self.check(record)
        except Exception:  # a validator must never raise into hivemind: a bug here would drop honest data silently
            logger.exception("hivemind record guard failed on a record")
            reason = "guard_error"
        with self._lock:
            self.seconds += time.perf_counter() - start
            self.cpu_seconds += time.thread_time() - cpu_start
            if reason is None:
                self.accepted += 1
            else:
                self.rejections[reason] += 1
        if reason is not None:
            logger.debug("refused DHT entry (%s), %d bytes", reason, len(record.value))
        return reason is None

    def check(self, record: DHTRecord) -> str | None:
        """The reason to refuse ``record``, or None to accept it."""
        if record.expiration_time > get_dht_time() + self.clock_offset_s + self.max_ttl_s:
            return "expiration_too_far"
        # hivemind stores a value as a msgpack bin: at most 5 header bytes over the value itself.
        if len(record.value) > self.max_bytes + BIN_HEADER_MAX:
            return "oversize"
        memo: tuple[bytes, bytes, bytes] = (record.key, record.subkey, hashlib.sha256(record.value).digest())
        now = time.monotonic()
        with self._lock:
            passed_at = self._passed.get(memo)
        if passed_at is not None and now - passed_at < self._pass_ttl_s:
            return None
        try:
            data = msgpack.unpackb(record.value, raw=True, max_bin_len=self.max_bytes + BIN_HEADER_MAX)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            return "malformed"
        if not isinstance(data, bytes):
            return "malformed"
        if len(data) > self.max_bytes:  # SPEC 6 check 1, whatever the key: every value over the cap is "oversize"
            return "oversize"
        if record.subkey != NO_SUBKEY:
            reason = self._check_shard_entry(record, data)
        elif _is_index_entry(data):
            reason = self._check_peer_entry(record, data)
        else:
            reason = self._check_record(record, data)
        if reason is None:
            with self._lock:
                self._passed[memo] = now
                self._passed.move_to_end(memo)
                while len(self._passed) > PASSED_CACHE_SIZE:
                    self._passed.popitem(last=False)
        return reason

    def _check_record(self, record: DHTRecord, data: bytes) -> str | None:
        hook = self.hook
        try:
            # The hook (the receiver's RecordValidator) decodes and verifies once for the guard and the channel.
            got = hook(data) if hook is not None else decode_record(data, self.max_bytes)
        except (RecordDecodeError, RecordSignatureError) as e:
            return e.reason
        if not isinstance(got, Envelope):  # a reason, or a hook that broke its contract
            return got if isinstance(got, str) else "invalid_record"
        env = got
        if env.swarm != self.swarm:
            return "wrong_swarm"
        if key_id(record_key(self.swarm, env.window, env.sender, record_digest_hex(data))) != record.key:
            return "key_mismatch"
        return None

    def _entry(self, data: bytes) -> tuple[Any, str | None]:
        try:
            entry = decode_index_entry(data)
        except (RecordDecodeError, RecordSignatureError) as e:
            return None, e.reason if e.reason == INCOMPATIBLE else f"index_{e.reason}"
        if entry.swarm != self.swarm:
            return None, "wrong_swarm"
        return entry, None

    def _check_peer_entry(self, record: DHTRecord, data: bytes) -> str | None:
        entry, reason = self._entry(data)
        if reason is not None:
            return reason
        if key_id(peer_key(self.swarm, entry.window, entry.sender)) != record.key:
            return "key_mismatch"
        return None

    def _check_shard_entry(self, record: DHTRecord, data: bytes) -> str | None:
        try:
            subkey = msgpack.unpackb(record.subkey, raw=False)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
            return "malformed_index"
        if not isinstance(subkey, str):
            return "malformed_index"
        entry, reason = self._entry(data)
        if reason is not None:
            return reason
        if entry.sender != subkey:
            return "key_mismatch"
        p = self.params
        ids = {
            key_id(shard_key(self.swarm, entry.window, level, shard_of(entry.window, entry.sender, level, p.fanout)))
            for level in range(p.levels)
        }
        return None if record.key in ids else "key_mismatch"
