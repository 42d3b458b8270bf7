"""Schema helpers for decoding canonical maps into typed values: each check fails as one
:class:`~protocol.codec.RecordDecodeError` with reason ``schema`` naming where and what.

Public: the record header, the payload kinds (``protocol.kinds``, ``swarm.scores``, ``swarm.evals``) and the
index entries (``protocol.layout``) build their decoders from these. Knows nothing about what the values mean.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from protocol.codec import INT64_MAX, INT64_MIN, RecordDecodeError


def schema_error(where: str, msg: str) -> RecordDecodeError:
    """The :class:`RecordDecodeError` (reason ``schema``) for a value at ``where`` that breaks its schema."""
    return RecordDecodeError("schema", f"{where}: {msg}")


def expect_map(obj: Any, where: str, keys: Iterable[str]) -> dict[str, Any]:
    """``obj`` must be a map with exactly ``keys`` (optional values are present as nil, never omitted)."""
    if type(obj) is not dict:
        raise schema_error(where, f"expected map, got {type(obj).__name__}")
    want = set(keys)
    got = set(obj)
    if got != want:
        missing, extra = sorted(want - got), sorted(got - want)
        raise schema_error(where, f"missing keys {missing}, unexpected keys {extra}")
    return obj


def expect_str(obj: Any, where: str, *, max_len: int, min_len: int = 0, choices: Iterable[str] | None = None) -> str:
    """A UTF-8 string with ``min_len <= len <= max_len`` characters (and in ``choices`` if given)."""
    if type(obj) is not str:
        raise schema_error(where, f"expected str, got {type(obj).__name__}")
    if not min_len <= len(obj) <= max_len:
        raise schema_error(where, f"length {len(obj)} outside [{min_len}, {max_len}]")
    if choices is not None and obj not in choices:
        raise schema_error(where, f"{obj[:40]!r} not one of {sorted(choices)}")
    return obj


def expect_int(obj: Any, where: str, *, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """An integer (not a bool, not a float) in ``[lo, hi]``."""
    if type(obj) is not int:
        raise schema_error(where, f"expected int, got {type(obj).__name__}")
    if not lo <= obj <= hi:
        raise schema_error(where, f"{obj} outside [{lo}, {hi}]")
    return obj


def expect_float(obj: Any, where: str, *, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite float64 (ints are not accepted: the canonical form of a real number is float64) in ``[lo, hi]``."""
    if type(obj) is not float:
        raise schema_error(where, f"expected float, got {type(obj).__name__}")
    if not (math.isfinite(obj) and lo <= obj <= hi):
        raise schema_error(where, f"{obj} outside [{lo}, {hi}] or not finite")
    return obj


def expect_optional_float(obj: Any, where: str, *, lo: float = -math.inf, hi: float = math.inf) -> float | None:
    """nil or a finite float64 in ``[lo, hi]``."""
    return None if obj is None else expect_float(obj, where, lo=lo, hi=hi)


def expect_bytes(obj: Any, where: str, *, length: int | None = None, max_len: int | None = None) -> bytes:
    """A ``bin`` value, of exactly ``length`` bytes or at most ``max_len``."""
    if type(obj) is not bytes:
        raise schema_error(where, f"expected bin, got {type(obj).__name__}")
    if length is not None and len(obj) != length:
        raise schema_error(where, f"expected {length} bytes, got {len(obj)}")
    if max_len is not None and len(obj) > max_len:
        raise schema_error(where, f"{len(obj)} bytes > {max_len}")
    return obj


def expect_list(obj: Any, where: str, *, max_len: int, min_len: int = 0) -> list[Any]:
    """An array with ``min_len <= len <= max_len`` elements."""
    if type(obj) is not list:
        raise schema_error(where, f"expected array, got {type(obj).__name__}")
    if not min_len <= len(obj) <= max_len:
        raise schema_error(where, f"{len(obj)} elements outside [{min_len}, {max_len}]")
    return obj
