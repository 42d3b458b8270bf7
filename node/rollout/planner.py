"""The rollout planner: which prompts a node generates for, how many completions each, and APRIL's buffer.

It composes three optional features (each on/off in the node config) around the rollout engine:

* **VADE** prompt selection (``swarm.vade``): ``ceil(candidates * B)`` candidate refs -- part fresh from the task
  source, part revisits of tracked prompts -- and the top ``B`` by a Thompson-sampled information score;
* **DART** rollout counts: ``n = dart_rollouts(posterior mean, G)`` completions for each selected prompt;
* **APRIL** partial rollouts (``node.rollout.april``): buffered groups first, over-provisioned, stopped early.

The posteriors are updated from the node's own scored groups (:meth:`RolloutPlanner.observe`); the state (APRIL
buffer and posteriors) is one JSON blob the runtime puts in its checkpoint. The runtime calls its planner at two
points (``generate`` and ``observe``); with every feature off it is a :class:`UniformPlanner` (uniform prompts,
``G`` completions each, no state, no metrics). The planner owns the node's one generation path: the MNPO phase asks
it for rollouts (:meth:`UniformPlanner.rollout`), and the engine samples with the settings it was built with.

Imports torch (through ``node.rollout.april`` and the engine) only when APRIL is on, so the scripted simulator's VADE
runs stay light. Knows nothing about rewards' meaning, the swarm or the learner.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Collection, Sequence
from typing import Any, Protocol

from node.config import NodeConfig
from node.seams import EngineLike, Generation, PolicyLike, TasksLike
from node.tasks import TaskItem
from protocol.types import TaskRef
from swarm.pool import PooledGroup
from swarm.vade import VadeSelector, dart_rollouts

logger = logging.getLogger(__name__)


def planner_enabled(cfg: NodeConfig) -> bool:
    """Whether any feature the planner implements is switched on."""
    return cfg.april.enabled or cfg.vade.enabled or cfg.dart.enabled


class Planner(Protocol):
    """What the runtime asks of a planner each step, and what it checkpoints."""

    def generate(self, rng: random.Random, step: int) -> tuple[list[TaskItem], Sequence[Sequence[Generation]]]: ...
    def rollout(
        self, refs: list[TaskRef], n: int, rng: random.Random
    ) -> tuple[list[TaskItem], Sequence[Sequence[Generation]]]: ...
    def observe(self, own: list[PooledGroup], step: int) -> None: ...
    def metrics(self) -> dict[str, float]: ...
    def state_dict(self) -> dict[str, Any] | None: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class UniformPlanner:
    """The planner of a node with APRIL, VADE and DART off: ``prompts_per_step`` uniform prompts, ``G`` each.

    It owns the node's one generation path, prompt -> completions (:meth:`rollout`, :meth:`sample`): the runtime,
    the MNPO phase and :class:`RolloutPlanner` all come through here, and the engine samples with the settings it
    was built with."""

    def __init__(self, cfg: NodeConfig, tasks: TasksLike, engine: EngineLike, policy: PolicyLike) -> None:
        self.n, self.group_size = cfg.rollout.prompts_per_step, cfg.rollout.group_size
        self.tasks, self.engine, self.policy = tasks, engine, policy

    def sample(self, items: Sequence[TaskItem], n: int, seed: int) -> Sequence[Sequence[Generation]]:
        """``n`` completions for each item's formatted prompt: the one call into the engine for training rollouts."""
        return self.engine.generate([self.policy.format_prompt(it.question) for it in items], n, seed=seed)

    def rollout(
        self, refs: list[TaskRef], n: int, rng: random.Random
    ) -> tuple[list[TaskItem], Sequence[Sequence[Generation]]]:
        """Materialize ``refs`` and sample ``n`` completions each (seeded from ``rng``)."""
        items = [self.tasks.materialize(r) for r in refs]
        return items, self.sample(items, n, rng.randrange(2**31))

    def generate(self, rng: random.Random, step: int) -> tuple[list[TaskItem], Sequence[Sequence[Generation]]]:
        return self.rollout(self.tasks.sample(rng, self.n), self.group_size, rng)

    def observe(self, own: list[PooledGroup], step: int) -> None:
        return None

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class RolloutPlanner(UniformPlanner):
    """Prompt selection (uniform or VADE), rollout counts (G or DART) and generation (plain or APRIL)."""

    def __init__(self, cfg: NodeConfig, tasks: TasksLike, engine: EngineLike, policy: PolicyLike) -> None:
        super().__init__(cfg, tasks, engine, policy)
        self.cfg = cfg
        v = cfg.vade
        self.posteriors: VadeSelector | None = None
        if v.enabled or cfg.dart.enabled:
            self.posteriors = VadeSelector(
                prior_a=v.prior_a,
                prior_b=v.prior_b,
                lam=v.lam,
                gamma=v.gamma,
                stale_steps=v.stale_steps,
                score=v.score,
                max_tracked=v.max_tracked,
            )
        self.buffer: Any = None  # node.rollout.april.AprilBuffer when APRIL is on
        self._april_state: dict[str, Any] | None = None  # a checkpointed buffer kept as is while APRIL is off
        if cfg.april.enabled:
            from node.rollout.april import AprilBuffer

            self.buffer = AprilBuffer()
        self._metrics: dict[str, float] = {}
        self.totals = {"completed_groups": 0, "gen_s": 0.0}

    # ---------------------------------------------------------------- selection
    def select(self, rng: random.Random, k: int, step: int, exclude: Collection[str] = frozenset()) -> list[TaskRef]:
        """``k`` prompts: uniform from the task source, or VADE's top ``k`` of a candidate set."""
        if k <= 0:
            return []
        if not self.cfg.vade.enabled or self.posteriors is None:
            return self.tasks.sample(rng, k)
        m = math.ceil(self.cfg.vade.candidates * k)
        tracked = [p for key, p in self.posteriors.tracked() if key not in exclude and p is not None]
        revisits = []
        if tracked:
            n_rev = min(len(tracked), round(self.cfg.vade.revisit_fraction * m))
            for payload in rng.sample(tracked, n_rev):
                ref = TaskRef(**payload)
                if self.tasks.accepts(ref):
                    revisits.append(ref)
        cands = [r for r in [*revisits, *self.tasks.sample(rng, m - len(revisits))] if r.key() not in exclude]
        chosen = self.posteriors.select([r.key() for r in cands], k, rng, step)
        refs = [cands[i] for i in chosen]
        if len(refs) < k:  # duplicates among candidates: top up uniformly
            refs += self.tasks.sample(rng, k - len(refs))
        return refs

    def rollouts_for(self, ref: TaskRef, step: int) -> int:
        """G, or DART's count from the prompt's posterior mean success rate."""
        g = self.cfg.rollout.group_size
        if not self.cfg.dart.enabled or self.posteriors is None:
            return g
        return dart_rollouts(self.posteriors.mean(ref.key(), step), g, self.cfg.dart.min_rollouts)

    # ---------------------------------------------------------------- generation
    def generate(self, rng: random.Random, step: int) -> tuple[list[Any], list[list[Any]]]:
        """This step's complete groups: ``(items, completions per item)``, in a deterministic order."""
        rcfg = self.cfg.rollout
        t0 = time.perf_counter()
        if self.cfg.april.enabled:
            items, gens, stats = self._generate_april(rng, step)
            self._metrics = stats.metrics(self.buffer)
        else:
            refs = self.select(rng, rcfg.prompts_per_step, step)
            items = [self.tasks.materialize(r) for r in refs]
            counts = [self.rollouts_for(r, step) for r in refs]
            gens = self._generate_plain(items, counts, rng.randrange(2**31))
            self._metrics = {}
        dt = time.perf_counter() - t0
        self.totals["completed_groups"] += len(items)
        self.totals["gen_s"] += dt
        self._metrics.update(
            plan_groups=float(len(items)),
            plan_groups_per_s=len(items) / dt if dt > 0 else 0.0,
            plan_rollouts_mean=sum(len(g) for g in gens) / len(gens) if gens else 0.0,
        )
        return items, gens

    def _generate_plain(self, items: list[Any], counts: list[int], seed: int) -> list[list[Any]]:
        """One :meth:`sample` call per distinct rollout count (works with any engine)."""
        gens: list[list[Any]] = [[] for _ in items]
        for n in sorted(set(counts)):
            idx = [i for i, c in enumerate(counts) if c == n]
            out = self.sample([items[i] for i in idx], n, seed + n)
            for i, comps in zip(idx, out, strict=True):
                gens[i] = list(comps)
        return gens

    def _generate_april(self, rng: random.Random, step: int) -> tuple[list[Any], list[list[Any]], Any]:
        from node.rollout.april import PendingGroup, groups_in_flight, run_round

        settings, acfg = self.engine.settings, self.cfg.april
        target = self.cfg.rollout.prompts_per_step
        want = groups_in_flight(target, acfg.oversample)
        # partial groups of a family quarantined since (a faulty task plug-in) are dropped, not continued
        self.buffer.groups = [g for g in self.buffer.groups if self.tasks.accepts(TaskRef(**g.payload))]
        carried = self.buffer.groups[:want]  # oldest first
        kept = self.buffer.groups[want:]
        room = max(0, acfg.max_buffer_groups - len(kept))
        n_new = max(0, min(want - len(carried), room))
        if len(carried) + n_new < target:
            n_new = target - len(carried)
        refs = self.select(rng, n_new, step, exclude=self.buffer.keys())
        fresh = []
        for ref in refs:
            item = self.tasks.materialize(ref)
            fresh.append(
                PendingGroup(
                    key=ref.key(),
                    payload=ref.to_dict(),
                    prompt_ids=self.policy.encode(self.policy.format_prompt(item.question)),
                    max_new_tokens=settings.max_new_tokens,
                    completions=[None] * self.rollouts_for(ref, step),
                    started_step=step,
                )
            )
        engine: Any = self.engine  # APRIL continues partial completions: a RolloutEngine (generate_requests)
        complete, incomplete, stats = run_round(
            engine,
            carried + fresh,
            target,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=rng.randrange(2**31),
        )
        self.buffer.groups = incomplete + kept
        items = [self.tasks.materialize(TaskRef(**g.payload)) for g in complete]
        return items, [list(g.completions) for g in complete], stats

    # ---------------------------------------------------------------- feedback, state, metrics
    def observe(self, own: list[Any], step: int) -> None:
        """Fold this step's scored own groups (``PooledGroup``) into the prompts' posteriors."""
        if self.posteriors is None:
            return
        for g in own:
            ref = g.group.task
            self.posteriors.update(ref.key(), float(sum(g.rewards)), len(g.rewards), step, payload=ref.to_dict())
        if self.cfg.vade.enabled:
            self._metrics["vade_tracked"] = float(len(self.posteriors.posteriors))

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def state_dict(self) -> dict[str, Any]:
        """JSON: the APRIL buffer and the posteriors."""
        return {
            "april": self.buffer.state_dict() if self.buffer is not None else self._april_state,
            "posteriors": self.posteriors.state_dict() if self.posteriors is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("april") is not None:
            if self.buffer is not None:
                self.buffer.load_state_dict(state["april"])
            else:
                self._april_state = state["april"]
        if self.posteriors is not None and state.get("posteriors") is not None:
            self.posteriors.load_state_dict(state["posteriors"])
