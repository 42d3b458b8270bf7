"""SAPO: Swarm sAmpling Policy Optimization (Amico et al., arXiv 2509.08721), the sampling half.

Each learner step a node trains on I of its own groups plus J groups drawn uniformly from peers' groups.
Peers' groups enter the pool only after the receiver has regenerated each question and gold answer from the
group's TaskRef and scored every completion with its own verifier (:func:`ingest_rollouts`); the sender's
reward hint is ignored. Groups whose rewards are all equal carry zero advantage and are dropped before
sampling. A per-peer cap keeps any single peer (honest or not) from filling a batch.

This module knows nothing about models or tokenizers: turning the sampled text into training tensors
(re-tokenizing with the local tokenizer, logprobs under the local policy) is the node's job.
"""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.errors import SwarmError
from protocol.types import Envelope, RolloutBatch, TaskRef
from swarm.pool import SOLVED, PooledGroup, RolloutPool, any_solved, solve_share

logger = logging.getLogger(__name__)

#: Regenerates the task behind ``TaskRef`` and scores each completion text with the local verifier.
#: Raises :class:`SwarmError` for a task this node will not regenerate (unknown family, foreign config).
Scorer = Callable[[TaskRef, Sequence[str]], list[float]]


def group_key(sender: str, seq: int, index: int) -> str:
    """Swarm-wide id of the ``index``-th group of record ``(sender, seq)``."""
    return f"{sender}:{seq}:{index}"


def ingest_rollouts(
    pool: RolloutPool,
    envelope: Envelope,
    scorer: Scorer,
    step: int,
    *,
    min_completions: int = 2,
    max_completions: int = 256,
    receiver: bool = False,
) -> Counter[str]:
    """Re-score a validated peer record's groups locally and add them to the pool.

    Returns outcome counts: ``accepted``, ``duplicate``, ``bad_group_size``, ``task_rejected`` (the scorer
    refused the TaskRef; a :class:`SwarmError` with a ``reason`` attribute is counted under that reason instead, e.g.
    ``task_version``, ``task_unknown``, ``plugin_timeout``), ``score_error`` (anything else the scorer raised),
    ``zero_advantage`` (all local rewards equal, e.g. forged rewards on wrong answers; with ``receiver``, no
    completion solved: nothing a receiver-credited learner would train on). Never raises: a peer's data cannot
    crash the node.
    """
    counts: Counter[str] = Counter()
    batch = envelope.payload
    if not isinstance(batch, RolloutBatch):
        counts["wrong_kind"] += 1
        return counts
    for index, group in enumerate(batch.groups):
        key = group_key(envelope.sender, envelope.seq, index)
        if key in pool:
            counts["duplicate"] += 1
            continue
        n = len(group.completions)
        if not min_completions <= n <= max_completions:
            counts["bad_group_size"] += 1
            continue
        try:
            rewards = scorer(group.task, [c.text for c in group.completions])
        except SwarmError as e:
            logger.debug("dropping group %s from %s: %s", index, envelope.sender, e)
            reason = getattr(e, "reason", "task_rejected")
            counts[reason if isinstance(reason, str) and reason.isidentifier() else "task_rejected"] += 1
            continue
        except Exception as e:  # a verifier crashing on hostile text must not take the node down
            logger.debug("scorer failed on group %s from %s: %r", index, envelope.sender, e)
            counts["score_error"] += 1
            continue
        if len(rewards) != n or not all(isinstance(r, float | int) and math.isfinite(r) for r in rewards):
            counts["score_error"] += 1
            continue
        if not (any_solved(rewards) if receiver else len(set(rewards)) >= 2):
            # Nothing to learn (honest senders publish informative groups only): refusing it here keeps a
            # validly signed flood of wrong answers from evicting honest groups out of the bounded pool.
            counts["zero_advantage"] += 1
            continue
        added = pool.add(
            PooledGroup(
                key=key,
                source=envelope.sender,
                group=group,
                rewards=tuple(float(r) for r in rewards),
                step=step,
                policy_version=batch.policy_version,
                tokenizer=batch.tokenizer,
            )
        )
        counts["accepted" if added else "duplicate"] += 1
    return counts


