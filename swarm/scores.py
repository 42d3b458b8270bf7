"""The ``scores`` record kind: a player's own length-averaged logprobs on pooled responses (MNPO cross-scoring).

In an MNPO window every player answers the same prompts and publishes its responses as ordinary ``rollouts``
records. Beside them it publishes a :class:`ScoreBatch`: for a bounded sample of the pooled responses, each
identified by its content hash (:func:`response_hash`), the mean per-token log-probability of the response under
the *sender's* current policy and tokenizer. A receiver that builds a preference pair ``(y_w, y_l)`` uses the
senders whose scores cover both responses as opponents (HT-MNPO, ``swarm.mnpo``): only each player's own log-ratio
``log pi_j(y_w) - log pi_j(y_l)`` enters the loss, so players with different models and tokenizers mix freely.

Scores are untrusted hints like every peer value: the schema bounds them (finite, in ``[MIN_LOGPROB, 0]``,
distinct hashes) and the receiver decides how much weight an opponent gets. The kind is registered at import
(``protocol.kinds.register_kind``); ``protocol/SPEC.md`` section 10 is the normative description.

Knows nothing about models, oracles or the MNPO loss; only the standard library and ``protocol``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from protocol.codec import RecordDecodeError
from protocol.kinds import MAX_NAME_CHARS, RecordKind, register_kind
from protocol.schema import expect_bytes, expect_float, expect_int, expect_list, expect_map, expect_str
from protocol.types import TaskRef

KIND = "scores"
HASH_LEN = 16
#: Most scores one record carries (16 B hash + 9 B float each: ~100 KB, well under the 1 MiB record cap).
MAX_SCORES = 4096
#: Length-averaged logprobs below this are meaningless (probability ~e-1000 per token) and rejected.
MIN_LOGPROB = -1000.0
_HASH_DOMAIN = b"rl-swarm/response/v1\x00"
_KEYS = ("hashes", "logprob_means", "model", "policy_version", "tokenizer", "window")


def _bad(where: str, msg: str) -> RecordDecodeError:
    return RecordDecodeError("schema", f"{where}: {msg}")


def response_hash(task: TaskRef, text: str) -> bytes:
    """Content id of one response: ``sha256("rl-swarm/response/v1\\0" + task.key() + "\\0" + text)[:16]``."""
    data = _HASH_DOMAIN + task.key().encode("utf-8") + b"\x00" + text.encode("utf-8", errors="surrogatepass")
    return hashlib.sha256(data).digest()[:HASH_LEN]


@dataclass(frozen=True)
class ScoreBatch:
    """One player's scores: ``logprob_means[i]`` is ``mean_t log pi_sender(token_t)`` of the response ``hashes[i]``.

    ``window`` is the MNPO window the scores belong to; ``policy_version`` the sender's version that computed
    them (all scores of one record come from one version, so any two of them form a consistent log-ratio).
    """

    window: int
    model: str
    tokenizer: str
    policy_version: int
    hashes: tuple[bytes, ...]
    logprob_means: tuple[float, ...]

    def as_dict(self) -> dict[bytes, float]:
        """``hash -> logprob_mean``."""
        return dict(zip(self.hashes, self.logprob_means, strict=True))


def scores_to_wire(batch: ScoreBatch) -> dict[str, Any]:
    """The wire map of a :class:`ScoreBatch` (hashes concatenated into one ``bin``)."""
    if not isinstance(batch, ScoreBatch):
        raise TypeError(f"a 'scores' payload is a ScoreBatch, got {type(batch).__name__}")
    if len(batch.hashes) != len(batch.logprob_means):
        raise ValueError("hashes and logprob_means differ in length")
    return {
        "window": int(batch.window),
        "model": str(batch.model),
        "tokenizer": str(batch.tokenizer),
        "policy_version": int(batch.policy_version),
        "hashes": b"".join(bytes(h) for h in batch.hashes),
        "logprob_means": [float(x) for x in batch.logprob_means],
    }


def scores_from_wire(m: Any) -> ScoreBatch:
    """Check and build a :class:`ScoreBatch` from its wire map (schema violations raise ``RecordDecodeError``)."""
    expect_map(m, "payload", _KEYS)
    raw = expect_bytes(m["hashes"], "payload.hashes", max_len=HASH_LEN * MAX_SCORES)
    if len(raw) % HASH_LEN:
        raise _bad("payload.hashes", f"length {len(raw)} is not a multiple of {HASH_LEN}")
    hashes = tuple(raw[i : i + HASH_LEN] for i in range(0, len(raw), HASH_LEN))
    if len(set(hashes)) != len(hashes):
        raise _bad("payload.hashes", "duplicate response hashes")
    lps = expect_list(m["logprob_means"], "payload.logprob_means", max_len=MAX_SCORES)
    if len(lps) != len(hashes):
        raise _bad("payload.logprob_means", f"{len(lps)} values for {len(hashes)} hashes")
    values = tuple(expect_float(x, "payload.logprob_means[]", lo=MIN_LOGPROB, hi=0.0) for x in lps)
    return ScoreBatch(
        window=expect_int(m["window"], "payload.window", lo=0),
        model=expect_str(m["model"], "payload.model", max_len=MAX_NAME_CHARS),
        tokenizer=expect_str(m["tokenizer"], "payload.tokenizer", max_len=MAX_NAME_CHARS),
        policy_version=expect_int(m["policy_version"], "payload.policy_version", lo=0),
        hashes=hashes,
        logprob_means=values,
    )


SCORES = register_kind(RecordKind(KIND, scores_to_wire, scores_from_wire, ScoreBatch))
