"""Records on the wire: canonical MessagePack, signed envelopes, a registry of payload kinds, seq and windows.

A record is ``packb({"body": <bin>, "sig": <bin 64>})`` where ``body`` is the canonical MessagePack of the
header map (schema_version, minor, kind, swarm, sender, public_key, seq, window, created, payload) and ``sig`` is
the sender's Ed25519 signature of ``SIGNING_DOMAIN + body``. Receivers verify the exact body bytes they got
(no re-encoding before verification) and additionally require the body to be canonical, so one logical
record has exactly one byte form. ``protocol/SPEC.md`` is the normative description.

Payload kinds live in a small registry: ``"rollouts"`` (a :class:`~protocol.types.RolloutBatch`) is built
in; later layers call :func:`register_kind` with their own encode/decode functions (use the ``expect_*``
helpers so schema violations surface as :class:`RecordDecodeError` with reason ``"schema"``).

Knows nothing about transports, clocks of other peers, replay or quotas (see ``protocol.validation``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from protocol.errors import DecodeError, SignatureError, SwarmError
from protocol.identity import PEER_ID_LEN, PUBLIC_KEY_LEN, SIGNATURE_LEN, Identity, peer_id_from_public, verify
from protocol.types import FINISH_REASONS, Completion, Envelope, Group, RolloutBatch, TaskRef
from protocol.version import PROTOCOL_VERSION, format_version, local_version, report_incompatible

logger = logging.getLogger(__name__)

#: The record's ``schema_version`` is the protocol's major version; its ``minor`` key the minor (SPEC.md 15).
SCHEMA_VERSION = PROTOCOL_VERSION[0]
MAX_VERSION_PART = 9999
#: Prepended to the body bytes before signing, so a record signature can never be replayed as a signature of
#: anything else this key signs (and vice versa).
SIGNING_DOMAIN = b"rl-swarm/record/v1\x00"
DEFAULT_MAX_RECORD_BYTES = 1 << 20

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
MAX_DEPTH = 16  # nesting of maps/arrays; the rollouts schema needs 6
MAX_ARRAY_LEN = 1 << 16  # per array; a 1 MiB record cannot hold more useful elements anyway
MAX_MAP_LEN = 256  # per map; every schema map is small
MAX_SWARM_LEN = 64
MAX_KIND_LEN = 32
_KIND_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_PEER_ID_RE = re.compile(rf"^[0-9a-f]{{{PEER_ID_LEN}}}$")
HEADER_KEYS = frozenset(
    {"schema_version", "minor", "kind", "swarm", "sender", "public_key", "seq", "window", "created", "payload"}
)

#: Rejection reasons decode_record can give (``RecordDecodeError.reason`` / ``RecordSignatureError.reason``).
DECODE_REASONS = (
    "oversize",
    "malformed",
    "non_canonical",
    "unsupported_version",
    "incompatible_version",
    "schema",
    "unknown_kind",
)
SIGNATURE_REASONS = ("sender_mismatch", "bad_signature")


class RecordDecodeError(DecodeError):
    """Bytes are not a well-formed record; ``reason`` is one of :data:`DECODE_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class RecordSignatureError(SignatureError):
    """A well-formed record is not authentic; ``reason`` is one of :data:`SIGNATURE_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class EncodeError(SwarmError):
    """A local payload cannot be encoded as a valid record (bad types, out of bounds, too large)."""


# -- canonical MessagePack ---------------------------------------------------------------------------------


