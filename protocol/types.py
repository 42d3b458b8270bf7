"""The data a swarm exchanges, as plain immutable Python values: task references, completions, groups.

Knows nothing about encoding, signing or transport (see ``protocol.records``), and nothing about
models or tensors: everything here is text and numbers so any client in any language can read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Scalar = str | int | float | bool | None

#: Finish reasons a completion may carry. "stop": the model ended it; "length": it hit the token budget;
#: "abort": generation was cut off (APRIL partial rollouts that were never finished).
FINISH_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True)
class TaskRef:
    """Address of one task item: any peer regenerates the question and its gold answer from it alone.

    ``family`` is a task-source name (a reasoning-gym dataset name such as ``chain_sum``), ``config`` the
    generator's keyword arguments (scalars only), ``seed`` and ``index`` pick the item deterministically.
    """

    family: str
    config: Mapping[str, Scalar] = field(default_factory=dict)
    seed: int = 0
    index: int = 0

    def key(self) -> str:
        """Canonical string form, stable across processes and languages (used for hashing and dedup)."""
        cfg = json.dumps(dict(self.config), sort_keys=True, separators=(",", ":"))
        return f"{self.family}|{cfg}|{self.seed}|{self.index}"

    def __hash__(self) -> int:
        return hash(self.key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskRef) and self.key() == other.key()

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "config": dict(self.config), "seed": self.seed, "index": self.index}


@dataclass(frozen=True)
class Completion:
    """One sampled answer to a task, as text plus what the sender knew about how it was produced.

    ``logprob_mean`` is the behaviour policy's mean per-token log-probability (a hint for truncated
    importance sampling; receivers clamp it). ``token_logprobs`` optionally carries per-token values,
    meaningful only to receivers whose tokenizer id equals the record's. ``reward_hint`` is the sender's
    own score: never used for training, only for diagnostics.
    """

    text: str
    n_tokens: int
    finish_reason: str = "stop"
    policy_version: int = 0
    logprob_mean: float | None = None
    token_logprobs: tuple[float, ...] | None = None
    reward_hint: float | None = None


@dataclass(frozen=True)
class Group:
    """G completions of one task item (the unit of GRPO advantages and of SAPO sharing)."""

    task: TaskRef
    completions: tuple[Completion, ...]


@dataclass(frozen=True)
class RolloutBatch:
    """What a node publishes per step: its groups plus who made them with what (the record's payload)."""

    model: str  # the sender's model id (hub name, path or "builtin:tiny"), informational
    policy_version: int  # the sender's policy version when the batch was generated
    tokenizer: str  # a stable id of the sender's tokenizer (hash of its vocab), gates use of token_logprobs
    groups: tuple[Group, ...]


@dataclass(frozen=True)
class Envelope:
    """A record after validation: the signed header fields plus the decoded payload.

    ``sender`` is the peer id derived from ``public_key``; ``seq`` increases strictly per sender;
    ``window`` is the time window the sender stamped (unix time // window_seconds).
    """

    schema_version: int
    kind: str  # "rollouts" (payload: RolloutBatch); other kinds are added by later layers (e.g. MNPO scores)
    swarm: str
    sender: str
    public_key: bytes
    seq: int
    window: int
    created: float
    payload: Any
    size: int = 0  # bytes on the wire, for metrics
    minor: int = 0  # the sender's minor protocol version (``schema_version`` is the major)
