"""The rollout pool: a bounded store of own and peers' groups, each with its source, age and local rewards.

Every group in the pool has already been scored by *this* node (peers' reward hints are never stored as
rewards). The pool knows nothing about models, tokenizers or transports: it holds text, numbers and ids,
and answers "which groups may I train on now" for the SAPO sampler.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from protocol.types import Group

logger = logging.getLogger(__name__)

#: The ``source`` of groups this node generated itself.
SELF = "self"
#: A completion the verifier gave the full score (1.0) is *solved*; the tolerance absorbs float round-off.
SOLVED = 1.0 - 1e-9


def any_solved(rewards: Iterable[float]) -> bool:
    """Whether some completion got the full score (:data:`SOLVED`)."""
    return any(r >= SOLVED for r in rewards)


def solve_share(rewards: Sequence[float]) -> float:
    """The share of completions that got the full score (0 for none)."""
    return sum(1 for r in rewards if r >= SOLVED) / len(rewards) if rewards else 0.0


def _spread(rewards: tuple[float, ...]) -> float:
    return max(rewards) - min(rewards) if rewards else 0.0


@dataclass
class PooledGroup:
    """One group as the pool keeps it.

    ``key`` identifies the group across the swarm (sender, sequence number, index in the record) so the
    same group delivered twice is stored once. ``rewards`` are this node's own verifier scores, one per
    completion. ``step`` is this node's learner step when the group arrived (its age is measured in our
    steps, so a slow node does not see fast peers' data as instantly stale).
    """

    key: str
    source: str
    group: Group
    rewards: tuple[float, ...]
    step: int
    policy_version: int = 0
    tokenizer: str = ""
    uses: int = 0

    @property
    def local(self) -> bool:
        return self.source == SELF

    @property
    def informative(self) -> bool:
        """False when all rewards are equal: the group has zero advantage and teaches nothing."""
        return len(self.rewards) >= 2 and _spread(self.rewards) > 1e-9

    @property
    def solved(self) -> bool:
        """Every completion got the full score: no spread, so nothing for GRPO, but a receiver that does not solve
        the task itself learns from it (``sapo.peer_advantage: receiver``, :class:`swarm.sapo.SolveRates`)."""
        return bool(self.rewards) and min(self.rewards) >= SOLVED

    @property
    def reward_mean(self) -> float:
        return math.fsum(self.rewards) / len(self.rewards) if self.rewards else 0.0


def rollout_stats(groups: list[PooledGroup]) -> dict[str, float]:
    """Reward spread and completion lengths of a step's own groups, as TRL's GRPOTrainer logs them per step.

    ``reward_std`` is the sample standard deviation over all completions (Bessel-corrected, as TRL's ``nanstd``);
    ``frac_reward_zero_std``: share of groups whose rewards are all equal (no advantage); lengths in tokens;
    ``completion_clipped_frac``: share of completions cut at the token budget (``finish_reason == "length"``).
    """
    rewards = [r for g in groups for r in g.rewards]
    comps = [c for g in groups for c in g.group.completions]
    if not rewards or not comps:
        return {}
    mean = math.fsum(rewards) / len(rewards)
    var = math.fsum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1) if len(rewards) > 1 else 0.0
    lengths = [c.n_tokens for c in comps]
    return {
        "reward_std": math.sqrt(var),
        "frac_reward_zero_std": sum(1 for g in groups if not g.informative) / len(groups),
        "completion_len_mean": math.fsum(lengths) / len(lengths),
        "completion_len_min": float(min(lengths)),
        "completion_len_max": float(max(lengths)),
        "completion_clipped_frac": sum(1 for c in comps if c.finish_reason == "length") / len(comps),
    }


class RolloutPool:
    """Bounded FIFO of groups keyed by swarm-wide id; the oldest group is evicted first.

    Memory is bounded by ``capacity`` groups (a group is a few KB of text). Re-adding a known key is a no-op
    and returns False, so duplicated or replayed deliveries cannot inflate a peer's share.
    """

    def __init__(self, capacity: int, max_age_steps: int, *, protect_steps: int = 3) -> None:
        if capacity < 1 or max_age_steps < 1:
            raise ValueError("capacity and max_age_steps must be positive")
        self.capacity = capacity
        self.max_age_steps = max_age_steps
        self._groups: OrderedDict[str, PooledGroup] = OrderedDict()
        self.evicted = 0
        # source -> [distinct steps it contributed an informative group at, last such step], ordered by last
        # contribution (steps never go down); LRU-bounded so a sybil flood of throwaway identities cannot grow it
        # without bound. Eviction takes the least recent source with fewer than ``protect_steps`` steps first (within
        # the oldest ``_evict_scan``), so a flood of fresh identities cannot push an established peer out of the
        # table and make it a newcomer again.
        self._sources: OrderedDict[str, list[int]] = OrderedDict()
        self.max_sources = 8192
        self.protect_steps = protect_steps
        self._evict_scan = 256

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, key: str) -> bool:
        return key in self._groups

    def __iter__(self) -> Iterator[PooledGroup]:
        return iter(self._groups.values())

    def add(self, item: PooledGroup) -> bool:
        """Store ``item`` unless its key is known; evict the oldest groups beyond capacity."""
        if item.key in self._groups:
            return False
        self._groups[item.key] = item
        if not item.local and (item.informative or item.solved):
            stats = self._sources.pop(item.source, None) or [0, -1]
            if stats[1] != item.step:
                stats[0] += 1
                stats[1] = item.step
            self._sources[item.source] = stats
            while len(self._sources) > self.max_sources:
                self._evict_source()
        while len(self._groups) > self.capacity:
            self._groups.popitem(last=False)
            self.evicted += 1
        return True

    def _evict_source(self) -> None:
        for i, (source, (count, _)) in enumerate(self._sources.items()):
            if count < self.protect_steps:
                del self._sources[source]
                return
            if i >= self._evict_scan:
                break
        self._sources.popitem(last=False)  # the oldest, established or not: the table is full of established ones

    def fresh(self, step: int, *, local: bool | None = None, unused_only: bool = False) -> list[PooledGroup]:
        """Groups no older than ``max_age_steps`` at ``step``; filter by origin and by whether already trained on."""
        out = []
        for g in self._groups.values():
            if step - g.step > self.max_age_steps:
                continue
            if local is not None and g.local != local:
                continue
            if unused_only and g.uses:
                continue
            out.append(g)
        return out

    def active_steps(self, source: str) -> int:
        """Distinct steps of ours at which ``source`` contributed an informative (re-scored) group."""
        stats = self._sources.get(source)
        return stats[0] if stats is not None else 0

    def hears_established(self, step: int, min_steps: int) -> bool:
        """Whether a source established at ``min_steps`` distinct steps contributed an informative group within the
        last ``max_age_steps`` steps (SPEC 11's "hears an established sender"). The LRU table is ordered by last
        contribution, so this reads only the recent end of it."""
        for count, last in reversed(self._sources.values()):
            if step - last > self.max_age_steps:
                return False
            if count >= min_steps:
                return True
        return False

    def trusted(self, n: int, step: int) -> list[str]:
        """Up to ``n`` sources ranked by how many steps they contributed useful groups at, among those that did
        within ``max_age_steps`` (the peers worth following)."""
        recent = [(v[0], v[1], s) for s, v in self._sources.items() if step - v[1] <= self.max_age_steps]
        recent.sort(reverse=True)
        return [s for _, _, s in recent[:n]]

    def prune(self, step: int) -> int:
        """Drop groups too old to be sampled again; returns how many were dropped."""
        stale = [k for k, g in self._groups.items() if step - g.step > self.max_age_steps]
        for k in stale:
            del self._groups[k]
        return len(stale)

    def stats(self, step: int) -> dict[str, int]:
        """Counts for metrics: total, local, external, external peers present."""
        fresh = self.fresh(step)
        ext = [g for g in fresh if not g.local]
        return {
            "pool_groups": len(self._groups),
            "pool_local": len(fresh) - len(ext),
            "pool_external": len(ext),
            "pool_sources": len({g.source for g in ext}),
        }