def _canon(obj: Any, depth: int = 0) -> Any:
    """Normalise to the canonical data model; raise ValueError/TypeError on anything outside it."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nesting deeper than {MAX_DEPTH}")
    t = type(obj)
    if obj is None or t is bool or t is str or t is bytes:
        return obj
    if t is int:
        if not INT64_MIN <= obj <= (1 << 64) - 1:
            raise ValueError("integer out of MessagePack range")
        return obj
    if t is float:
        if not math.isfinite(obj):
            raise ValueError("NaN and infinities are not allowed")
        return obj
    if t is dict:
        out = {}
        for k in sorted(obj):  # raises TypeError on mixed key types
            if type(k) is not str:
                raise TypeError(f"map keys must be str, got {type(k).__name__}")
            out[k] = _canon(obj[k], depth + 1)
        return out
    if t is list or t is tuple:
        return [_canon(v, depth + 1) for v in obj]
    if t is bytearray or t is memoryview:
        return bytes(obj)
    raise TypeError(f"type {t.__name__} is not part of the canonical data model")


_PACKER_OPTS = {"use_bin_type": True, "use_single_float": False, "strict_types": True, "datetime": False}


def canonical_packb(obj: Any) -> bytes:
    """Canonical MessagePack: maps with str keys sorted by code point (= UTF-8 byte order), floats as float64,
    ints and lengths in their shortest form, str as UTF-8 ``str``, bytes as ``bin``, no ext types."""
    return msgpack.packb(_canon(obj), **_PACKER_OPTS)


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"ext type {code} is not allowed")


def strict_unpackb(data: bytes, *, max_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Any:
    """Decode one MessagePack object with bomb limits; raises :class:`RecordDecodeError` ("malformed").

    Does not check canonical form; see :func:`require_canonical`.
    """
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            timestamp=0,
            ext_hook=_reject_ext,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=MAX_ARRAY_LEN,
            max_map_len=MAX_MAP_LEN,
            max_ext_len=0,
        )
        return obj
    except Exception as e:  # msgpack raises ExtraData, FormatError, StackError, ValueError, UnicodeDecodeError...
        raise RecordDecodeError("malformed", f"{e.__class__.__name__}: {e}"[:200]) from None


def require_canonical(obj: Any, raw: bytes, where: str) -> None:
    """``raw`` (which decoded to ``obj``) must be the canonical encoding of ``obj``.

    Values outside the data model (ext types, timestamps, non-str keys, NaN, too deep) are "malformed";
    a valid value in a non-canonical byte form (unsorted or duplicate keys, float32, long int forms) is
    "non_canonical".
    """
    try:
        again = canonical_packb(obj)
    except (TypeError, ValueError) as e:
        raise RecordDecodeError("malformed", f"{where}: {e}"[:200]) from None
    if again != raw:
        raise RecordDecodeError("non_canonical", where)


# -- schema helpers (public: later layers build their payload decoders from these) ------------------------


def _schema(where: str, msg: str) -> RecordDecodeError:
    return RecordDecodeError("schema", f"{where}: {msg}")


def expect_map(obj: Any, where: str, keys: Iterable[str]) -> dict[str, Any]:
    """``obj`` must be a map with exactly ``keys`` (optional values are present as nil, never omitted)."""
    if type(obj) is not dict:
        raise _schema(where, f"expected map, got {type(obj).__name__}")
    want = set(keys)
    got = set(obj)
    if got != want:
        missing, extra = sorted(want - got), sorted(got - want)
        raise _schema(where, f"missing keys {missing}, unexpected keys {extra}")
    return obj


def expect_str(obj: Any, where: str, *, max_len: int, min_len: int = 0, choices: Iterable[str] | None = None) -> str:
    """A UTF-8 string with ``min_len <= len <= max_len`` characters (and in ``choices`` if given)."""
    if type(obj) is not str:
        raise _schema(where, f"expected str, got {type(obj).__name__}")
    if not min_len <= len(obj) <= max_len:
        raise _schema(where, f"length {len(obj)} outside [{min_len}, {max_len}]")
    if choices is not None and obj not in choices:
        raise _schema(where, f"{obj[:40]!r} not one of {sorted(choices)}")
    return obj


def expect_int(obj: Any, where: str, *, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """An integer (not a bool, not a float) in ``[lo, hi]``."""
    if type(obj) is not int:
        raise _schema(where, f"expected int, got {type(obj).__name__}")
    if not lo <= obj <= hi:
        raise _schema(where, f"{obj} outside [{lo}, {hi}]")
    return obj


def expect_float(obj: Any, where: str, *, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite float64 (ints are not accepted: the canonical form of a real number is float64) in ``[lo, hi]``."""
    if type(obj) is not float:
        raise _schema(where, f"expected float, got {type(obj).__name__}")
    if not (math.isfinite(obj) and lo <= obj <= hi):
        raise _schema(where, f"{obj} outside [{lo}, {hi}] or not finite")
    return obj


def expect_optional_float(obj: Any, where: str, *, lo: float = -math.inf, hi: float = math.inf) -> float | None:
    """nil or a finite float64 in ``[lo, hi]``."""
    return None if obj is None else expect_float(obj, where, lo=lo, hi=hi)


def expect_bytes(obj: Any, where: str, *, length: int | None = None, max_len: int | None = None) -> bytes:
    """A ``bin`` value, of exactly ``length`` bytes or at most ``max_len``."""
    if type(obj) is not bytes:
        raise _schema(where, f"expected bin, got {type(obj).__name__}")
    if length is not None and len(obj) != length:
        raise _schema(where, f"expected {length} bytes, got {len(obj)}")
    if max_len is not None and len(obj) > max_len:
        raise _schema(where, f"{len(obj)} bytes > {max_len}")
    return obj


