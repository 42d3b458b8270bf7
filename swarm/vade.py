"""VADE prompt selection and DART rollout counts: per-prompt Beta posteriors over the success probability.

**VADE** (variance-aware dynamic sampling, arXiv 2511.18902). Every prompt ``x`` has a posterior
``Beta(a_x, b_x)`` over its success probability, starting at the prior ``Beta(a0, b0)``. After ``n`` rollouts of
``x`` with ``k`` successes (``k`` may be fractional: the sum of rewards in [0, 1])::

    a_x <- lam * a_x + (1 - lam) * a0 + k
    b_x <- lam * b_x + (1 - lam) * b0 + (n - k)

``lam`` in [0, 1] forgets old evidence at every update (the policy moves, so old outcomes say less). A prompt not
updated for more than ``stale_steps`` steps also drifts back toward the prior, by ``gamma`` per further step::

    a_x(t) = a0 + (a_x - a0) * gamma ** max(0, t - t_x - stale_steps)      (the same for b)

(applied lazily when the posterior is read, so untouched prompts cost nothing). To pick ``B`` prompts out of a
candidate set, draw ``p_x ~ Beta(a_x(t), b_x(t))`` for each (Thompson sampling) and keep the top ``B`` by an
information score of ``p_x`` -- by default ``p (1 - p)``, the variance of a Bernoulli reward, which is largest
where a group of rollouts is most likely to have non-zero advantage. Scores are pluggable (:data:`SCORES`). The
paper's exact formulas were not public; this is the form this project chose.

**DART** dynamic rollout number: a prompt with success rate ``s`` gets ``n = G`` rollouts if ``s < 0.6``, else
``max(n_min, floor(9 / s - 7))`` (never more than ``G``): easy prompts need fewer samples to find a failure.

The state is plain JSON (:meth:`VadeSelector.state_dict`), so it rides in the node's checkpoint. Model-free: no
torch, no tasks; prompts are opaque string keys (a :class:`~protocol.types.TaskRef`'s ``key()``) with an optional
JSON payload (the ref itself, so tracked prompts can be drawn again after a restart).
"""

from __future__ import annotations

import logging
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

STATE_VERSION = 1

#: Information scores of a sampled success probability ``p``; larger = more informative to train on.
SCORES: dict[str, Callable[[float], float]] = {
    "variance": lambda p: p * (1.0 - p),
    "entropy": lambda p: 0.0 if p <= 0.0 or p >= 1.0 else -(p * math.log(p) + (1.0 - p) * math.log(1.0 - p)),
    "near_half": lambda p: -abs(p - 0.5),
}


def register_score(name: str, fn: Callable[[float], float]) -> None:
    """Add an information score selectable by name (``vade.score``)."""
    SCORES[name] = fn


def dart_rollouts(success_rate: float, group_size: int, min_rollouts: int = 2) -> int:
    """DART's rollout count: ``G`` if ``s < 0.6`` else ``max(n_min, floor(9 / s - 7))``, capped at ``G``.

    At ``s = 0.6`` the formula gives 8 (the paper's G), at ``s = 1`` it gives 2. ``s`` is clamped to [0, 1]."""
    if group_size < 1 or min_rollouts < 1:
        raise ValueError("group_size and min_rollouts must be at least 1")
    s = min(1.0, max(0.0, float(success_rate)))
    if s < 0.6:
        return group_size
    return min(group_size, max(min_rollouts, math.floor(9.0 / s - 7.0 + 1e-9)))


def beta_update(a: float, b: float, k: float, n: float, *, a0: float, b0: float, lam: float) -> tuple[float, float]:
    """One VADE update after ``n`` rollouts with ``k`` successes (see the module docstring)."""
    if not 0.0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    return lam * a + (1.0 - lam) * a0 + k, lam * b + (1.0 - lam) * b0 + (n - k)


def global_decay(value: float, prior: float, idle_steps: int, *, stale_steps: int, gamma: float) -> float:
    """``prior + (value - prior) * gamma ** max(0, idle_steps - stale_steps)``: the drift back to the prior."""
    extra = max(0, idle_steps - stale_steps)
    return value if extra == 0 else prior + (value - prior) * gamma**extra


@dataclass
class Posterior:
    """One prompt's Beta posterior, the step it was last updated at, and the payload to redraw it (a ref)."""

    a: float
    b: float
    step: int
    payload: Any = None


