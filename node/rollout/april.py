"""APRIL active partial rollouts (Zhou et al. 2025, arXiv 2509.18521): over-provision, stop early, keep the tail.

A step asks the engine for more groups than the learner needs (``oversample`` x ``target``), buffered partial
groups first. As completions finish, the engine's ``should_stop`` callback counts the *complete* groups (every
completion ended by EOS or by its token budget); once ``target`` are complete the batch stops. Complete groups go
to the learner; the others -- finished completions and unfinished ones with their partial tokens -- stay in the
:class:`AprilBuffer` and are continued first next step from where they stopped (prompt + partial tokens, the
remaining budget). Every token keeps the policy version that sampled it and its behaviour logprob, so tokens
sampled by an older policy are off-policy and the learner's truncated importance weight
``w_t = min(pi_old(a_t) / pi_behaviour(a_t), C)`` (DART, arXiv 2509.23866) applies to them.

Why it pays: a batch of groups runs until its *longest* completion ends, and with long-tailed lengths most of the
batch idles (or computes padding) behind a few long completions. Cutting the tail and resuming it later keeps
the batch busy; no sampled token is thrown away.

The buffer is plain JSON (:meth:`AprilBuffer.state_dict`), checkpointed with the learner by the runtime, so a
partial rollout survives restarts. Knows nothing about tasks, rewards or prompt selection (``node.rollout.planner``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from node.rollout.engine import GeneratedCompletion, RolloutEngine, RolloutRequest

logger = logging.getLogger(__name__)

STATE_VERSION = 1
DONE_REASONS = ("stop", "length")


@dataclass
class PendingGroup:
    """One prompt's group in flight: ``n`` completion slots, each ``None`` (not started) or a completion that is
    finished (``stop``/``length``) or partial (``abort``)."""

    key: str
    """Identity of the prompt (a TaskRef key); two groups of one prompt may be in flight (uniform draws repeat)."""
    payload: dict[str, Any]
    """What the caller needs to rebuild the prompt's item (a TaskRef as a dict)."""
    prompt_ids: list[int]
    max_new_tokens: int
    completions: list[GeneratedCompletion | None]
    started_step: int = 0
    steps_in_flight: int = 0
    """Steps this group has been generated in (1 = completed in the step it started)."""

    @property
    def complete(self) -> bool:
        return all(c is not None and c.finish_reason in DONE_REASONS for c in self.completions)

    def request(self, slot: int) -> RolloutRequest:
        """The request that starts or continues completion ``slot``."""
        c = self.completions[slot]
        if c is None:
            return RolloutRequest(list(self.prompt_ids), self.max_new_tokens)
        versions = c.token_versions if c.token_versions is not None else [c.policy_version] * len(c.token_ids)
        return RolloutRequest(list(self.prompt_ids), self.max_new_tokens, list(c.token_ids), list(c.logprobs), versions)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "completions": [None if c is None else asdict(c) for c in self.completions]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PendingGroup:
        comps = [None if c is None else GeneratedCompletion(**c) for c in d["completions"]]
        return cls(**{**d, "completions": comps})


@dataclass
class AprilBuffer:
    """Partial groups waiting to be continued, oldest first."""

    groups: list[PendingGroup] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.groups)

    def keys(self) -> set[str]:
        return {g.key for g in self.groups}

    def partial_tokens(self) -> int:
        """Tokens already sampled and held in the buffer."""
        return sum(len(c.token_ids) for g in self.groups for c in g.completions if c is not None)

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "groups": [g.to_dict() for g in self.groups]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"APRIL buffer state version {state.get('version')!r} is not {STATE_VERSION}")
        self.groups = [PendingGroup.from_dict(g) for g in state["groups"]]


def groups_in_flight(target: int, oversample: float) -> int:
    """``ceil(oversample * target)``: groups asked for per step (never fewer than ``target``)."""
    return max(target, math.ceil(oversample * target - 1e-9))


@dataclass
class AprilStats:
    """What one APRIL round did (for metrics)."""

    completed: int = 0
    in_flight: int = 0
    new_tokens: int = 0
    offpolicy_tokens: int = 0
    completed_tokens: int = 0
    continued_groups: int = 0
    stopped_early: bool = False

    def metrics(self, buffer: AprilBuffer) -> dict[str, float]:
        share = self.offpolicy_tokens / self.completed_tokens if self.completed_tokens else 0.0
        return {
            "april_completed_groups": float(self.completed),
            "april_in_flight_groups": float(self.in_flight),
            "april_continued_groups": float(self.continued_groups),
            "april_new_tokens": float(self.new_tokens),
            "april_offpolicy_token_share": share,
            "april_buffer_groups": float(len(buffer)),
            "april_buffer_tokens": float(buffer.partial_tokens()),
            "april_stopped_early": float(self.stopped_early),
        }


def run_round(
    engine: RolloutEngine,
    groups: list[PendingGroup],
    target: int,
    *,
    temperature: float,
    top_p: float,
    seed: int | None,
    early_stop: bool = True,
) -> tuple[list[PendingGroup], list[PendingGroup], AprilStats]:
    """Generate for ``groups`` until ``target`` of them are complete (all of them with ``early_stop=False``).

    Returns ``(complete, incomplete, stats)``; both lists keep the input order, and every group comes back in
    exactly one of them with all its tokens so far. The engine's ``policy_version`` tags the new tokens."""
    slots = [(gi, si) for gi, g in enumerate(groups) for si, c in enumerate(g.completions) if not _done(c)]
    requests = [groups[gi].request(si) for gi, si in slots]
    before = sum(len(r.token_ids) for r in requests)
    open_slots = [0] * len(groups)  # unfinished completions per group
    for gi, _ in slots:
        open_slots[gi] += 1
    already = sum(1 for n in open_slots if n == 0)

    def should_stop(finished: Any) -> bool:
        remaining = list(open_slots)
        for (gi, _), f in zip(slots, finished, strict=True):
            if f:
                remaining[gi] -= 1
        return sum(1 for n in remaining if n == 0) >= target

    stats = AprilStats(in_flight=len(groups), continued_groups=sum(1 for g in groups if g.steps_in_flight > 0))
    if requests and already < target:
        outs = engine.generate_requests(
            requests, temperature=temperature, top_p=top_p, seed=seed, should_stop=should_stop if early_stop else None
        )
        for (gi, si), c in zip(slots, outs, strict=True):
            groups[gi].completions[si] = c
        stats.new_tokens = sum(len(c.token_ids) for c in outs) - before
        stats.stopped_early = any(c.finish_reason == "abort" for c in outs)
    for g in groups:
        g.steps_in_flight += 1
    complete = [g for g in groups if g.complete]
    incomplete = [g for g in groups if not g.complete]
    version = engine.policy_version
    for g in complete:
        for done in g.completions:
            assert done is not None
            versions = done.token_versions or [done.policy_version] * len(done.token_ids)
            stats.completed_tokens += len(versions)
            stats.offpolicy_tokens += sum(1 for v in versions if v < version)
    stats.completed = len(complete)
    return complete, incomplete, stats


def _done(c: GeneratedCompletion | None) -> bool:
    return c is not None and c.finish_reason in DONE_REASONS