def expect_list(obj: Any, where: str, *, max_len: int, min_len: int = 0) -> list[Any]:
    """An array with ``min_len <= len <= max_len`` elements."""
    if type(obj) is not list:
        raise _schema(where, f"expected array, got {type(obj).__name__}")
    if not min_len <= len(obj) <= max_len:
        raise _schema(where, f"{len(obj)} elements outside [{min_len}, {max_len}]")
    return obj


def _float_or_none(x: float | None) -> float | None:
    return None if x is None else float(x)


# -- kind registry -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordKind:
    """A payload kind: ``encode`` turns the payload object into a canonical-model map, ``decode`` checks such a
    map (raising :class:`RecordDecodeError`, or any ValueError/TypeError/KeyError, which count as "schema")
    and builds the payload object."""

    name: str
    encode: Callable[[Any], dict[str, Any]]
    decode: Callable[[dict[str, Any]], Any]
    payload_type: type | None = None


_KINDS: dict[str, RecordKind] = {}


def register_kind(kind: RecordKind, *, replace: bool = False) -> RecordKind:
    """Add a payload kind (e.g. MNPO ``"scores"``); names match ``[a-z][a-z0-9_]{0,31}``."""
    if not _KIND_RE.match(kind.name):
        raise ValueError(f"kind name {kind.name!r} must match {_KIND_RE.pattern}")
    if kind.name in _KINDS and not replace and _KINDS[kind.name] != kind:
        raise ValueError(f"record kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> RecordKind | None:
    """The registered kind called ``name``, or None."""
    return _KINDS.get(name)


def registered_kinds() -> list[str]:
    """Names of all registered kinds, sorted."""
    return sorted(_KINDS)


# -- the "rollouts" kind -----------------------------------------------------------------------------------

MAX_GROUPS = 1024
MAX_COMPLETIONS = 1024
MAX_TEXT_CHARS = 1 << 18
MAX_TOKEN_LOGPROBS = 1 << 16
MAX_N_TOKENS = (1 << 31) - 1
MAX_NAME_CHARS = 256
MAX_FAMILY_CHARS = 128
MAX_CONFIG_ENTRIES = 64
MAX_CONFIG_KEY_CHARS = 64
MAX_CONFIG_STR_CHARS = 256

_BATCH_KEYS = ("groups", "model", "policy_version", "tokenizer")
_GROUP_KEYS = ("completions", "task")
_TASK_KEYS = ("config", "family", "index", "seed")
_COMPLETION_KEYS = (
    "finish_reason",
    "logprob_mean",
    "n_tokens",
    "policy_version",
    "reward_hint",
    "text",
    "token_logprobs",
)


def _scalar_to_wire(v: Any) -> Any:
    if v is None or isinstance(v, bool | str):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    raise TypeError(f"task config values must be scalars, got {type(v).__name__}")


def task_to_wire(t: TaskRef) -> dict[str, Any]:
    """The wire map of a TaskRef."""
    return {
        "family": str(t.family),
        "config": {str(k): _scalar_to_wire(v) for k, v in dict(t.config).items()},
        "seed": int(t.seed),
        "index": int(t.index),
    }


def task_from_wire(m: Any, where: str = "task") -> TaskRef:
    """Check and build a TaskRef from its wire map."""
    expect_map(m, where, _TASK_KEYS)
    cfg = m["config"]
    if type(cfg) is not dict or len(cfg) > MAX_CONFIG_ENTRIES:
        raise _schema(f"{where}.config", f"expected a map of at most {MAX_CONFIG_ENTRIES} entries")
    for k, v in cfg.items():
        expect_str(k, f"{where}.config key", min_len=1, max_len=MAX_CONFIG_KEY_CHARS)
        if type(v) is str:
            expect_str(v, f"{where}.config.{k}", max_len=MAX_CONFIG_STR_CHARS)
        elif type(v) is int:
            expect_int(v, f"{where}.config.{k}")
        elif v is not None and type(v) not in (bool, float):
            raise _schema(f"{where}.config.{k}", f"expected a scalar, got {type(v).__name__}")
    return TaskRef(
        family=expect_str(m["family"], f"{where}.family", min_len=1, max_len=MAX_FAMILY_CHARS),
        config=dict(cfg),
        seed=expect_int(m["seed"], f"{where}.seed"),
        index=expect_int(m["index"], f"{where}.index", lo=0),
    )


def completion_to_wire(c: Completion) -> dict[str, Any]:
    """The wire map of a Completion (optional fields are nil, never omitted)."""
    return {
        "text": str(c.text),
        "n_tokens": int(c.n_tokens),
        "finish_reason": str(c.finish_reason),
        "policy_version": int(c.policy_version),
        "logprob_mean": _float_or_none(c.logprob_mean),
        "token_logprobs": None if c.token_logprobs is None else [float(x) for x in c.token_logprobs],
        "reward_hint": _float_or_none(c.reward_hint),
    }


def completion_from_wire(m: Any, where: str = "completion") -> Completion:
    """Check and build a Completion from its wire map."""
    expect_map(m, where, _COMPLETION_KEYS)
    tl = m["token_logprobs"]
    if tl is not None:
        expect_list(tl, f"{where}.token_logprobs", max_len=MAX_TOKEN_LOGPROBS)
        tl = tuple(expect_float(x, f"{where}.token_logprobs[]") for x in tl)
    return Completion(
        text=expect_str(m["text"], f"{where}.text", max_len=MAX_TEXT_CHARS),
        n_tokens=expect_int(m["n_tokens"], f"{where}.n_tokens", lo=0, hi=MAX_N_TOKENS),
        finish_reason=expect_str(m["finish_reason"], f"{where}.finish_reason", max_len=16, choices=FINISH_REASONS),
        policy_version=expect_int(m["policy_version"], f"{where}.policy_version", lo=0),
        logprob_mean=expect_optional_float(m["logprob_mean"], f"{where}.logprob_mean"),
        token_logprobs=tl,
        reward_hint=expect_optional_float(m["reward_hint"], f"{where}.reward_hint"),
    )


def rollouts_to_wire(batch: RolloutBatch) -> dict[str, Any]:
    """The wire map of a RolloutBatch (the ``"rollouts"`` payload)."""
    if not isinstance(batch, RolloutBatch):
        raise TypeError(f"a 'rollouts' payload is a RolloutBatch, got {type(batch).__name__}")
    return {
        "model": str(batch.model),
        "policy_version": int(batch.policy_version),
        "tokenizer": str(batch.tokenizer),
        "groups": [
            {"task": task_to_wire(g.task), "completions": [completion_to_wire(c) for c in g.completions]}
            for g in batch.groups
        ],
    }


def rollouts_from_wire(m: Any) -> RolloutBatch:
    """Check and build a RolloutBatch from its wire map."""
    expect_map(m, "payload", _BATCH_KEYS)
    groups = []
    for i, g in enumerate(expect_list(m["groups"], "payload.groups", max_len=MAX_GROUPS)):
        where = f"payload.groups[{i}]"
        expect_map(g, where, _GROUP_KEYS)
        comps = expect_list(g["completions"], f"{where}.completions", min_len=1, max_len=MAX_COMPLETIONS)
        groups.append(
            Group(
                task=task_from_wire(g["task"], f"{where}.task"),
                completions=tuple(completion_from_wire(c, f"{where}.completions[]") for c in comps),
            )
        )
    return RolloutBatch(
        model=expect_str(m["model"], "payload.model", max_len=MAX_NAME_CHARS),
        policy_version=expect_int(m["policy_version"], "payload.policy_version", lo=0),
        tokenizer=expect_str(m["tokenizer"], "payload.tokenizer", max_len=MAX_NAME_CHARS),
        groups=tuple(groups),
    )


ROLLOUTS = register_kind(RecordKind("rollouts", rollouts_to_wire, rollouts_from_wire, RolloutBatch))


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
    spec = _KINDS.get(kind)
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
        raise _schema("body", f"expected map, got {type(body).__name__}")
    newer = check_version(body.get("schema_version"), body.get("minor"), body.get("sender"))
    expect_keys(body, "body", HEADER_KEYS, newer=newer)
    expect_str(body["kind"], "kind", min_len=1, max_len=MAX_KIND_LEN)
    expect_str(body["swarm"], "swarm", min_len=1, max_len=MAX_SWARM_LEN)
    sender = expect_str(body["sender"], "sender", min_len=PEER_ID_LEN, max_len=PEER_ID_LEN)
    if not _PEER_ID_RE.match(sender):
        raise _schema("sender", "expected 32 lowercase hex characters")
    expect_bytes(body["public_key"], "public_key", length=PUBLIC_KEY_LEN)
    expect_int(body["seq"], "seq", lo=0)
    expect_int(body["window"], "window", lo=0)
    expect_float(body["created"], "created", lo=0.0)
    if type(body["payload"]) is not dict:
        raise _schema("payload", f"expected map, got {type(body['payload']).__name__}")
    return body


def split_signed(data: bytes, max_bytes: int, what: str) -> tuple[dict, bytes, bytes]:
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
    spec = _KINDS.get(body["kind"])
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