class SolveRates:
    """A receiver's own solve rate per task family, the baseline of ``sapo.peer_advantage: receiver``.

    GRPO credits a completion against the other completions of its group, that is, against the *sender's* skill. A
    stronger peer's group that is all right carries nothing that way (its senders do not even publish it), and
    the right and wrong answers of a group with a spread share most of their tokens (94% of the characters in B10),
    so their gradients cancel there. What a receiver can learn from a peer's right answer depends on how often the
    receiver gets that kind of task right itself. So a peer completion the receiver's verifier scores 1.0 is
    credited ``1 - b``, ``b`` the share of the receiver's own recent completions on that family scored 1.0 (an
    exponential moving average over its own groups, ``decay`` per group; 0 before its first group), and every other
    peer completion 0: a weaker peer's wrong answers never push the receiver's policy, and a peer's right answer on
    a family the receiver has mastered teaches nothing.

    ``stronger_only`` (``sapo.peer_groups: stronger``) also leaves out a peer group whose share of solved
    completions is not above ``b``: the receiver then learns only from peers that solve the family more often than it
    does itself. Without it a strong node trains on weaker peers' right answers: each is right, but sampled from a
    policy that solves the family less often than its own (in B10, over 3 seeds, the strong node's held-out level was
    the same with them as alone).
    """

    def __init__(self, decay: float = 0.95, *, stronger_only: bool = False) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError("decay must be in [0, 1)")
        self.decay = decay
        self.stronger_only = stronger_only
        self._rates: dict[str, float] = {}

    def update(self, groups: Sequence[PooledGroup]) -> None:
        """Fold in this step's own groups (peers' are skipped)."""
        for g in groups:
            if not g.local or not g.rewards:
                continue
            solved = solve_share(g.rewards)
            family = g.group.task.family
            old = self._rates.get(family)
            self._rates[family] = solved if old is None else self.decay * old + (1.0 - self.decay) * solved

    def rate(self, family: str) -> float:
        """``b``: this node's own recent solve rate on ``family`` (0 before it generated any)."""
        return self._rates.get(family, 0.0)

    def advantages(self, group: PooledGroup) -> list[float]:
        """A peer group's advantages for this receiver: ``1 - b`` for each solved completion, else 0."""
        credit = 1.0 - self.rate(group.group.task.family)
        return [credit if r >= SOLVED else 0.0 for r in group.rewards]

    def teaches(self, group: PooledGroup) -> bool:
        """Whether a peer group is a candidate: one completion solved, and with ``stronger_only`` a share of solved
        completions above this node's own rate ``b`` on the family."""
        if self.stronger_only:  # b >= 0, so a share above it has a solved completion
            return solve_share(group.rewards) > self.rate(group.group.task.family)
        return any_solved(group.rewards)

    def metrics(self) -> dict[str, float]:
        return {f"receiver_baseline_{family}": round(rate, 4) for family, rate in sorted(self._rates.items())}


@dataclass
class SapoBatch:
    """The groups one learner step trains on, and what was left out."""

    local: list[PooledGroup] = field(default_factory=list)
    external: list[PooledGroup] = field(default_factory=list)
    #: ``sapo.trace_groups``: peers' groups taken for the trace step only (their verified-right completions), not
    #: trained by RL (:meth:`SapoSampler.choose_traces`).
    traces: list[PooledGroup] = field(default_factory=list)
    dropped_local_zero_adv: int = 0
    external_candidates: int = 0
    external_newcomer: int = 0
    newcomer_credit: float = 0.0
    newcomer_refill: bool = False
    step: int = 0

    def _reward_mean(self, groups: list[PooledGroup]) -> float:
        rewards = [r for g in groups for r in g.rewards]
        return math.fsum(rewards) / len(rewards) if rewards else 0.0

    @property
    def groups(self) -> list[PooledGroup]:
        return self.local + self.external

    def metrics(self) -> dict[str, Any]:
        if self.traces:  # only where sapo.trace_groups is on: a node without it logs what it always did
            return {
                **self._metrics(),
                "trace_groups": len(self.traces),
                "trace_groups_by_sender": dict(Counter(g.source for g in self.traces)),
            }
        return self._metrics()

    def _metrics(self) -> dict[str, Any]:
        return {
            "local_groups": len(self.local),
            "external_groups": len(self.external),
            "external_sources": len({g.source for g in self.external}),
            # who the peers' groups trained on came from (at most J senders a step): an operator, or a test, can
            # then tell an honest peer's share of the external data from a sybil flood's
            "external_by_sender": dict(Counter(g.source for g in self.external)),
            # and which task families (the refs' ``family``: ``name`` or ``name@version``) they were on
            "external_by_family": dict(Counter(g.group.task.family for g in self.external)),
            "dropped_zero_adv": self.dropped_local_zero_adv,
            "external_candidates": self.external_candidates,
            "external_newcomer": self.external_newcomer,
            "newcomer_credit": self.newcomer_credit,
            "newcomer_refill": int(self.newcomer_refill),
            # The reward of what the learner trains on (own groups kept plus peers' groups, re-scored here): the
            # SAPO paper's plotted reward is probably this one. It is not the node's own skill (reward_mean is).
            "batch_reward_mean": self._reward_mean(self.groups),
            "external_reward_mean": self._reward_mean(self.external),
            "external_age_mean": (
                math.fsum(self.step - g.step for g in self.external) / len(self.external) if self.external else 0.0
            ),
        }


