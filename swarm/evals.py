"""The ``eval`` record kind: a node's latest held-out evaluation summary, signed, for dashboards and peers.

A node that evaluates itself on held-out items (its ``eval.jsonl``) may publish the summary as an ``eval``
record. It is the node's own measurement: an observer shows it as reported, labelled, and cannot re-verify it
(the held-out completions are not in the record). The schema bounds every value (rates in [0, 1], at most
:data:`MAX_FAMILIES` families). Registered at import; ``protocol/SPEC.md`` section 14 is normative.

Knows nothing about how the evaluation was run; only the standard library and ``protocol``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protocol.codec import RecordDecodeError
from protocol.kinds import MAX_FAMILY_CHARS, MAX_NAME_CHARS, RecordKind, register_kind
from protocol.schema import expect_float, expect_int, expect_map, expect_optional_float, expect_str

KIND = "eval"
MAX_FAMILIES = 64
_KEYS = ("accuracy", "families", "greedy_accuracy", "model", "policy_version", "step")
_FAMILY_KEYS = ("accuracy", "format_rate", "greedy_accuracy", "mean_length", "n")


@dataclass(frozen=True)
class FamilyEval:
    """Held-out results of one task family."""

    accuracy: float
    n: int
    greedy_accuracy: float | None = None
    format_rate: float | None = None
    mean_length: float | None = None


@dataclass(frozen=True)
class EvalSummary:
    """A node's held-out evaluation at ``step`` (the fields of one ``eval.jsonl`` line, plus model and version)."""

    step: int
    model: str
    policy_version: int
    accuracy: float
    greedy_accuracy: float | None = None
    families: dict[str, FamilyEval] = field(default_factory=dict)

    @classmethod
    def from_eval_line(cls, line: dict[str, Any], *, model: str, policy_version: int) -> EvalSummary:
        """Build from one ``eval.jsonl`` object (``{"step", "accuracy", "greedy_accuracy", "families": {...}}``)."""
        fams = {}
        for name, f in dict(line.get("families") or {}).items():
            fams[str(name)] = FamilyEval(
                accuracy=float(f["accuracy"]),
                n=int(f.get("n", 0)),
                greedy_accuracy=_opt(f.get("greedy_accuracy")),
                format_rate=_opt(f.get("format_rate")),
                mean_length=_opt(f.get("mean_length")),
            )
        return cls(
            step=int(line["step"]),
            model=model,
            policy_version=policy_version,
            accuracy=float(line["accuracy"]),
            greedy_accuracy=_opt(line.get("greedy_accuracy")),
            families=fams,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (what a dashboard shows)."""
        return {
            "step": self.step,
            "model": self.model,
            "policy_version": self.policy_version,
            "accuracy": self.accuracy,
            "greedy_accuracy": self.greedy_accuracy,
            "families": {k: vars(v).copy() for k, v in sorted(self.families.items())},
        }


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)


def eval_to_wire(e: EvalSummary) -> dict[str, Any]:
    """The wire map of an :class:`EvalSummary`."""
    if not isinstance(e, EvalSummary):
        raise TypeError(f"an 'eval' payload is an EvalSummary, got {type(e).__name__}")
    if len(e.families) > MAX_FAMILIES:
        raise ValueError(f"at most {MAX_FAMILIES} families per eval record")
    return {
        "step": int(e.step),
        "model": str(e.model),
        "policy_version": int(e.policy_version),
        "accuracy": float(e.accuracy),
        "greedy_accuracy": _opt(e.greedy_accuracy),
        "families": {
            str(name): {
                "accuracy": float(f.accuracy),
                "n": int(f.n),
                "greedy_accuracy": _opt(f.greedy_accuracy),
                "format_rate": _opt(f.format_rate),
                "mean_length": _opt(f.mean_length),
            }
            for name, f in e.families.items()
        },
    }


def eval_from_wire(m: Any) -> EvalSummary:
    """Check and build an :class:`EvalSummary` (schema violations raise ``RecordDecodeError``)."""
    expect_map(m, "payload", _KEYS)
    fams_in = m["families"]
    if not isinstance(fams_in, dict) or len(fams_in) > MAX_FAMILIES:
        raise RecordDecodeError("schema", f"payload.families: a map of at most {MAX_FAMILIES} entries")
    fams = {}
    for name, f in fams_in.items():
        where = "payload.families[]"
        expect_str(name, where, min_len=1, max_len=MAX_FAMILY_CHARS)
        expect_map(f, where, _FAMILY_KEYS)
        fams[name] = FamilyEval(
            accuracy=expect_float(f["accuracy"], where + ".accuracy", lo=0.0, hi=1.0),
            n=expect_int(f["n"], where + ".n", lo=0, hi=(1 << 31) - 1),
            greedy_accuracy=expect_optional_float(f["greedy_accuracy"], where + ".greedy_accuracy", lo=0.0, hi=1.0),
            format_rate=expect_optional_float(f["format_rate"], where + ".format_rate", lo=0.0, hi=1.0),
            mean_length=expect_optional_float(f["mean_length"], where + ".mean_length", lo=0.0),
        )
    return EvalSummary(
        step=expect_int(m["step"], "payload.step", lo=0),
        model=expect_str(m["model"], "payload.model", max_len=MAX_NAME_CHARS),
        policy_version=expect_int(m["policy_version"], "payload.policy_version", lo=0),
        accuracy=expect_float(m["accuracy"], "payload.accuracy", lo=0.0, hi=1.0),
        greedy_accuracy=expect_optional_float(m["greedy_accuracy"], "payload.greedy_accuracy", lo=0.0, hi=1.0),
        families=fams,
    )


EVAL = register_kind(RecordKind(KIND, eval_to_wire, eval_from_wire, EvalSummary))
