"""The node runtime: one node's loop of generate -> score -> publish -> mix (SAPO) -> learn -> checkpoint.

A node never waits for another node. Peers' records arrive through a :class:`protocol.channel.Channel` polled
in the background; whatever has arrived when the learner is ready is mixed in, and a node with no peers (or no
network) trains alone. The phases are also exposed one by one (:meth:`Node.generate`, :meth:`Node.sync`,
:meth:`Node.train`) so the simulator can schedule many nodes deterministically.

This module wires parts together; it knows nothing about wire formats (``protocol``), sampling policy
(``swarm``) or tensor maths (``node.losses`` / ``node.learner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from node.metrics import JsonlWriter, LiveView, truncate_after_step
from node.trackers import open_metrics
from protocol.types import Completion, Group, RolloutBatch, TaskRef
from swarm.evals import EVAL as _EVAL  # noqa: F401  (registers "eval": nodes store and relay it, never train on it)
from swarm.pool import SELF, PooledGroup, RolloutPool, rollout_stats
from swarm.sapo import SapoBatch, SapoSampler, ingest_rollouts
from swarm.scores import SCORES as _SCORES  # noqa: F401  (registers the MNPO "scores" record kind)

logger = logging.getLogger(__name__)

#: Behaviour log-prob hints from peers are clamped to this range (per-token mean, nats).
HINT_RANGE = (-30.0, 0.0)


@dataclass
class NodeParts:
    """The heavy components of a node, built once (see :func:`build_parts`)."""

    policy: Any  # node.policy.Policy
    tasks: Any  # node.tasks.TaskSource
    engine: Any  # node.engine.RolloutEngine
    learner: Any  # node.learner.Learner


def build_parts(cfg: NodeConfig) -> NodeParts:
    """Load the policy (building the built-in model on first use) and create engine and learner. Blocking."""
    from node.engine import TransformersEngine
    from node.learner import Learner
    from node.policy import load_policy
    from node.tasks import TaskSource

    policy = load_policy(cfg.model)
    tasks = TaskSource(cfg.tasks)
    if cfg.rollout.engine == "vllm":  # issue 6: GPU rollout engine (node.engine_vllm, the only vllm importer)
        from node.engine_vllm import build_vllm_engine

        engine = build_vllm_engine(cfg, policy)
    else:
        engine = TransformersEngine(policy, batch_size=cfg.rollout.batch_size)
    pad = policy.tokenizer.pad_token_id
    if pad is None:
        pad = policy.tokenizer.eos_token_id
    learner = Learner(
        policy.model, cfg.learner, device=policy.device, pad_token_id=pad, max_tokens=cfg.rollout.max_new_tokens
    )
    return NodeParts(policy=policy, tasks=tasks, engine=engine, learner=learner)


class Node:
    """One swarm member. Create with :meth:`create`; drive with :meth:`run` (or the phase methods); ``close``."""

    def __init__(
        self,
        cfg: NodeConfig,
        run_dir: str | Path,
        parts: NodeParts,
        channel: Any | None = None,
        *,
        name: str = "node",
        live: bool | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.policy, self.tasks, self.engine, self.learner = parts.policy, parts.tasks, parts.engine, parts.learner
        self.channel = channel
        self.name = name
        self.step = 0
        self.pool = RolloutPool(cfg.sapo.pool_size, cfg.sapo.max_age_steps)
        self.sampler = SapoSampler(
            cfg.sapo.local_groups,
            cfg.sapo.external_groups,
            max_per_peer=cfg.sapo.max_per_peer,
            fill_local=cfg.sapo.fill_local,
            seed=cfg.seed,
            keep_zero_advantage=cfg.sapo.keep_zero_advantage,
        )
        self.ingest_counts: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()
        self._live_enabled = live
        self._live: LiveView | None = None
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._metrics: JsonlWriter | None = None
        self._rollouts: JsonlWriter | None = None
        self._tasks: set[asyncio.Task] = set()
        self._publish_task: asyncio.Task | None = None
        self._outbox: list[Group] = []
        self._checkpointed_step = -1
        self._last_publish = float("-inf")
        self._peers: list[str] = []  # the transport's view (connections); client-mode peers may be missing
        self._peer_last_step: dict[str, int] = {}  # sender -> our step when its latest valid record arrived
        self.last_metrics: dict[str, Any] = {}
        self.mnpo: Any = None  # node.mnpo.MnpoPhase when mnpo.schedule is not "off"
        if cfg.mnpo.schedule != "off":
            from node.mnpo import MnpoPhase

            self.mnpo = MnpoPhase(self)
        self._evaluator: Any = None  # node.eval.Evaluator, built on the first evaluation
        self._pending_heldout: dict[str, float] = {}
        self._eval_outbox: dict[str, Any] | None = None  # the latest evaluation, to publish as an "eval" record
        self.last_eval_step: int | None = None
        self.planner: Any = None  # node.planner.RolloutPlanner when APRIL, VADE or DART is on (issue 6)
        if cfg.april.enabled or cfg.vade.enabled or cfg.dart.enabled:
            from node.planner import RolloutPlanner

            self.planner = RolloutPlanner(cfg, self.tasks, self.engine, self.policy)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def create(
        cls,
        cfg: NodeConfig,
        run_dir: str | Path,
        *,
        channel: Any | None = None,
        parts: NodeParts | None = None,
        name: str | None = None,
        resume: bool = True,
        live: bool | None = None,
    ) -> Node:
        """Build the parts (off the event loop), restore the latest checkpoint if ``resume``."""
        if parts is None:
            parts = await asyncio.to_thread(build_parts, cfg)
        if name is None:
            name = channel.peer_id if channel is not None else "node"
        node = cls(cfg, run_dir, parts, channel, name=name, live=live)
        if resume:
            await asyncio.to_thread(node._restore)
        node._metrics = await asyncio.to_thread(open_metrics, node.metrics_path, cfg, start_step=node.step)
        node._rollouts = JsonlWriter(node.run_dir / "rollouts.jsonl", fsync_every=50)
        return node

    def _restore(self) -> None:
        from node.checkpoint import load_latest, restore

        ckpt = load_latest(self.run_dir / "checkpoints")
        if ckpt is None:
            return
        restore(self.learner, ckpt)
        self.step = self._checkpointed_step = ckpt.step
        self.totals.update(ckpt.extra.get("totals", {}))
        if self.planner is not None and ckpt.extra.get("rollout_plan"):  # issue 6: APRIL buffer, VADE posteriors
            self.planner.load_state_dict(ckpt.extra["rollout_plan"])
        self.engine.set_policy_version(self.learner.policy_version)
        dropped = truncate_after_step(self.metrics_path, self.step)
        logger.info("resumed from step %d (policy version %d)", self.step, self.learner.policy_version)
        if dropped:
            logger.info("dropped %d metric lines written after that checkpoint", dropped)

    def checkpoint(self) -> Path:
        """Write a checkpoint of the learner and the node's counters (atomic)."""
        from node.checkpoint import save_checkpoint

        path = save_checkpoint(
            self.run_dir / "checkpoints",
            self.learner,
            step=self.step,
            extra={
                "totals": dict(self.totals),
                "name": self.name,
                **({"rollout_plan": self.planner.state_dict()} if self.planner is not None else {}),  # issue 6
            },
            keep=self.cfg.checkpoint.keep,
        )
        self._checkpointed_step = self.step
        if self._metrics is not None:
            self._metrics.sync()
        return path

    async def close(self) -> None:
        """Cancel background work, close the channel and flush files. Safe to call twice."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.channel is not None:
            with contextlib.suppress(Exception):
                await self.channel.close()
        for w in (self._metrics, self._rollouts):
            if w is not None:
                w.close()
        if self._live is not None:
            self._live.close()

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=f"{self.name[:12]}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ phases

    def _step_rng(self, purpose: str) -> random.Random:
        # Derived from (seed, node, step) alone, so a resumed node redraws exactly what it would have drawn.
        return random.Random(f"{self.cfg.seed}:{self.name}:{purpose}:{self.step}")

    def rollout(self, refs: list[TaskRef], n: int, rng: random.Random) -> tuple[list[Any], list[list[Any]]]:
        """Materialize ``refs``, format their prompts and sample ``n`` completions each with the rollout config."""
        rcfg = self.cfg.rollout
        items = [self.tasks.materialize(r) for r in refs]
        gens = self.engine.generate(
            [self.policy.format_prompt(it.question) for it in items],
            n,
            max_new_tokens=rcfg.max_new_tokens,
            temperature=rcfg.temperature,
            top_p=rcfg.top_p,
            seed=rng.randrange(2**31),
        )
        return items, gens

    def generate(self) -> list[PooledGroup]:
        """Draw prompts, generate G completions each, score them locally. Blocking (run off the loop)."""
        if self.mnpo is not None:
            self.mnpo.generate()
            if not self.mnpo.grpo_this_step():
                return []
        rcfg = self.cfg.rollout
        rng = self._step_rng("prompts")
        if self.planner is not None:  # issue 6: VADE selection, DART counts, APRIL partial rollouts
            items, gens = self.planner.generate(rng, self.step)
        else:
            items, gens = self.rollout(self.tasks.sample(rng, rcfg.prompts_per_step), rcfg.group_size, rng)
        own = []
        for i, (item, comps) in enumerate(zip(items, gens, strict=True)):
            rewards = tuple(float(self.tasks.score(item, c.text)) for c in comps)
            completions = tuple(
                Completion(
                    text=c.text,
                    n_tokens=len(c.token_ids),
                    finish_reason=c.finish_reason,
                    policy_version=c.policy_version,
                    logprob_mean=(math.fsum(c.logprobs) / len(c.logprobs)) if c.logprobs else None,
                    reward_hint=r,
                )
                for c, r in zip(comps, rewards, strict=True)
            )
            own.append(
                PooledGroup(
                    key=f"{SELF}:{self.step}:{i}",
                    source=SELF,
                    group=Group(task=item.ref, completions=completions),
                    rewards=rewards,
                    step=self.step,
                    policy_version=self.learner.policy_version,
                    tokenizer=self.policy.tokenizer_id,
                    extra={"gen": comps},
                )
            )
        if self.planner is not None:  # issue 6: feed the rewards to the VADE/DART posteriors
            self.planner.observe(own, self.step)
        return own

    def score_external(self, ref: TaskRef, texts: list[str]) -> list[float]:
        """The receiver's verifier for peers' groups: regenerate the task from its ref, score every text."""
        item = self.tasks.materialize_for_training(ref)  # TaskError: not our family, or a held-out question
        return [float(self.tasks.score(item, t)) for t in texts]

    # ------------------------------------------------------------------ held-out evaluation

    def eval_due(self) -> bool:
        """Whether the step being finished (``self.step + 1``) is an evaluation step (``eval.every_steps``)."""
        every = self.cfg.eval.every_steps
        return every is not None and (self.step + 1) % every == 0

    def evaluate_start(self) -> None:
        """The "before" evaluation of a fresh run (``eval.at_start``); nothing on a resumed run. Blocking."""
        if self.step == 0 and self.cfg.eval.at_start:
            self.evaluate(0)

    def evaluate_end(self) -> None:
        """The "after" evaluation (``eval.at_end``), unless this step was just evaluated. Blocking."""
        if self.cfg.eval.at_end and self.step > 0 and self.last_eval_step != self.step:
            self.evaluate(self.step)

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluate the current policy on the held-out split (``node.eval``) and append it to ``eval.jsonl``; when
        ``step`` is the step being finished, its metrics line carries the headline numbers. Blocking."""
        from node.eval import Evaluator, append_result, headline

        if self._evaluator is None:
            self._evaluator = Evaluator(self.tasks, self.policy, self.engine, self.cfg.eval, self.cfg.rollout)
        result = self._evaluator.evaluate(step)
        append_result(self.run_dir, result)
        if step == self.step + 1:  # the step being finished: its metrics line carries the numbers
            self._pending_heldout = headline(result)
        self._eval_outbox = result
        self.last_eval_step = step
        logger.info(
            "step %d: held-out accuracy %.3f (greedy %s) over %d families in %.1fs",
            step,
            result["accuracy"],
            "n/a" if result["greedy_accuracy"] is None else f"{result['greedy_accuracy']:.3f}",
            len(result["families"]),
            result["eval_s"],
        )
        return result

    async def publish_eval(self) -> None:
        """Publish the latest held-out evaluation as a signed ``eval`` record (``swarm.evals``) for dashboards;
        a network failure is counted, never raised."""
        result, self._eval_outbox = self._eval_outbox, None
        if result is None or self.channel is None:
            return
        from swarm.evals import EvalSummary

        summary = EvalSummary.from_eval_line(
            result, model=self.cfg.model.name, policy_version=self.learner.policy_version
        )
        try:
            await self.channel.publish("eval", summary)
            self.totals["published_evals"] += 1
        except Exception as e:  # the network failing must not stop training
            self.totals["publish_errors"] += 1
            logger.warning("publishing the evaluation failed: %s", e)

    async def publish(self, own: list[PooledGroup]) -> None:
        """Sign and publish these groups' informative ones now (peers drop zero-advantage groups anyway)."""
        mnpo = self.mnpo.take_groups() if self.mnpo is not None else []
        await self.publish_groups([g.group for g in own if g.informative] + mnpo)

    def _take_outbox(self) -> list[Group]:
        """Pop the oldest queued groups that fit in one record (half the size cap, to leave room for headers)."""
        budget = self.cfg.protocol.max_record_bytes // 2
        taken = 0
        size = 0
        for group in self._outbox:
            size += sum(len(c.text.encode()) + 64 for c in group.completions) + 256
            if taken and size > budget:
                break
            taken += 1
        out, self._outbox = self._outbox[:taken], self._outbox[taken:]
        return out

    def _queue_publish(self, own: list[PooledGroup]) -> None:
        """Queue this step's groups; publish at most every ``publish_interval_s`` so peers' quotas are respected.

        A slow network never blocks a step: while a publish is in flight, groups wait in the outbox (bounded;
        the oldest are dropped first and counted).
        """
        self._outbox.extend(g.group for g in own if g.informative)
        if self.mnpo is not None:
            self._outbox.extend(self.mnpo.take_groups())
        excess = len(self._outbox) - self.cfg.runtime.max_outbox_groups
        if excess > 0:
            del self._outbox[:excess]
            self.totals["outbox_dropped"] += excess
        now = time.monotonic()
        in_flight = self._publish_task is not None and not self._publish_task.done()
        if self._outbox and not in_flight and now - self._last_publish >= self.cfg.runtime.publish_interval_s:
            self._last_publish = now
            self._publish_task = self._spawn(self.publish_groups(self._take_outbox()), "publish")

    async def publish_groups(self, groups: list[Group]) -> None:
        """Sign and publish one record of ``groups``; a network failure is counted, never raised."""
        if self.mnpo is not None:
            await self.mnpo.publish()
        if self.channel is None or not groups:
            return
        batch = RolloutBatch(
            model=self.cfg.model.name,
            policy_version=self.learner.policy_version,
            tokenizer=self.policy.tokenizer_id,
            groups=tuple(groups),
        )
        try:
            await self.channel.publish("rollouts", batch)
            self.totals["published_groups"] += len(groups)
        except Exception as e:  # the network failing must not stop training
            self.totals["publish_errors"] += 1
            logger.warning("publish failed: %s", e)

    async def sync(self) -> int:
        """Fetch peers' new records, re-score and pool them. Returns how many groups were accepted."""
        if self.channel is None:
            return 0
        try:
            envelopes = await self.channel.poll()
        except Exception as e:
            self.totals["poll_errors"] += 1
            logger.warning("poll failed: %s", e)
            return 0
        accepted = 0
        for env in envelopes:
            self._peer_last_step[env.sender] = self.step
            if self.mnpo is not None:
                self.mnpo.ingest(env)
            if env.kind != "rollouts":
                continue
            counts = ingest_rollouts(self.pool, env, self.score_external, self.step)
            self.ingest_counts.update(counts)
            accepted += counts.get("accepted", 0)
        # Follow the peers whose groups proved useful (not merely the latest senders: a sybil flood is recent).
        trusted = self.pool.trusted(self.channel.transport_follow_limit, self.step)
        self.channel.follow(trusted or None)
        with contextlib.suppress(Exception):
            self._peers = list(await self.channel.peers())
        return accepted

    def recent_peers(self) -> int:
        """Distinct peers whose valid records arrived within the pool's age window (``sapo.max_age_steps``).

        This is the swarm a node actually learns from; the transport's connection count can read 0 while
        records flow (client-mode peers are never in a routing table) and is reported as ``connections``.
        """
        horizon = self.step - self.cfg.sapo.max_age_steps
        for sender in [p for p, s in self._peer_last_step.items() if s < horizon]:
            del self._peer_last_step[sender]
        return len(self._peer_last_step)

    def _advantages(self, rewards: tuple[float, ...]) -> list[float]:
        from node.losses import advantages_for

        return advantages_for(self.cfg.learner, rewards)

    def build_samples(self, batch: SapoBatch) -> list[Any]:
        """Turn sampled groups into learner samples; peers' text is re-tokenized with the local tokenizer."""
        from node.learner import TrainSample

        samples = []
        max_new = self.cfg.rollout.max_new_tokens
        eos = self.policy.tokenizer.eos_token_id
        for g in batch.groups:
            advs = self._advantages(g.rewards)
            if g.local:
                for comp, adv in zip(g.extra["gen"], advs, strict=True):
                    if comp.token_ids:
                        samples.append(TrainSample(comp.prompt_ids, list(comp.token_ids), adv, list(comp.logprobs)))
                continue
            item = self.tasks.materialize(g.group.task)
            prompt_ids = self.policy.encode(self.policy.format_prompt(item.question))
            use_hint = self.cfg.sapo.peer_importance_weights and g.tokenizer == self.policy.tokenizer_id
            for comp, adv in zip(g.group.completions, advs, strict=True):
                ids = self.policy.encode(comp.text)[:max_new]
                if comp.finish_reason == "stop" and eos is not None and len(ids) < max_new:
                    ids.append(eos)
                if not ids:
                    continue
                hint = comp.logprob_mean if use_hint else None
                if hint is not None:
                    hint = min(max(float(hint), HINT_RANGE[0]), HINT_RANGE[1]) if math.isfinite(hint) else None
                samples.append(TrainSample(prompt_ids, ids, adv, None, hint, external=True))
        return samples

    def train(self, samples: list[Any]) -> dict[str, float]:
        """One learner update (blocking); no update when every group had zero advantage."""
        out = self.learner.step(samples) if samples else {}
        if self.mnpo is not None:
            out = {**out, **self.mnpo.train()}
        if not out:
            return {}
        self.engine.set_policy_version(self.learner.policy_version)
        return out

    # ------------------------------------------------------------------ the loop

    async def step_once(self, *, poll: bool = True) -> dict[str, Any]:
        """One full step. ``poll=False`` when a background poller (or the simulator) feeds the pool."""
        t0 = time.perf_counter()
        own = await asyncio.to_thread(self.generate)
        t_gen = time.perf_counter() - t0
        if self.channel is not None:
            self._queue_publish(own)
            if poll:
                await self.sync()
        batch = self.sampler.sample(self.pool, self.step, own)
        samples = self.build_samples(batch)
        t1 = time.perf_counter()
        train_metrics = await asyncio.to_thread(self.train, samples)
        t_train = time.perf_counter() - t1
        t_step = time.perf_counter() - t0  # evaluation is not part of the step's cost
        if self.eval_due():
            await asyncio.to_thread(self.evaluate, self.step + 1)
            self._spawn(self.publish_eval(), "publish-eval")
        return self._finish_step(own, batch, train_metrics, t_gen, t_train, t_step)

    def _finish_step(self, own, batch: SapoBatch, train_metrics, t_gen, t_train, t_step) -> dict[str, Any]:
        self.step += 1
        self.pool.prune(self.step)
        rewards = [r for g in own for r in g.rewards]
        gen_tokens = sum(c.n_tokens for g in own for c in g.group.completions)
        chan = self.channel.metrics() if self.channel is not None else {}
        # Refused by the validator (forged, replayed, ...) plus dropped at ingest (tasks we will not regenerate).
        reasons = Counter({k: v for k, v in (chan.get("rejected") or {}).items() if v})
        # Zero-advantage groups are dropped but not "rejected": honest MNPO responses can carry equal rewards.
        not_rejections = ("accepted", "duplicate", "zero_advantage")
        reasons.update({k: v for k, v in self.ingest_counts.items() if k not in not_rejections and v})
        m: dict[str, Any] = {
            **{k: v for k, v in train_metrics.items() if isinstance(v, int | float)},
            "step": self.step,
            "time": time.time(),
            "reward_mean": math.fsum(rewards) / len(rewards) if rewards else 0.0,
            "solve_rate": sum(1 for g in own if max(g.rewards) > 0.5) / len(own) if own else 0.0,
            **rollout_stats(own),
            **batch.metrics(),
            "peers": self.recent_peers(),
            "connections": len(self._peers),
            "published": chan.get("published", 0),
            "received": chan.get("received", 0),
            "rejected": sum(reasons.values()),
            "rejected_by_reason": dict(reasons),
            "accepted_groups": self.ingest_counts.get("accepted", 0),
            "zero_advantage_groups": self.ingest_counts.get("zero_advantage", 0),
            "policy_version": self.learner.policy_version,
            "gen_s": round(t_gen, 4),
            "train_s": round(t_train, 4),
            "step_s": round(t_step, 4),
            "gen_tokens": gen_tokens,
            "gen_tokens_per_s": gen_tokens / t_gen if t_gen > 0 else 0.0,
            **self.pool.stats(self.step),
            **(self.mnpo.metrics() if self.mnpo is not None else {}),
            **(self.planner.metrics() if self.planner is not None else {}),  # issue 6
            **self._pending_heldout,
        }
        self._pending_heldout = {}
        self.last_metrics = m
        if self._metrics is not None:
            self._metrics.write(m)
        if self._rollouts is not None:
            for g in own:
                self._rollouts.write(
                    {
                        "step": self.step,
                        "task": g.group.task.to_dict(),
                        "completions": [c.text for c in g.group.completions],
                        "rewards": list(g.rewards),
                        "policy_version": g.policy_version,
                    }
                )
        if self._live is not None:
            self._live.update(m)
        if self.step % self.cfg.checkpoint.every == 0:
            self.checkpoint()
        return m

    async def _poll_forever(self, interval: float) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(interval)

    async def run(self, max_steps: int | None = None, stop: asyncio.Event | None = None) -> dict[str, Any]:
        """Train until ``max_steps`` (total, counting resumed steps) or ``stop`` is set; checkpoint on exit."""
        stop = stop or asyncio.Event()
        self._live = LiveView(max_steps, start=self.step, enabled=self._live_enabled)
        if self.channel is not None:
            self._spawn(self._poll_forever(self.cfg.runtime.poll_interval_s), "poll")
        planned = (
            (max_steps if max_steps is not None else self.step + 1000) - self.step
        ) * self.cfg.rollout.prompts_per_step
        await asyncio.to_thread(self.tasks.warn_if_small, planned)
        try:
            if not stop.is_set():
                await asyncio.to_thread(self.evaluate_start)
                self._spawn(self.publish_eval(), "publish-eval")
            while (max_steps is None or self.step < max_steps) and not stop.is_set():
                await self.step_once(poll=False)
            # Not after a stop signal: the user is waiting for the exit (``swarm-node eval`` evaluates later).
            if not stop.is_set():
                await asyncio.to_thread(self.evaluate_end)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.publish_eval(), self.cfg.runtime.shutdown_timeout_s)
        finally:
            with contextlib.suppress(Exception):
                if self._publish_task is not None and not self._publish_task.done():
                    await asyncio.wait_for(self._publish_task, self.cfg.runtime.shutdown_timeout_s)
                if self._outbox and self.channel is not None:  # last groups, so peers still get them
                    await asyncio.wait_for(
                        self.publish_groups(self._take_outbox()), self.cfg.runtime.shutdown_timeout_s
                    )
            if self._checkpointed_step != self.step:  # the last step may have just been checkpointed
                await asyncio.to_thread(self.checkpoint)
            if self._live is not None:
                self._live.close()
                self._live = None
        return self.last_metrics