class SapoSampler:
    """Draws I local + J external informative groups per step.

    * local: this step's own groups with nonzero advantage, up to I (uniformly if more);
    * external: peers' informative groups not yet trained on, fresh per the pool's age limit, drawn
      uniformly without replacement, at most ``max_per_peer`` from one sender (default ceil(J/2));
    * ``fill_local``: when peers supply fewer than J groups, use more of this step's own informative
      groups instead, so a node alone keeps its batch size (it is then a plain single-node trainer);
    * sybil budget: groups from *newcomers* -- senders that have not yet contributed informative groups at
      ``establish_steps`` distinct steps of ours -- take at most ``s = max(1, floor(J * newcomer_share))`` slots a
      step, shared by all newcomers, and only as far as a credit allows: the credit starts at ``s``, never exceeds
      it, pays one per newcomer group trained and earns ``newcomer_share / (1 - newcomer_share)`` per established
      sender's group trained. So over *any* run of steps in which the node hears an established sender, newcomers get
      at most ``s + rho * E`` groups (``E`` the established senders' groups, ``rho`` that ratio), not only ``s`` a
      step: a step in which honest peers supply few groups no longer hands the flood a larger share. The other slots
      go to established senders only. Minting identities is free, so a flood of throwaway identities competes for
      the newcomer slots alone (threat model: ``protocol/SPEC.md`` 11);
    * quiet swarm: at a step where no established sender contributed an informative group within the pool's
      ``max_age_steps``, the credit refills to ``s``. There is then no established peer whose share the credit
      protects, and without the refill a node whose peers all publish rarely (slow real-model nodes beside a fast
      one) would train on one newcomer group and then never again, since nobody becomes established;
    * ``useful``: which peers' groups are candidates (default: informative ones; a receiver-credited learner
      passes :meth:`SolveRates.teaches`);
    * ``keep_zero_advantage``: own groups are not filtered (zero-advantage ones fill the local slots after the
      informative ones), as in a plain GRPO trainer; they add no gradient but dilute the token-mean loss.
    """

    def __init__(
        self,
        local_groups: int,
        external_groups: int,
        *,
        max_per_peer: int | None = None,
        fill_local: bool = True,
        seed: int = 0,
        newcomer_share: float = 0.25,
        establish_steps: int = 3,
        keep_zero_advantage: bool = False,
        useful: Callable[[PooledGroup], bool] | None = None,
    ) -> None:
        if local_groups < 0 or external_groups < 0 or local_groups + external_groups == 0:
            raise ValueError("need local_groups + external_groups >= 1, both non-negative")
        self.local_groups = local_groups
        self.external_groups = external_groups
        self.max_per_peer = max_per_peer if max_per_peer is not None else max(1, math.ceil(external_groups / 2))
        #: :meth:`choose_traces`' cap on one sender (None: half the step's trace groups, rounded up).
        self.max_traces_per_peer = max_per_peer
        self.fill_local = fill_local
        self.rng = random.Random(seed)
        #: :meth:`choose_traces`' own stream, so taking trace groups leaves the RL draws as they were.
        self.trace_rng = random.Random(f"traces:{seed}")
        if not 0.0 <= newcomer_share <= 1.0 or establish_steps < 0:
            raise ValueError("newcomer_share must be in [0, 1] and establish_steps >= 0")
        self.newcomer_share = newcomer_share
        self.establish_steps = establish_steps
        self.keep_zero_advantage = keep_zero_advantage
        #: Which peers' groups may fill the external slots: informative ones (GRPO credit), or, for a
        #: receiver-credited learner, those with a solved completion (:meth:`SolveRates.teaches`).
        self.useful: Callable[[PooledGroup], bool] = useful or (lambda g: g.informative)
        # At least one slot while the share is positive: with a small J the floor would be 0, and a new honest peer
        # (one whose records all arrived in one poll, say) could then never be trained on.
        slots = math.floor(external_groups * newcomer_share)
        if newcomer_share > 0 and external_groups > 0:
            slots = max(1, slots)
        #: Newcomer slots a step (SPEC 11's ``s``).
        self.newcomer_slots = slots
        #: Newcomer groups earned per established sender's group trained (``sigma / (1 - sigma)``; None: unbounded).
        self.newcomer_rate = newcomer_share / (1.0 - newcomer_share) if newcomer_share < 1.0 else None
        #: The newcomer credit: at most ``newcomer_slots``, spent one per newcomer group trained.
        self.newcomer_credit = float(slots)

    def sample(
        self,
        pool: RolloutPool,
        step: int,
        own: Sequence[PooledGroup],
        *,
        chosen: SapoBatch | None = None,
        pinned: Sequence[PooledGroup] = (),
    ) -> SapoBatch:
        """Choose the step's training groups; marks chosen external groups as used.

        ``chosen``: the externals were already drawn this step (:meth:`choose_external`, a guided node picks them
        before it generates, to roll out on their prompts); ``pinned``: own groups that train whatever their rewards
        (a guided node's groups on those prompts: with the peer's right completions they have a spread). Both count
        against the batch as the externals and locals they are; ``own`` holds the other own groups."""
        informative = [g for g in own if g.informative]
        self.rng.shuffle(informative)  # before the externals' draw: one random stream, in the order it always had
        batch = chosen if chosen is not None else self.choose_external(pool, step)
        batch.dropped_local_zero_adv = len(own) - len(informative)
        if self.keep_zero_advantage:  # the unfiltered baseline: own groups train whatever their rewards
            batch.dropped_local_zero_adv = 0
            informative = informative + [g for g in own if not g.informative]

        n_local = self.local_groups
        if self.fill_local:
            n_local += self.external_groups - len(batch.external)
        batch.local = list(pinned) + informative[:n_local]
        for g in batch.local:
            g.uses += 1
        return batch

    def choose_external(self, pool: RolloutPool, step: int) -> SapoBatch:
        """Draw this step's peers' groups (every bound applies: freshness, ``max_per_peer``, the sybil budget) into
        a new batch, marking them used; its locals are still to be chosen (:meth:`sample`)."""
        batch = SapoBatch(step=step)
        candidates = [g for g in pool.fresh(step, local=False, unused_only=True) if self.useful(g)]
        batch.external_candidates = len(candidates)
        self.rng.shuffle(candidates)
        newcomers = [g for g in candidates if pool.active_steps(g.source) < self.establish_steps]
        established = [g for g in candidates if pool.active_steps(g.source) >= self.establish_steps]
        per_peer: Counter[str] = Counter()

        def take(groups: list[PooledGroup], limit: int) -> int:
            taken = 0
            for g in groups:
                if taken >= limit or len(batch.external) >= self.external_groups:
                    break
                if per_peer[g.source] >= self.max_per_peer:
                    continue
                per_peer[g.source] += 1
                batch.external.append(g)
                taken += 1
            return taken

        slots = self.newcomer_slots
        if self.newcomer_rate is not None and not pool.hears_established(step, self.establish_steps):
            self.newcomer_credit = float(slots)
            batch.newcomer_refill = True
        if self.newcomer_rate is not None:
            slots = min(slots, math.floor(self.newcomer_credit + 1e-9))
        batch.external_newcomer = take(newcomers, slots)
        trained_established = take(established, self.external_groups)
        if self.newcomer_rate is not None:
            earned = self.newcomer_rate * trained_established
            self.newcomer_credit = min(
                float(self.newcomer_slots), self.newcomer_credit - batch.external_newcomer + earned
            )
        batch.newcomer_credit = self.newcomer_credit
        for g in batch.external:
            g.uses += 1
        return batch

    def choose_traces(
        self, pool: RolloutPool, step: int, batch: SapoBatch, limit: int, families: Collection[str] = ()
    ) -> None:
        """``sapo.trace_groups``: up to ``limit`` more peers' groups into ``batch.traces``, for the trace step only
        (their completions this node's verifier scored right; no RL row, so no rollout of this node on their
        prompts). Drawn after :meth:`choose_external` from the fresh unused groups that hold a solved completion,
        uniformly (its own random stream: the RL draws stay what they were), at most ``max_per_peer`` from one
        sender (left unset: half of ``limit``, rounded up, so no single peer fills them), and from **established**
        senders only: a newcomer's groups wait for the RL slots and their sybil budget, so minting identities buys
        no trace. Marked used, like every group trained on. ``families`` (``sapo.trace_families``; empty: all)
        keeps the groups of those task families only."""
        if limit <= 0:
            return
        candidates = [
            g
            for g in pool.fresh(step, local=False, unused_only=True)
            if any_solved(g.rewards)
            and pool.active_steps(g.source) >= self.establish_steps
            and (not families or g.group.task.family in families)
        ]
        self.trace_rng.shuffle(candidates)
        cap = self.max_traces_per_peer if self.max_traces_per_peer is not None else math.ceil(limit / 2)
        per_peer: Counter[str] = Counter()
        for g in candidates:
            if len(batch.traces) >= limit:
                break
            if per_peer[g.source] >= cap:
                continue
            per_peer[g.source] += 1
            batch.traces.append(g)
            g.uses += 1
