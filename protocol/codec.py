"""Canonical MessagePack and the errors of the wire: one byte form per value, bombs refused before they inflate.

Values are encoded canonically (maps with sorted string keys, the smallest integer forms, float64 only, bin for
bytes, no ext types) and decoded strictly (bounded nesting, array, map and total sizes); :func:`require_canonical`
rejects any value whose bytes are not the canonical encoding of what they decode to. ``protocol/SPEC.md`` 3 is
the normative description.

Knows nothing about records, signatures or payload kinds (``protocol.records``, ``protocol.kinds``).
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

from protocol.errors import DecodeError, SignatureError, SwarmError

DEFAULT_MAX_RECORD_BYTES = 1 << 20
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
MAX_DEPTH = 16  # nesting of maps/arrays; the rollouts schema needs 6
MAX_ARRAY_LEN = 1 << 16  # per array; a 1 MiB record cannot hold more useful elements anyway
MAX_MAP_LEN = 256  # per map; every schema map is small

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
    """Normalise to the canonical data model; raise ValueError/TypeError on anything outside it.

    ``depth`` is the value's nesting depth (the top level is 0); only maps and arrays are held to
    :data:`MAX_DEPTH`, as :func:`_check_decoded` does, so a scalar inside a depth-16 container encodes and decodes.
    """
    t = type(obj)
    if depth > MAX_DEPTH and t in (dict, list, tuple):
        raise ValueError(f"nesting deeper than {MAX_DEPTH}")
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


def _check_decoded(obj: Any, depth: int = 0) -> None:
    """:func:`_canon`'s checks on a value fresh from :func:`strict_unpackb`, without rebuilding it: its maps keep
    the wire's key order, so when every map's keys are sorted str keys, packing it as it is gives the canonical
    bytes. Raises ValueError/TypeError on anything outside the data model, ``_Unsorted`` on unsorted keys."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nesting deeper than {MAX_DEPTH}")
    t = type(obj)
    if t is dict:
        prev = None
        for k, v in obj.items():
            if type(k) is not str:
                raise TypeError(f"map keys must be str, got {type(k).__name__}")
            if prev is not None and k <= prev:
                raise _Unsorted
            prev = k
            tv = type(v)
            if tv is dict or tv is list:
                _check_decoded(v, depth + 1)
            elif tv is float and not math.isfinite(v):
                raise ValueError("NaN and infinities are not allowed")
    elif t is list:
        for v in obj:
            tv = type(v)
            if tv is dict or tv is list:
                _check_decoded(v, depth + 1)
            elif tv is float and not math.isfinite(v):
                raise ValueError("NaN and infinities are not allowed")
    elif t is float and not math.isfinite(obj):
        raise ValueError("NaN and infinities are not allowed")


class _Unsorted(Exception):
    """A map whose keys are not in canonical (sorted) order: the bytes are not canonical."""


_PACKER_OPTS = {"use_bin_type": True, "use_single_float": False, "strict_types": True, "datetime": False}


def canonical_packb(obj: Any) -> bytes:
    """Canonical MessagePack: maps with str keys sorted by code point (= UTF-8 byte order), floats as float64,
    ints and lengths in their shortest form, str as UTF-8 ``str``, bytes as ``bin``, no ext types."""
    data: bytes = msgpack.packb(_canon(obj), **_PACKER_OPTS)
    return data


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
        _check_decoded(obj)
        again: bytes = msgpack.packb(obj, **_PACKER_OPTS)
    except _Unsorted:
        raise RecordDecodeError("non_canonical", f"{where}: map keys out of order") from None
    except (TypeError, ValueError, OverflowError) as e:
        raise RecordDecodeError("malformed", f"{where}: {e}"[:200]) from None
    if again != raw:
        raise RecordDecodeError("non_canonical", where)
