"""Records on the wire: the signed envelope around a payload kind, its digest, sequence numbers and windows.

A record is ``packb({"body": <bin>, "sig": <bin 64>})`` where ``body`` is the canonical MessagePack of the
header map (schema_version, minor, kind, swarm, sender, public_key, seq, window, created, payload) and ``sig`` is
the sender's Ed25519 signature of ``SIGNING_DOMAIN + body``. Receivers verify the exact body bytes they got
(no re-encoding before verification) and additionally require the body to be canonical, so one logical
record has exactly one byte form. ``protocol/SPEC.md`` is the normative description.

The byte rules are ``protocol.codec`` (canonical MessagePack), the value checks ``protocol.schema``, the payload
kinds ``protocol.kinds``; this module puts them together into one signed, versioned record.

Knows nothing about transports, clocks of other peers, replay or quotas (see ``protocol.validation``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from protocol.codec import (
    DEFAULT_MAX_RECORD_BYTES,
    EncodeError,
    RecordDecodeError,
    RecordSignatureError,
    canonical_packb,
    require_canonical,
    strict_unpackb,
)
from protocol.identity import PEER_ID_LEN, PUBLIC_KEY_LEN, SIGNATURE_LEN, Identity, peer_id_from_public, verify
from protocol.kinds import MAX_KIND_LEN, get_kind, registered_kinds
from protocol.schema import expect_bytes, expect_float, expect_int, expect_map, expect_str, schema_error
from protocol.types import Envelope
from protocol.version import PROTOCOL_VERSION, format_version, local_version, report_incompatible

logger = logging.getLogger(__name__)

#: The record's ``schema_version`` is the protocol's major version; its ``minor`` key the minor (SPEC.md 15).
SCHEMA_VERSION = PROTOCOL_VERSION[0]
MAX_VERSION_PART = 9999
#: Prepended to the body bytes before signing, so a record signature can never be replayed as a signature of
#: anything else this key signs (and vice versa).
SIGNING_DOMAIN = b"rl-swarm/record/v1\x00"

MAX_SWARM_LEN = 64
#: A peer id as it appears in a signed body (a record's or an index entry's ``sender``): 32 lowercase hex characters.
PEER_ID_RE = re.compile(rf"[0-9a-f]{{{PEER_ID_LEN}}}")
HEADER_KEYS = frozenset(
    {"schema_version", "minor", "kind", "swarm", "sender", "public_key", "seq", "window", "created", "payload"}
)

# -- records -----------------------------------------------------------------------------------------------


def signing_input(body: bytes) -> bytes:
    """The exact bytes a record signature covers: ``SIGNING_DOMAIN + body``."""
    return SIGNING_DOMAIN + body


def wrap_record(body: bytes, signature: bytes) -> bytes:
    """The outer record bytes for a body and its signature (canonical map ``{"body": bin, "sig": bin}``)."""
    return canonical_packb({"body": bytes(body), "sig": bytes(signature)})


def sign_body(identity: Identity, body_map: Mapping[str, Any]) -> bytes:
    """Canonically encode ``body_map`` as-is and sign it with ``identity``; no schema checks (fault injection uses
    this to build forged records; honest code calls :func:`encode_record`)."""
    body = canonical_packb(dict(body_map))
    return wrap_record(body, identity.sign(signing_input(body)))


def encode_record(
    identity: Identity,
    *,
    kind: str,
    swarm: str,
    seq: int,
    window: int,
    created: float,
    payload: Any,
    max_bytes: int | None = None,
) -> bytes:
    """Encode, self-check and sign one record; :class:`EncodeError` if peers would reject it (or it exceeds
    ``max_bytes``)."""
    spec = get_kind(kind)
    if spec is None:
        raise EncodeError(f"unknown record kind {kind!r} (registered: {registered_kinds()})")
    major, minor = local_version()
    try:
        wire_payload = spec.encode(payload)
        body_map = {
            "schema_version": major,
            "minor": minor,
            "kind": kind,
            "swarm": swarm,
            "sender": identity.peer_id,
            "public_key": identity.public_bytes,
            "seq": seq,
            "window": window,
            "created": float(created),
            "payload": wire_payload,
        }
        body = canonical_packb(body_map)
        # Decode what we are about to send with the receivers' rules: never publish what peers will drop.
        sent = _check_header(strict_unpackb(body, max_bytes=len(body)))
        spec.decode(sent["payload"])
    except (RecordDecodeError, TypeError, ValueError, KeyError, OverflowError) as e:
        raise EncodeError(f"cannot encode {kind!r} record: {e}") from None
    data = wrap_record(body, identity.sign(signing_input(body)))
    if max_bytes is not None and len(data) > max_bytes:
        raise EncodeError(f"{kind!r} record is {len(data)} bytes > max_bytes {max_bytes}; publish less per record")
    return data


def check_version(major: Any, minor: Any, who: Any) -> bool:
    """Check the version a peer's signed value claims, before any other field (another major may differ in all of
    them). Returns whether it is a newer minor of our major, whose extra body keys a reader ignores.

    Raises :class:`RecordDecodeError`: ``unsupported_version`` if the major is not an int of 0..9999,
    ``incompatible_version`` if it is another major (reported once per remote version in one log line naming both
    versions; ``who`` is the claimed sender, unverified at this point), ``schema`` if the minor is not an int.
    """
    if type(major) is not int or not 0 <= major <= MAX_VERSION_PART:
        raise RecordDecodeError("unsupported_version", f"major version {major!r}"[:60])
    ours = local_version()
    if major != ours[0]:
        theirs = (major, minor if type(minor) is int and 0 <= minor <= MAX_VERSION_PART else -1)
        label = f"peer {who[:16]}" if isinstance(who, str) and who.isalnum() else "a peer"
        report_incompatible(theirs, label, ours)
        raise RecordDecodeError("incompatible_version", f"{format_version(theirs)}, this node {format_version(ours)}")
    return expect_int(minor, "minor", lo=0, hi=MAX_VERSION_PART) > ours[1]


def expect_keys(obj: Any, where: str, keys: frozenset[str], *, newer: bool) -> dict[str, Any]:
    """Like :func:`expect_map`, but a value of a newer minor version may carry keys this reader does not know."""
    if not newer:
        return expect_map(obj, where, keys)
    if type(obj) is not dict or not keys <= set(obj):
        return expect_map(obj, where, keys)  # raises with the missing keys
    return obj


def _check_header(body: Any) -> dict[str, Any]:
    if type(body) is not dict:
        raise schema_error("body", f"expected map, got {type(body).__name__}")
    newer = check_version(body.get("schema_version"), body.get("minor"), body.get("sender"))
    expect_keys(body, "body", HEADER_KEYS, newer=newer)
    expect_str(body["kind"], "kind", min_len=1, max_len=MAX_KIND_LEN)
    expect_str(body["swarm"], "swarm", min_len=1, max_len=MAX_SWARM_LEN)
    sender = expect_str(body["sender"], "sender", min_len=PEER_ID_LEN, max_len=PEER_ID_LEN)
    if not PEER_ID_RE.fullmatch(sender):
        raise schema_error("sender", "expected 32 lowercase hex characters")
    expect_bytes(body["public_key"], "public_key", length=PUBLIC_KEY_LEN)
    expect_int(body["seq"], "seq", lo=0)
    expect_int(body["window"], "window", lo=0)
    expect_float(body["created"], "created", lo=0.0)
    if type(body["payload"]) is not dict:
        raise schema_error("payload", f"expected map, got {type(body['payload']).__name__}")
    return body


def split_signed(data: bytes, max_bytes: int, what: str) -> tuple[dict[str, Any], bytes, bytes]:
    """The outer map ``{"body": bin, "sig": bin(64)}`` of a signed value (a record, an index entry), checked for
    size and shape: ``(outer, body_bytes, sig)``; :class:`RecordDecodeError` (``oversize``/``malformed``)."""
    if len(data) > max_bytes:
        raise RecordDecodeError("oversize", f"{what} of {len(data)} bytes > {max_bytes}")
    outer = strict_unpackb(data, max_bytes=max_bytes)
    if type(outer) is not dict or set(outer) != {"body", "sig"}:
        raise RecordDecodeError("malformed", f"{what} must be a map with exactly 'body' and 'sig'")
    body_bytes, sig = outer["body"], outer["sig"]
    if type(body_bytes) is not bytes or type(sig) is not bytes or len(sig) != SIGNATURE_LEN:
        raise RecordDecodeError("malformed", "'body' must be bin and 'sig' bin of 64 bytes")
    return outer, body_bytes, sig


def decode_record(data: bytes, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Envelope:
    """Decode and authenticate one record.

    Order: size cap, outer + body MessagePack (bomb limits), canonical form, header schema, known kind,
    sender == peer id of public_key, Ed25519 signature over ``SIGNING_DOMAIN + body``, payload schema.
    Raises :class:`RecordDecodeError` or :class:`RecordSignatureError` (each with ``.reason``), nothing else.
    """
    if type(data) is not bytes:
        if not isinstance(data, bytearray | memoryview):
            raise RecordDecodeError("malformed", f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
    outer, body_bytes, sig = split_signed(data, max_bytes, "outer value")
    require_canonical(outer, data, "outer map")
    body = strict_unpackb(body_bytes, max_bytes=max_bytes)
    require_canonical(body, body_bytes, "body")
    _check_header(body)
    spec = get_kind(body["kind"])
    if spec is None:
        raise RecordDecodeError("unknown_kind", repr(body["kind"])[:40])
    public_key = body["public_key"]
    if peer_id_from_public(public_key) != body["sender"]:
        raise RecordSignatureError("sender_mismatch", "sender is not the peer id of public_key")
    if not verify(public_key, signing_input(body_bytes), sig):
        raise RecordSignatureError("bad_signature", f"from {body['sender'][:8]}")
    try:
        payload = spec.decode(body["payload"])
    except RecordDecodeError:
        raise
    except Exception as e:  # a registered decoder's own checks: count as schema violations
        raise RecordDecodeError("schema", f"payload: {e.__class__.__name__}: {e}"[:200]) from None
    return Envelope(
        schema_version=body["schema_version"],
        minor=body["minor"],
        kind=body["kind"],
        swarm=body["swarm"],
        sender=body["sender"],
        public_key=public_key,
        seq=body["seq"],
        window=body["window"],
        created=body["created"],
        payload=payload,
        size=len(data),
    )


def record_digest(data: bytes) -> bytes:
    """SHA-256 of the record bytes (a stable id for dedup and logs)."""
    return hashlib.sha256(data).digest()


# -- sequence numbers and windows ------------------------------------------------------------------------


def window_of(t: float, window_seconds: float) -> int:
    """The time window of unix time ``t``: ``floor(t / window_seconds)``."""
    return math.floor(t / window_seconds)


class SequenceCounter:
    """Strictly increasing sequence numbers without persisted state: ``seq = max(last + 1, now_ms)``.

    After a restart the wall clock (milliseconds) has moved past every seq the previous run issued, as long
    as that run averaged under one record per millisecond and the clock did not step backwards across the
    restart. Within one process the sequence is strictly increasing whatever the clock does.
    """

    def __init__(self, clock: Callable[[], float] = time.time, last: int = -1) -> None:
        self._clock = clock
        self._last = last

    @property
    def last(self) -> int:
        """The most recent value returned (-1 before the first)."""
        return self._last

    def next(self) -> int:
        """The next sequence number."""
        self._last = max(self._last + 1, int(self._clock() * 1000))
        return self._last
