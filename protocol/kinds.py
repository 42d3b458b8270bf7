"""The registry of record payload kinds, and the built-in ``rollouts`` kind (a :class:`~protocol.types.RolloutBatch`).

A kind maps its payload object to a canonical-model map and back; decoders use the ``protocol.schema`` helpers so
violations surface as :class:`~protocol.codec.RecordDecodeError` with reason ``"schema"``. Later layers call
:func:`register_kind` with their own kinds (``swarm.scores``, ``swarm.evals``).

Knows nothing about envelopes, signatures or transports (``protocol.records``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.codec import INT64_MAX
from protocol.schema import (
    expect_float,
    expect_int,
    expect_list,
    expect_map,
    expect_optional_float,
    expect_str,
    schema_error,
)
from protocol.types import FINISH_REASONS, Completion, Group, RolloutBatch, TaskRef

MAX_KIND_LEN = 32
_KIND_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


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


def _float_or_none(x: float | None) -> float | None:
    return None if x is None else float(x)


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
        raise schema_error(f"{where}.config", f"expected a map of at most {MAX_CONFIG_ENTRIES} entries")
    for k, v in cfg.items():
        expect_str(k, f"{where}.config key", min_len=1, max_len=MAX_CONFIG_KEY_CHARS)
        if type(v) is str:
            expect_str(v, f"{where}.config.{k}", max_len=MAX_CONFIG_STR_CHARS)
        elif type(v) is int:
            expect_int(v, f"{where}.config.{k}")
        elif v is not None and type(v) not in (bool, float):
            raise schema_error(f"{where}.config.{k}", f"expected a scalar, got {type(v).__name__}")
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


_COMPLETION_KEYSET = frozenset(_COMPLETION_KEYS)


def _finite_or_nil(x: Any) -> bool:
    return x is None or (type(x) is float and math.isfinite(x))


def completion_from_wire(m: Any, where: str = "completion") -> Completion:
    """Check and build a Completion from its wire map.

    A record carries dozens of completions, so the well-formed case (no per-token logprobs) is checked in one pass
    of the same rules; anything else goes through the ``expect_*`` checks, which name the field that broke them.
    """
    if type(m) is dict and m.keys() == _COMPLETION_KEYSET and m["token_logprobs"] is None:
        text, n, reason, version = m["text"], m["n_tokens"], m["finish_reason"], m["policy_version"]
        if (
            type(text) is str
            and len(text) <= MAX_TEXT_CHARS
            and type(n) is int
            and 0 <= n <= MAX_N_TOKENS
            and type(reason) is str
            and reason in FINISH_REASONS
            and type(version) is int
            and 0 <= version <= INT64_MAX
            and _finite_or_nil(m["logprob_mean"])
            and _finite_or_nil(m["reward_hint"])
        ):
            return Completion(
                text=text,
                n_tokens=n,
                finish_reason=reason,
                policy_version=version,
                logprob_mean=m["logprob_mean"],
                token_logprobs=None,
                reward_hint=m["reward_hint"],
            )
    return _checked_completion(m, where)


def _checked_completion(m: Any, where: str) -> Completion:
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
