"""The node runtime: one node's loop of generate -> score -> publish -> mix (SAPO) -> learn -> checkpoint.

A node never waits for another node. Peers' records arrive through a :class:`protocol.channel.Channel` polled
in the background; whatever has arrived when the learner is ready is mixed in, and a node with no peers (or no
network) trains alone. One step is a pipeline of public methods, the same for the runtime's loop and the simulator
(which schedules many nodes deterministically):

    own = node.generate()                  # prompt -> rollout -> scored own groups  (node.rollout.planner, .groups)
    await node.publish(own) / node.sync()  # record out / peers' records in          (protocol.channel, swarm.sapo)
    batch = node.make_batch(own)           # pool -> SAPO batch -> samples           (swarm.sapo, node.learn.batch)
    metrics = node.learn(batch)            # samples -> loss -> update               (node.learn.learner)
    node.finish_step(own, batch, metrics, times)   # metrics line, rollouts log, checkpoint

This module wires parts together; it knows nothing about wire formats (``protocol``), sampling policy
(``swarm``) or tensor maths (``node.learn.losses`` / ``node.learn.learner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.config import NodeConfig
from node.heap import release_free_memory, resident_mb
from node.learn.batch import SampleBuilder, TrainBatch
from node.rollout.groups import OwnRollouts, own_rollouts
from node.rollout.planner import Planner, RolloutPlanner, UniformPlanner, planner_enabled
from node.seams import (
    EngineLike,
    GenerationSettings,
    LearnerLike,
    NoPhase,
    PolicyLike,
    StepPhase,
    TasksLike,
    TrainSample,
)
from node.tasks import HeldOutError, PluginError, TaskError, TaskItem, extract_answer, is_exact
from node.telemetry.metrics import JsonlWriter, LiveView, truncate_after_step
from node.telemetry.trackers import open_metrics
from protocol.channel import Channel
from protocol.types import Envelope, Group, RolloutBatch, TaskRef
from swarm.evals import EVAL as _EVAL  # noqa: F401  (registers "eval": nodes store and relay it, never train on it)
from swarm.pool import RolloutPool, rollout_stats
from swarm.sapo import SapoBatch, SapoSampler, SolveRates, ingest_rollouts
from swarm.scores import SCORES as _SCORES  # noqa: F401  (registers the MNPO "scores" record kind)

if TYPE_CHECKING:
    from node.learn.learner import Learner

logger = logging.getLogger(__name__)

#: An fsync cadence that never comes: the simulator's runs are reproducible from their seed, not from disk.
NO_FSYNC = 1 << 30
#: Distinct (family, reason) pairs of dropped peer groups a node logs, one line each (SPEC 6; as SPEC 15 caps the
#: versions it reports): one record may name 1,024 families, each a line without a cap.
MAX_LOGGED_TASK_REFUSALS = 16


@dataclass
class NodeParts:
    """The heavy components of a node, built once (see :func:`build_parts`)."""

    policy: PolicyLike
    tasks: TasksLike
    engine: EngineLike
    learner: LearnerLike


@dataclass
class StepTimes:
    """Wall seconds of one step: generation, the learner update, and the whole step (evaluation excluded)."""

    gen_s: float
    train_s: float
    step_s: float


def build_parts(cfg: NodeConfig) -> NodeParts:
    """Load the policy (building the built-in model on first use) and create engine and learner. Blocking."""
    from node.learn.learner import Learner
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine
    from node.tasks import TaskSource

    policy = load_policy(cfg.model)
    tasks = TaskSource(cfg.tasks)
    engine: EngineLike
    if cfg.rollout.engine == "vllm":  # node.rollout.engine_vllm is the only importer of vllm
        from node.rollout.engine_vllm import build_vllm_engine

        engine = build_vllm_engine(cfg, policy)
    else:
        engine = TransformersEngine(
            policy, batch_size=cfg.rollout.batch_size, settings=GenerationSettings.of(cfg.rollout)
        )
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
        channel: Channel | None = None,
        *,
        name: str = "node",
        live: bool | None = None,
    ) -> None:
        from node.learn.losses import advantages_for

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.policy, self.tasks, self.engine, self.learner = parts.policy, parts.tasks, parts.engine, parts.learner
        self.channel = channel
        self.name = name
        self.step = 0
        #: ``sapo.peer_advantage: receiver``: peers' solved completions are credited against this node's own
        #: solve rate per family (``swarm.sapo.SolveRates``), updated from its own groups every step.
        self.receiver = cfg.sapo.peer_advantage in ("receiver", "guided")
        #: ``sapo.peer_advantage: guided``: each step's peers' groups are drawn before generating, this node rolls
        #: out on their prompts too, and each peer's right completions join its own group there (``_guides``: own
        #: group index -> the peer's group), trained as off-policy guidance (``SampleBuilder.guided``).
        self.guided = cfg.sapo.peer_advantage == "guided"
        self._guides: SapoBatch | None = None
        self.solve_rates = SolveRates(stronger_only=cfg.sapo.peer_groups == "stronger")
        self.pool = RolloutPool(cfg.sapo.pool_size, cfg.sapo.max_age_steps, protect_steps=cfg.sapo.establish_steps)
        self.sampler = SapoSampler(
            cfg.sapo.local_groups,
            cfg.sapo.external_groups,
            max_per_peer=cfg.sapo.max_per_peer,
            fill_local=cfg.sapo.fill_local,
            seed=cfg.seed,
            newcomer_share=cfg.sapo.newcomer_share,
            establish_steps=cfg.sapo.establish_steps,
            keep_zero_advantage=cfg.sapo.keep_zero_advantage,
            useful=self.solve_rates.teaches if self.receiver else None,
        )
        self.samples = SampleBuilder(
            self.policy,
            self.tasks,
            max_new_tokens=cfg.rollout.max_new_tokens,
            advantages=lambda rewards: advantages_for(cfg.learner, rewards),
            peer_importance_weights=cfg.sapo.peer_importance_weights,
            peer_advantages=self.solve_rates.advantages if cfg.sapo.peer_advantage == "receiver" else None,
            peer_text=cfg.sapo.peer_text,
            guided_negatives=cfg.sapo.guided_negatives,
            trace_own=cfg.learner.trace_own,
            trace_texts=cfg.sapo.trace_texts,
        )
        #: ``labels``: a task source over the families this node adds its own gold labels for (a control).
        self._label_tasks = None
        if cfg.labels.families:
            from node.tasks import TaskSource

            label_families = [f for f in cfg.tasks.families if f.name in set(cfg.labels.families)]
            self._label_tasks = TaskSource(cfg.tasks.model_copy(update={"families": label_families}))
        self.ingest_counts: Counter[str] = Counter()
        self._task_refusals_logged: set[tuple[str, str]] = set()
        self.totals: Counter[str] = Counter()
        self._live_enabled = live
        self._live: LiveView | None = None
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._metrics: JsonlWriter | None = None
        self._rollouts: JsonlWriter | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._publish_task: asyncio.Task[Any] | None = None
        self._outbox: list[Group] = []
        self._checkpointed_step = -1
        self._last_publish = float("-inf")
        self._peers: list[str] = []  # the transport's view (connections); client-mode peers may be missing
        self._peer_last_step: dict[str, int] = {}  # sender -> our step when its latest valid record arrived
        self.last_metrics: dict[str, Any] = {}
        self._evaluator: Any = None  # node.eval.Evaluator, built on the first evaluation
        self._pending_heldout: dict[str, float] = {}
        self._eval_outbox: dict[str, Any] | None = None  # the latest evaluation, to publish as an "eval" record
        self.last_eval_step: int | None = None
        self.planner: Planner = (
            RolloutPlanner(cfg, self.tasks, self.engine, self.policy)
            if planner_enabled(cfg)
            else UniformPlanner(cfg, self.tasks, self.engine, self.policy)
        )
        self.phase: StepPhase = NoPhase() if cfg.mnpo.schedule == "off" else self._mnpo_phase()

    def _torch_learner(self, purpose: str) -> Learner:
        """The learner as the torch :class:`node.learn.learner.Learner` that ``purpose`` needs (a scripted stand-in has
        no weights to checkpoint or to score MNPO pairs with)."""
        from node.learn.learner import Learner

        if not isinstance(self.learner, Learner):
            raise TypeError(f"{purpose} needs the torch learner, not {type(self.learner).__name__}")
        return self.learner

    def _mnpo_phase(self) -> StepPhase:
        from node.mnpo.phase import MnpoPhase

        channel = self.channel
        return MnpoPhase(
            self.cfg.mnpo,
            learner=self._torch_learner("MNPO"),
            tasks=self.tasks,
            samples=self.samples,
            rollout=self.planner.rollout,
            step=lambda: self.step,
            window_base=(lambda: channel.validator.current_window()) if channel is not None else (lambda: self.step),
            publish=channel.publish if channel is not None else None,
            swarm_id=self.cfg.swarm_id,
            task_seed=self.cfg.tasks.seed,
            model_name=self.cfg.model.name,
            tokenizer_id=self.policy.tokenizer_id,
            rng_seed=f"mnpo:{self.cfg.seed}:{self.name}",
        )

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
        durable: bool = True,
        keep_rollouts: bool = True,
    ) -> Node:
        """Build the parts (off the event loop), restore the latest checkpoint if ``resume``.

        ``durable=False`` never fsyncs the metrics and rollouts files (lines are still flushed): for simulations
        that are reproduced from their seed. ``keep_rollouts=False`` writes no ``rollouts.jsonl`` (thousands of
        simulated nodes would otherwise hold thousands of open files)."""
        if parts is None:
            parts = await asyncio.to_thread(build_parts, cfg)
        if name is None:
            name = channel.peer_id if channel is not None else "node"
        node = cls(cfg, run_dir, parts, channel, name=name, live=live)
        if resume:
            await asyncio.to_thread(node._restore)
        node._metrics = await asyncio.to_thread(
            open_metrics, node.metrics_path, cfg, start_step=node.step, fsync_every=10 if durable else NO_FSYNC
        )
        if keep_rollouts:
            node._rollouts = JsonlWriter(node.run_dir / "rollouts.jsonl", fsync_every=50 if durable else NO_FSYNC)
        return node

    def _restore(self) -> None:
        from node.learn.checkpoint import load_latest, restore

        ckpt = load_latest(self.run_dir / "checkpoints")
        if ckpt is None:
            return
        restore(self._torch_learner("resuming"), ckpt)
        self.step = self._checkpointed_step = ckpt.step
        self.totals.update(ckpt.extra.get("totals", {}))
        if ckpt.extra.get("rollout_plan"):  # APRIL buffer, VADE posteriors
            self.planner.load_state_dict(ckpt.extra["rollout_plan"])
        self.engine.sync_weights(self.learner.policy_version)  # restored weights: an engine's copy is stale
        dropped = truncate_after_step(self.metrics_path, self.step)
        logger.info("resumed from step %d (policy version %d)", self.step, self.learner.policy_version)
        if dropped:
            logger.info("dropped %d metric lines written after that checkpoint", dropped)

    def checkpoint(self) -> Path | None:
        """Write a checkpoint of the learner and the node's counters (atomic); None when the disk refused it."""
        from node.learn.checkpoint import save_or_report

        plan = self.planner.state_dict()
        path = save_or_report(
            self.run_dir / "checkpoints",
            self._torch_learner("checkpointing"),
            step=self.step,
            extra={
                "totals": dict(self.totals),
                "name": self.name,
                **({"rollout_plan": plan} if plan is not None else {}),
            },
            keep=self.cfg.checkpoint.keep,
        )
        if path is None:  # logged; the previous checkpoint stands and the next one is tried as usual
            return None
        self._checkpointed_step = self.step
        if self._metrics is not None:
            self._metrics.sync()
        return path

    async def close(self) -> None:
        """Cancel background work, close the channel and flush files. Safe to call twice."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: a task stuck past its cancellation must not keep a stopping node from closing its channel and
            # flushing its files (the user is waiting for the exit).
            _, pending = await asyncio.wait(tasks, timeout=self.cfg.runtime.shutdown_timeout_s)
            if pending:
                logger.warning(
                    "background task(s) %s did not stop within %.0f s of being cancelled; closing without them",
                    ", ".join(sorted(t.get_name() for t in pending)),
                    self.cfg.runtime.shutdown_timeout_s,
                )
        self._tasks.clear()
        if self.channel is not None:
            with contextlib.suppress(Exception):
                await self.channel.close()
        for w in (self._metrics, self._rollouts):
            if w is not None:
                w.close()
        if self._live is not None:
            self._live.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"{self.name[:12]}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ phases

    def _step_rng(self, purpose: str) -> random.Random:
        # Derived from (seed, node, step) alone, so a resumed node redraws exactly what it would have drawn.
        return random.Random(f"{self.cfg.seed}:{self.name}:{purpose}:{self.step}")

    def reward(self, item: TaskItem, text: str) -> float:
        """The training reward of one of this node's own completions (:meth:`verified_reward`). A task plug-in that
        fails on it scores it 0 (counted as ``plugin_own_failures``, logged once per family)."""
        try:
            return self.verified_reward(item, text)
        except PluginError as e:
            self.totals["plugin_own_failures"] += 1
            key = (item.ref.family[:128], "own")
            if key not in self._task_refusals_logged and e.reason != "plugin_quarantined":
                self._task_refusals_logged.add(key)
                logger.warning("task plug-in %r failed on an own completion, scored 0 (plugin_own_failures in the "
                               "metrics line; logged once per family): %s", item.ref.family[:128], e)  # fmt: skip
            return 0.0

    def verified_reward(self, item: TaskItem, text: str, *, own: bool = True) -> float:
        """The verifier's score, or exact match (``tasks.reward``); :class:`PluginError` when a plug-in's scorer
        fails. ``own``: this node's completion, not a peer's (``TaskSource.score``)."""
        score = float(self.tasks.score(item, text, own=own))
        if self.cfg.tasks.reward == "partial":
            return score
        return float(is_exact(item, extract_answer(text), score))

    def generate(self) -> OwnRollouts:
        """Draw prompts, generate G completions each, score them locally. Blocking (run off the loop)."""
        self.phase.generate(self.step)
        if not self.phase.runs_grpo(self.step):
            return OwnRollouts()
        rng = self._step_rng("prompts")
        items, gens = self.planner.generate(rng, self.step)
        if self.guided:
            guides = self.choose_guides().external
            if guides:
                g_items, g_gens = self.planner.rollout([g.group.task for g in guides], self.cfg.rollout.group_size, rng)
                items, gens = [*items, *g_items], [*gens, *g_gens]
        own = own_rollouts(
            [it.ref for it in items],
            gens,
            lambda i, text: self.reward(items[i], text),
            step=self.step,
            policy_version=self.learner.policy_version,
            tokenizer_id=self.policy.tokenizer_id,
            exact=lambda i, text, reward: is_exact(items[i], extract_answer(text), reward),
        )
        self.planner.observe(own.groups, self.step)  # VADE/DART posteriors learn from the rewards
        return own

    def score_external(self, ref: TaskRef, texts: Sequence[str]) -> list[float]:
        """The receiver's verifier for peers' groups: regenerate the task from its ref, score every text. A
        :class:`TaskError` (not our family or version, a dev/test question, a plug-in failing on the item) drops the
        group; ``ingest_rollouts`` counts it under the error's ``reason``."""
        try:
            item = self.tasks.materialize_for_training(ref)
            return [self.verified_reward(item, t, own=False) for t in texts]
        except TaskError as e:
            self._note_task_refusal(ref.family, e)
            raise

    def _note_task_refusal(self, family: str, e: TaskError) -> None:
        """One log line per (family, reason) for the life of the node, for the first
        :data:`MAX_LOGGED_TASK_REFUSALS` pairs, then one line saying the rest are not logged; the counts go to
        ``rejected_by_reason``, uncapped."""
        key, logged = (family[:128], e.reason), self._task_refusals_logged
        if key in logged or len(logged) > MAX_LOGGED_TASK_REFUSALS:
            return
        logged.add(key)
        if len(logged) > MAX_LOGGED_TASK_REFUSALS:
            logger.info("dropping peers' groups of more task families than the %d logged: further ones are counted in "
                        "rejected_by_reason, not logged", MAX_LOGGED_TASK_REFUSALS)  # fmt: skip
            return
        # Routine (a peer's item on this node's held-out side) or said once already (the quarantine's own line):
        # debug; another family config: info; the rest name a fault of the plug-in or of the peer: warning.
        if isinstance(e, HeldOutError) or e.reason == "plugin_quarantined":
            level = logging.DEBUG
        elif e.reason == "task_rejected":
            level = logging.INFO
        else:
            level = logging.WARNING
        logger.log(level, "dropping peers' groups of task family %r (%s, counted in rejected_by_reason; logged "
                   "once per family): %s", family[:128], e.reason, e)  # fmt: skip

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
        from node.eval import Evaluator, append_result, headline, summary_line

        if self._evaluator is None:
            from node.tasks import TaskSource

            if not isinstance(self.tasks, TaskSource):
                raise TypeError(f"held-out evaluation needs a real task source, not {type(self.tasks).__name__}")
            eval_cfg = self.cfg.eval.sized_for(self.cfg.model.name)
            if eval_cfg is not self.cfg.eval:
                logger.info(
                    "evaluations are quick for a real model (eval.quick): %d items x %d samples per family; "
                    "swarm-node eval measures at full size", eval_cfg.items_per_family, eval_cfg.samples,
                )  # fmt: skip
            self._evaluator = Evaluator(self.tasks, self.policy, self.engine, eval_cfg, self.cfg.rollout)
        if self.engine.policy_version != self.learner.policy_version:  # vllm.sync_every > 1: measure the learner
            self.engine.sync_weights(self.learner.policy_version)
        result = self._evaluator.evaluate(step)
        if self.cfg.runtime.malloc_trim_every:
            release_free_memory()
        append_result(self.run_dir, result)
        if step == self.step + 1:  # the step being finished: its metrics line carries the numbers
            self._pending_heldout = headline(result)
        self._eval_outbox = result
        self.last_eval_step = step
        logger.info("step %d: %s", step, summary_line(result))
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

    async def publish(self, own: OwnRollouts) -> None:
        """Sign and publish these groups' informative ones now (peers drop zero-advantage groups anyway)."""
        await self.publish_groups(own.informative(solved=self.cfg.sapo.publish_solved) + self.phase.take_groups())

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

    def _queue_publish(self, own: OwnRollouts) -> None:
        """Queue this step's groups; publish at most every ``publish_interval_s`` so peers' quotas are respected.

        A slow network never blocks a step: while a publish is in flight, groups wait in the outbox (bounded;
        the oldest are dropped first and counted).
        """
        self._outbox.extend(own.informative(solved=self.cfg.sapo.publish_solved))
        self._outbox.extend(self.phase.take_groups())
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
        await self.phase.publish()
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
        accepted = sum(self.ingest(env) for env in envelopes)
        # Follow the peers whose groups proved useful (not merely the latest senders: a sybil flood is recent).
        trusted = self.pool.trusted(self.channel.transport_follow_limit, self.step)
        self.channel.follow(trusted or None)
        with contextlib.suppress(Exception):
            self._peers = list(await self.channel.peers())
        return accepted

    def ingest(self, env: Envelope) -> int:
        """Take one validated peer record: the MNPO phase sees every kind; rollouts are re-scored and pooled.
        Returns how many groups were accepted."""
        self._peer_last_step[env.sender] = self.step
        self.phase.ingest(env)
        if env.kind != "rollouts":
            return 0
        counts = ingest_rollouts(self.pool, env, self.score_external, self.step, receiver=self.receiver)
        self.ingest_counts.update(counts)
        return counts.get("accepted", 0)

    def recent_peers(self) -> int:
        """Distinct peers whose valid records arrived within the pool's age window (``sapo.max_age_steps``).

        This is the swarm a node actually learns from; the transport's connection count can read 0 while
        records flow (client-mode peers are never in a routing table) and is reported as ``connections``.
        """
        horizon = self.step - self.cfg.sapo.max_age_steps
        for sender in [p for p, s in self._peer_last_step.items() if s < horizon]:
            del self._peer_last_step[sender]
        return len(self._peer_last_step)

    def choose_guides(self) -> SapoBatch:
        """A guided node's peers' groups for this step (drawn once, by the sampler, with every bound of a peer's
        share): on the event loop, before :meth:`generate` rolls out on their prompts."""
        if self._guides is None or self._guides.step != self.step:
            self._guides = self.sampler.choose_external(self.pool, self.step)
            sapo = self.cfg.sapo
            self.sampler.choose_traces(self.pool, self.step, self._guides, sapo.trace_groups, sapo.trace_families)
        return self._guides

    def make_batch(self, own: OwnRollouts) -> TrainBatch:
        """SAPO's batch for this step (own groups plus peers' pooled ones) as learner samples. On the event loop:
        the pool is also fed there, by :meth:`sync`."""
        self.solve_rates.update(own.groups)
        if self.guided:
            return self._guided_batch(own)
        sapo = self.sampler.sample(self.pool, self.step, own.groups)
        samples = self.samples.build(sapo, own.generations)
        return TrainBatch(sapo, samples + self._label_samples())

    def _guided_batch(self, own: OwnRollouts) -> TrainBatch:
        """The guided batch: the peers' groups drawn before generating, each mixed with this node's own group on
        its prompt (the last ``len(guides)`` own groups), plus up to I other own informative groups."""
        chosen = self.choose_guides()
        if len(own.groups) < len(chosen.external):  # no rollouts this step (a side phase's turn): nothing to mix
            chosen.external = []
            chosen.traces = []
        n_guided = len(chosen.external)
        split = len(own.groups) - n_guided
        pairs = list(zip(own.groups[split:], chosen.external, strict=True))
        sapo = self.sampler.sample(self.pool, self.step, own.groups[:split], chosen=chosen, pinned=own.groups[split:])
        plain = SapoBatch(local=sapo.local[n_guided:], step=self.step)
        samples = self.samples.build(plain, own.generations)
        for mine, guide in pairs:
            samples += self.samples.guided(mine, own.generations[mine.key], guide)
        credit = self.cfg.sapo.trace_credit
        for guide in chosen.traces:  # sapo.trace_groups: the trace step's (and, credited, the RL update's)
            samples += self.samples.traces(guide, self._need(guide.group.task.family) if credit else None)
        return TrainBatch(sapo, samples + self._label_samples())

    def _label_samples(self) -> list[TrainSample]:
        """The ``labels`` control's gold-label samples of this step (none when it is off)."""
        if self._label_tasks is None:
            return []
        refs = self._label_tasks.sample(self._step_rng("labels"), self.cfg.labels.per_step)
        items = [self._label_tasks.materialize(r) for r in refs]
        labels = self.cfg.labels
        return self.samples.labels(items, self._need, trace=labels.trace, trace_only=labels.trace_only)

    def _need(self, family: str) -> float:
        """``1 - b``, ``b`` this node's recent solve rate of ``family``: the credit of a gold label or a credited
        trace (``labels``, ``sapo.trace_credit``)."""
        return 1.0 - self.solve_rates.rate(family)

    def learn(self, batch: TrainBatch) -> dict[str, float]:
        """One learner update (blocking), then the side phase's (MNPO); no update when nothing is informative."""
        out = self.learner.step(batch.samples) if batch.samples else {}
        out = {**out, **self.phase.train()}
        every = self.cfg.runtime.malloc_trim_every
        if every and (self.step + 1) % every == 0:
            release_free_memory()  # the update's activations: back to the OS, or the heap fragments (node.heap)
        if not out:
            return {}
        self.engine.set_policy_version(self.learner.policy_version)
        return out

    # ------------------------------------------------------------------ the loop

    async def step_once(self, *, poll: bool = True) -> dict[str, Any]:
        """One full step. ``poll=False`` when a background poller (or the simulator) feeds the pool."""
        t0 = time.perf_counter()
        if self.guided:
            self.choose_guides()  # on the loop: the pool is fed here too
        own = await asyncio.to_thread(self.generate)
        t_gen = time.perf_counter() - t0
        if self.channel is not None:
            self._queue_publish(own)
            if poll:
                await self.sync()
        batch = self.make_batch(own)
        t1 = time.perf_counter()
        train_metrics = await asyncio.to_thread(self.learn, batch)
        t_train = time.perf_counter() - t1
        t_step = time.perf_counter() - t0  # evaluation is not part of the step's cost
        if self.eval_due():
            await asyncio.to_thread(self.evaluate, self.step + 1)
            self._spawn(self.publish_eval(), "publish-eval")
        return self.finish_step(own, batch, train_metrics, StepTimes(t_gen, t_train, t_step))

    def finish_step(
        self, own: OwnRollouts, batch: TrainBatch, train_metrics: dict[str, float], times: StepTimes
    ) -> dict[str, Any]:
        """Close the step: advance the step counter, prune the pool, write the metrics line and the own rollouts,
        and checkpoint on schedule. Returns the metrics line."""
        self.step += 1
        self.pool.prune(self.step)
        rewards = [r for g in own.groups for r in g.rewards]
        gen_tokens = sum(c.n_tokens for g in own.groups for c in g.group.completions)
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
            "solve_rate": sum(1 for g in own.groups if max(g.rewards) > 0.5) / len(own.groups) if own.groups else 0.0,
            # the exact twin of reward_mean: the share of own completions whose answer is exactly right
            "exact_mean": sum(own.exact) / len(own.exact) if own.exact else 0.0,
            **rollout_stats(own.groups),
            **batch.sapo.metrics(),
            **(self.solve_rates.metrics() if self.receiver else {}),
            "peers": self.recent_peers(),
            "connections": len(self._peers),
            # the record peer ids (SPEC 1) this node follows at its next poll (SPEC 7.4, 11), most wanted first
            "following": self.channel.following() if self.channel is not None else [],
            # Python's small-object heap (pymalloc blocks in use): what a leak of Python objects grows, without the
            # allocator's caching that makes RSS swing by tens of MB between steps (the multi-process soak reads it)
            "py_heap_blocks": sys.getallocatedblocks(),
            # RSS between steps, after the update's trim (node.heap): what the soak judges, free of the step's own swing
            **dict(zip(("rss_mb", "rss_anon_mb"), (round(x, 1) for x in resident_mb() or ()), strict=False)),
            "transport_restarts": int((chan.get("transport") or {}).get("restarts", 0)),
            # keys this node's DHT stores for the swarm, and whether it runs as a DHT client (client_mode: auto)
            "dht_storage_keys": int((chan.get("transport") or {}).get("storage_keys", 0)),
            "dht_client_mode": int((chan.get("transport") or {}).get("client_mode", 0)),
            "published": chan.get("published", 0),
            "received": chan.get("received", 0),
            "rejected": sum(reasons.values()),
            "rejected_by_reason": dict(reasons),
            # index entries this node's DHT storage evicted from a full shard key (SPEC 7.4), by reason
            "shard_evicted_by_reason": dict(chan.get("evicted") or {}),
            "accepted_groups": self.ingest_counts.get("accepted", 0),
            "zero_advantage_groups": self.ingest_counts.get("zero_advantage", 0),
            "policy_version": self.learner.policy_version,
            "gen_s": round(times.gen_s, 4),
            "train_s": round(times.train_s, 4),
            "step_s": round(times.step_s, 4),
            "gen_tokens": gen_tokens,
            "gen_tokens_per_s": gen_tokens / times.gen_s if times.gen_s > 0 else 0.0,
            **self.engine.stats(),
            **self.pool.stats(self.step),
            **self.phase.metrics(),
            **self.planner.metrics(),
            # task plug-ins' failed calls by family and reason, and quarantined families (absent for built-ins only)
            **self.tasks.metrics(),
            "plugin_own_failures": self.totals.get("plugin_own_failures", 0),
            **self._pending_heldout,
        }
        self._pending_heldout = {}
        self.last_metrics = m
        if self._metrics is not None:
            self._metrics.write(m)
        if self._rollouts is not None:
            for g in own.groups:
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

    async def wait_for_peers(self, n: int, stop: asyncio.Event, announce: dict[str, Any] | None = None) -> int:
        """Wait until ``n`` peers' valid records have arrived (the background poll ingests them), for at most
        ``runtime.wait_for_peers_s`` or until ``stop`` is set; return how many were heard. A start barrier: nodes
        loading at different speeds begin their first step within a poll interval of each other. ``announce``
        (the step-0 evaluation) is published again every protocol window while waiting: peers fetch only the recent
        windows, so a node that loads long after this one would otherwise never hear it."""
        loop = asyncio.get_running_loop()
        timeout_s, every = self.cfg.runtime.wait_for_peers_s, float(self.cfg.protocol.window_seconds)
        deadline, next_announce = loop.time() + timeout_s, loop.time() + every
        logger.info("waiting for %d peer(s) before step %d (runtime.wait_for_peers)", n, self.step + 1)
        while (heard := self.recent_peers()) < n and not stop.is_set():
            now = loop.time()
            if now >= deadline:
                logger.warning(
                    "heard %d of %d peers in %g s (runtime.wait_for_peers_s): starting without the rest",
                    heard,
                    n,
                    timeout_s,
                )
                return heard
            if announce is not None and now >= next_announce:
                self._eval_outbox, next_announce = announce, now + every
                await self.publish_eval()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=min(0.25, deadline - now))
        logger.info("heard %d peer(s): starting", heard)
        return heard

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
                fresh = self.step == 0
                await asyncio.to_thread(self.evaluate_start)
                announce = self._eval_outbox
                self._spawn(self.publish_eval(), "publish-eval")
                if fresh and self.cfg.runtime.wait_for_peers and self.channel is not None:
                    await self.wait_for_peers(self.cfg.runtime.wait_for_peers, stop, announce)
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