class VadeSelector:
    """Per-prompt Beta posteriors, Thompson sampling and top-B selection (see the module docstring).

    At most ``max_tracked`` prompts are kept (the least recently updated is forgotten first, i.e. back to the prior).
    """

    def __init__(
        self,
        *,
        prior_a: float = 1.0,
        prior_b: float = 1.0,
        lam: float = 0.9,
        gamma: float = 0.99,
        stale_steps: int = 20,
        score: str = "variance",
        max_tracked: int = 100_000,
    ) -> None:
        if prior_a <= 0 or prior_b <= 0 or not 0 <= lam <= 1 or not 0 <= gamma <= 1 or stale_steps < 0:
            raise ValueError("need prior_a, prior_b > 0, lam and gamma in [0, 1], stale_steps >= 0")
        if score not in SCORES:
            raise ValueError(f"unknown VADE score {score!r}; known: {sorted(SCORES)}")
        self.a0, self.b0, self.lam, self.gamma, self.stale_steps = prior_a, prior_b, lam, gamma, stale_steps
        self.score_name = score
        self.max_tracked = max_tracked
        self.posteriors: OrderedDict[str, Posterior] = OrderedDict()

    # ---------------------------------------------------------------- reading
    def posterior(self, key: str, step: int) -> tuple[float, float]:
        """``(a, b)`` of ``key`` at ``step``, the global decay applied; the prior for an unknown prompt."""
        p = self.posteriors.get(key)
        if p is None:
            return self.a0, self.b0
        idle = step - p.step
        return (
            global_decay(p.a, self.a0, idle, stale_steps=self.stale_steps, gamma=self.gamma),
            global_decay(p.b, self.b0, idle, stale_steps=self.stale_steps, gamma=self.gamma),
        )

    def mean(self, key: str, step: int) -> float:
        """Posterior mean success probability ``a / (a + b)`` (DART's success rate)."""
        a, b = self.posterior(key, step)
        return a / (a + b)

    def tracked(self) -> list[tuple[str, Any]]:
        """``(key, payload)`` of every tracked prompt, least recently updated first."""
        return [(k, p.payload) for k, p in self.posteriors.items()]

    # ---------------------------------------------------------------- updating
    def update(self, key: str, successes: float, n: int, step: int, payload: Any = None) -> tuple[float, float]:
        """Fold ``successes`` out of ``n`` rollouts at ``step`` into ``key``'s posterior; returns the new ``(a, b)``.

        The global decay up to ``step`` is applied first, then the ``lam`` update."""
        if n <= 0:
            return self.posterior(key, step)
        k = min(float(n), max(0.0, float(successes)))
        a, b = self.posterior(key, step)
        a, b = beta_update(a, b, k, n, a0=self.a0, b0=self.b0, lam=self.lam)
        old = self.posteriors.pop(key, None)
        self.posteriors[key] = Posterior(a, b, step, payload if payload is not None else (old and old.payload))
        while len(self.posteriors) > self.max_tracked:
            self.posteriors.popitem(last=False)
        return a, b

    # ---------------------------------------------------------------- selecting
    def select(self, keys: Sequence[str], k: int, rng: random.Random, step: int) -> list[int]:
        """Indices of the ``k`` candidates with the highest information score of a Thompson sample.

        Duplicate keys are considered once. Ties keep candidate order. Deterministic given ``rng``."""
        score = SCORES[self.score_name]
        seen: set[str] = set()
        scored: list[tuple[float, int]] = []
        for i, key in enumerate(keys):
            if key in seen:
                continue
            seen.add(key)
            a, b = self.posterior(key, step)
            scored.append((score(rng.betavariate(a, b)), i))
        scored.sort(key=lambda t: (-t[0], t[1]))
        return [i for _, i in scored[:k]]

    # ---------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the prior and every posterior (with its payload)."""
        return {
            "version": STATE_VERSION,
            "prior": [self.a0, self.b0],
            "posteriors": [[k, p.a, p.b, p.step, p.payload] for k, p in self.posteriors.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (posteriors only; the hyper-parameters come from the config)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"VADE state version {state.get('version')!r} is not {STATE_VERSION}")
        self.posteriors = OrderedDict(
            (str(k), Posterior(float(a), float(b), int(t), payload)) for k, a, b, t, payload in state["posteriors"]
        )
