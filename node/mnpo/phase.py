"""The node's MNPO phase: shared-prompt responses, cross-scoring, pairs with opponents, and the MNPO update.

Multiplayer Nash Preference Optimization (Wu et al. 2025, arXiv 2509.23102) with the swarm as the population.
:class:`MnpoPhase` is the node's :class:`node.seams.StepPhase`; it receives what it uses (the learner, the task
source, the sample builder's tokenizer, a rollout callable, the node's step and the protocol window as callables,
the channel's publish) and never the node. The runtime calls its hooks:

* :meth:`MnpoPhase.generate` (blocking, after the node's own generation): answer this MNPO window's shared prompts
  (:func:`swarm.mnpo.window_rng`), then compute this player's length-averaged logprobs on a rendezvous-chosen
  sample of the pooled responses (own and peers') -- its cross-scores, also kept as its own history for TD-MNPO;
* :meth:`MnpoPhase.take_groups` / :meth:`MnpoPhase.publish`: the responses go out in the node's own ``rollouts``
  record, the scores as a ``scores`` record (``swarm.scores``): two records per publish, within peers' quotas;
* :meth:`MnpoPhase.ingest` (on the event loop, for each validated envelope): peers' responses to window prompts
  and peers' scores;
* :meth:`MnpoPhase.train` (blocking): pairs from the node's preference oracle (``node.mnpo.oracles``) over the pooled
  responses, opponents = peers whose scores cover the pair, else own history (``swarm.mnpo.select_opponents``), the
  loss of ``node.learn.losses`` (``mnpo`` or the ``dpo`` baseline, with the arguments its registry entry builds), one
  update through :meth:`node.learn.learner.Learner.preference_step` (the learner steps, clips and bumps the version).

Heterogeneous models and tokenizers work: every player re-tokenizes the texts with its own tokenizer, and only
its own log-ratios (player, reference) plus each opponent's own log-ratio enter the loss. The reference is a frozen
copy of the policy as it was when the phase started (the learner's KL reference if it keeps one).

Thread safety: ``ingest`` runs on the event loop while ``generate``/``train`` run in worker threads; the shared
bookkeeping is guarded by one lock, and forward/backward passes run outside it.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from node.config import MnpoConfig
from node.learn.batch import SampleBuilder
from node.learn.learner import Learner, PreferenceLoss
from node.learn.losses import get_loss, opponent_tensors
from node.mnpo.oracles import build_oracle
from node.rollout.groups import group_of
from node.seams import Generation, TasksLike
from node.tasks import TaskItem
from protocol.types import Envelope, Group, TaskRef
from swarm.mnpo import (
    History,
    Pair,
    Response,
    ResponseStore,
    ScoreBook,
    choose_pairs,
    ingest_window_rollouts,
    mnpo_window,
    pair_stats,
    score_sample,
    select_opponents,
    window_rng,
)
from swarm.pool import SELF
from swarm.scores import KIND as SCORES_KIND
from swarm.scores import MIN_LOGPROB, ScoreBatch, response_hash

logger = logging.getLogger(__name__)


#: ``rollout(refs, n, rng) -> (items, generations)``: the node's rollout engine with its sampling settings.
RolloutFn = Callable[[list[TaskRef], int, random.Random], tuple[list[TaskItem], Sequence[Sequence[Generation]]]]


class MnpoPhase:
    """MNPO state and steps of one node (see the module docstring)."""

    def __init__(
        self,
        cfg: MnpoConfig,
        *,
        learner: Learner,
        tasks: TasksLike,
        samples: SampleBuilder,
        rollout: RolloutFn,
        step: Callable[[], int],
        window_base: Callable[[], int],
        publish: Callable[[str, Any], Awaitable[object]] | None,
        swarm_id: str,
        task_seed: int,
        model_name: str,
        tokenizer_id: str,
        rng_seed: str,
    ) -> None:
        self.cfg = cfg
        self.learner = learner
        self.tasks = tasks
        self.samples = samples
        self.rollout = rollout
        self.step = step
        self.window_base = window_base
        self.publish_fn = publish
        self.swarm_id, self.task_seed = swarm_id, task_seed
        self.model_name, self.tokenizer_id = model_name, tokenizer_id
        self.spec = get_loss(cfg.loss)
        self.store = ResponseStore(
            keep_windows=cfg.keep_windows,
            max_per_sender=max(16, 2 * cfg.prompts_per_window * cfg.responses_per_prompt),
        )
        self.book = ScoreBook()
        self.history = History(cfg.history)
        self.device = learner.device
        ref = learner.ref_model
        self.ref_model: nn.Module = (
            ref if ref is not None else copy.deepcopy(learner.model).eval().requires_grad_(False)
        )
        self.oracle = build_oracle(
            cfg.oracle, tasks, prompt_of=lambda t: tasks.materialize(t).question, device=self.device
        )
        self.rng = random.Random(rng_seed)
        self._lock = threading.Lock()
        self._prompts: dict[int, list[TaskRef]] = {}
        self._ref_cache: dict[bytes, float] = {}
        self._pending_groups: list[Group] = []
        self._pending_scores: ScoreBatch | None = None
        self._window = -1
        self.counts: Counter[str] = Counter()
        self.last: dict[str, float] = {}
        self._own_rewards: list[float] = []
        self.pair_diagnostics: dict[str, float] = {}
        self._step_grpo = self.runs_grpo(step())
        self._step_mnpo = self.runs_mnpo(step())

    # ------------------------------------------------------------------ schedule and windows

    def runs_grpo(self, step: int) -> bool:
        """Whether the node's GRPO/SAPO update runs at ``step``."""
        s = self.cfg.schedule
        return s == "side_by_side" or (s == "alternate" and step % 2 == 0)

    def runs_mnpo(self, step: int) -> bool:
        """Whether the MNPO phase generates and trains at ``step``."""
        s = self.cfg.schedule
        return s in ("only", "side_by_side") or (s == "alternate" and step % 2 == 1)

    def current_window(self) -> int:
        """The MNPO window: the protocol window (or, without a network, the node's step) // span."""
        return mnpo_window(self.window_base(), self.cfg.window_span)

    def prompts(self, window: int) -> list[TaskRef]:
        """Window ``window``'s shared prompt set (the same on every player with the same ``tasks`` config)."""
        got = self._prompts.get(window)
        if got is None:
            rng = window_rng(self.swarm_id, self.task_seed, window)
            got = self.tasks.sample(rng, self.cfg.prompts_per_window)
            self._prompts[window] = got
            for w in [w for w in self._prompts if w < window - self.cfg.keep_windows - 1]:
                del self._prompts[w]
        return got

    def _task_windows(self, window: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in range(window - self.cfg.keep_windows + 1, window + 2):  # peers slightly ahead count too
            for t in self.prompts(w):
                out.setdefault(t.key(), w)
        return out

    def _advance(self, window: int) -> None:
        if window != self._window:
            self._window = window
            self.store.prune(window)
            self.book.prune(window - self.cfg.keep_windows + 1)
            live = {r.hash for r in self.store.responses()}
            self._ref_cache = {h: v for h, v in self._ref_cache.items() if h in live}

    # ------------------------------------------------------------------ logprobs

    def _mean_logprobs(self, model: nn.Module, responses: list[Response], *, grad: bool) -> Tensor:
        """Length-averaged logprobs ``(n,)`` of ``responses`` under ``model``, re-tokenized with the local tokenizer."""
        rows = [self.samples.tokenize(r.task, r.text, r.finish_reason) for r in responses]
        return self.learner.mean_logprobs(rows, model=model, grad=grad, micro_batch_size=self.cfg.micro_batch_size)

    def _ref_logprobs(self, responses: list[Response]) -> torch.Tensor:
        # One dict for the whole call: ``_advance`` (on the event loop, as records arrive) may swap in a pruned
        # copy while this runs in the learner's thread, and a lookup in the new one would miss.
        cache = self._ref_cache
        missing = [r for r in {r.hash: r for r in responses}.values() if r.hash not in cache]
        if missing:
            vals = self._mean_logprobs(self.ref_model, missing, grad=False)
            for r, v in zip(missing, vals.tolist(), strict=True):
                cache[r.hash] = v
        return torch.tensor([cache[r.hash] for r in responses], dtype=torch.float32, device=self.device)

    # ------------------------------------------------------------------ hooks

    def generate(self, step: int) -> None:
        """Answer the window's prompts and cross-score the pool at node step ``step`` (blocking; off the loop)."""
        self._step_grpo, self._step_mnpo = self.runs_grpo(step), self.runs_mnpo(step)
        self._own_rewards = []
        if not self._step_mnpo:
            return
        cfg = self.cfg
        window = self.current_window()
        with self._lock:
            self._advance(window)
            tasks = self.prompts(window)
        _, gens = self.rollout(list(tasks), cfg.responses_per_prompt, self.rng)
        groups = []
        own: list[Response] = []
        rewards: list[float] = []
        for task, comps in zip(tasks, gens, strict=True):
            hint = self._pointwise(task, [c.text for c in comps])
            rewards.extend(hint or [])
            groups.append(group_of(task, comps, hint))
            for c in comps:
                own.append(
                    Response(response_hash(task, c.text), task, c.text, SELF, window, c.finish_reason, c.policy_version)
                )
        with self._lock:
            for r in own:
                self.counts["own_" + self.store.add(r)] += 1
            sample = score_sample(self.store.responses(), cfg.max_scores, salt=f"mnpo-score:{window}")
        version = self.learner.policy_version
        with torch.no_grad():
            lps = self._mean_logprobs(self.learner.model, sample, grad=False).tolist() if sample else []
        lps = [min(0.0, max(MIN_LOGPROB, v)) if math.isfinite(v) else MIN_LOGPROB for v in lps]
        scores = {r.hash: v for r, v in zip(sample, lps, strict=True)}
        with self._lock:
            self.history.record(version, scores)
        self._own_rewards = rewards
        sb = ScoreBatch(
            window=window,
            model=self.model_name,
            tokenizer=self.tokenizer_id,
            policy_version=version,
            hashes=tuple(scores),
            logprob_means=tuple(scores.values()),
        )
        with self._lock:
            self._pending_groups.extend(groups)
            del self._pending_groups[: -4 * cfg.prompts_per_window]  # a slow network: keep the newest only
            self._pending_scores = sb

    def take_groups(self) -> list[Group]:
        """This player's new response groups, for the node's next ``rollouts`` record (one record carries both the
        node's GRPO groups and these, which keeps the node within the peers' per-window record quota)."""
        with self._lock:
            out, self._pending_groups = self._pending_groups, []
        return out

    def _pointwise(self, task: TaskRef, texts: list[str]) -> list[float] | None:
        scores = getattr(self.oracle, "scores", None)
        if scores is None:
            return None
        try:
            return [float(x) for x in scores(task, texts)]
        except Exception as e:  # an oracle failing on one prompt costs that prompt's metric, not the node
            logger.debug("oracle failed on %s: %r", task.family, e)
            return None

    async def publish(self) -> None:
        """Publish the latest cross-scores as a ``scores`` record (the responses travel in the node's ``rollouts``
        record, :meth:`take_groups`); network errors are counted, never raised."""
        with self._lock:
            scores, self._pending_scores = self._pending_scores, None
        if self.publish_fn is None or scores is None:
            return
        try:
            await self.publish_fn(SCORES_KIND, scores)
            self.counts["published_scores"] += 1
        except Exception as e:  # the network failing must not stop training
            self.counts["publish_errors"] += 1
            logger.warning("MNPO publish of scores failed: %s", e)

    def ingest(self, env: Envelope) -> None:
        """Take peers' window responses and scores from a validated envelope (never raises)."""
        try:
            with self._lock:
                window = self.current_window()
                self._advance(window)
                if env.kind == "rollouts":
                    for k, v in ingest_window_rollouts(self.store, env, self._task_windows(window)).items():
                        self.counts["peer_" + k] += v
                elif env.kind == SCORES_KIND and isinstance(env.payload, ScoreBatch):
                    if env.payload.window >= window - self.cfg.keep_windows + 1:
                        self.counts[
                            "scores_" + ("kept" if self.book.add(env.sender, env.seq, env.payload) else "old")
                        ] += 1
                    else:
                        self.counts["scores_stale"] += 1
        except Exception as e:  # peer data must never crash the node
            self.counts["ingest_errors"] += 1
            logger.debug("MNPO ingest failed on a record from %s: %r", env.sender[:8], e)

    def build_pairs(self) -> list[Pair]:
        """Pairs from the oracle over the pooled responses, with their opponents, decisive then best covered first.

        Also sets :attr:`pair_diagnostics`, what limits the preference signal (empty when no prompt pooled two
        responses): the prompts that did, their distinct responses per prompt, the candidate pairs, the oracle's
        ties (pairs of distinct responses it leaves unordered) and, with an oracle that knows exactness, the chosen
        pairs exactness decided (a right answer over a wrong one: :attr:`Pair.decisive`; its tie-breaks decided the
        rest)."""
        cfg = self.cfg
        with self._lock:
            groups = self.store.by_task()
        candidates: list[Pair] = []
        right: dict[bytes, bool] = {}
        ties = distinct = prompts = 0
        for responses in groups.values():
            if len(responses) < 2:
                continue
            texts = [r.text for r in responses]
            try:
                idx = self.oracle.pairs(responses[0].task, texts, self.rng)
            except Exception as e:  # e.g. a task this node will not regenerate
                logger.debug("oracle failed on %s: %r", responses[0].task.family, e)
                self.counts["oracle_errors"] += 1
                continue
            n = len(set(texts))
            prompts, distinct, ties = prompts + 1, distinct + n, ties + max(0, n * (n - 1) // 2 - len(idx))
            exact = self._exact_flags(responses[0].task, texts)
            if exact is not None:
                right.update((r.hash, x) for r, x in zip(responses, exact, strict=True))
            with self._lock:
                for i, j in idx:
                    w, lo = responses[i], responses[j]
                    opps = select_opponents(
                        w.hash,
                        lo.hash,
                        source=cfg.opponents,
                        book=self.book,
                        history=self.history,
                        max_opponents=cfg.max_opponents,
                        rng=self.rng,
                    )
                    decisive = right.get(w.hash, False) and not right.get(lo.hash, False)
                    candidates.append(Pair(w, lo, tuple(opps), decisive))
        chosen = choose_pairs(candidates, cfg.pairs_per_step, self.rng)
        self.pair_diagnostics = {}
        if not prompts:  # nothing pooled to judge: no figures, rather than zeros that drag a run's means down
            return chosen
        self.pair_diagnostics = {
            "mnpo_pool_prompts": float(prompts),
            "mnpo_distinct_per_prompt": distinct / prompts,
            "mnpo_candidates": float(len(candidates)),
            "mnpo_ties": float(ties),
        }
        if right:
            self.pair_diagnostics["mnpo_exact_pairs"] = float(sum(p.decisive for p in chosen))
        return chosen

    def _exact_flags(self, task: TaskRef, texts: list[str]) -> list[bool] | None:
        """The oracle's exact flags for ``texts``, or ``None`` (an oracle that does not know, or fails: the pairs
        still train, only not decisive first)."""
        try:
            flags = self.oracle.exact(task, texts)
            if flags is not None and len(flags) != len(texts):
                raise ValueError(f"{len(flags)} exact flags for {len(texts)} texts")
        except Exception as e:
            logger.debug("oracle's exact flags failed on %s: %r", task.family, e)
            self.counts["exact_errors"] += 1
            return None
        return None if flags is None else [bool(x) for x in flags]

    def train(self) -> dict[str, float]:
        """One MNPO update on this step's pairs (blocking); ``{}`` when MNPO does not run this step."""
        if not self._step_mnpo:
            self.last = {}
            return {}
        pairs = self.build_pairs()
        stats = {**pair_stats(pairs), **self.pair_diagnostics}
        if self._own_rewards:
            stats["mnpo_reward_mean"] = math.fsum(self._own_rewards) / len(self._own_rewards)
        if not pairs:
            self.last = stats
            return stats
        cfg, learner = self.cfg, self.learner
        wins = [p.win for p in pairs]
        loses = [p.lose for p in pairs]
        n_pairs = len(pairs)
        opp_w, opp_l, mask = opponent_tensors(
            [[(o.lp_w, o.lp_l) for o in p.opponents] for p in pairs], cfg.max_opponents
        )  # (P, J) each
        ref = self._ref_logprobs(wins + loses)  # (2P,)
        version = learner.policy_version
        own: dict[bytes, float] = {}
        pulls: dict[int, list[float]] = {}  # micro-batch start -> its pairs' pulls (the loss's per-pair metric)

        def part(lo: int, hi: int) -> PreferenceLoss:
            def loss_fn(model: nn.Module) -> tuple[Tensor, dict[str, Tensor]]:
                sel = wins[lo:hi] + loses[lo:hi]
                player = self._mean_logprobs(model, sel, grad=True)  # (2p,)
                own.update(zip([r.hash for r in sel], player.detach().tolist(), strict=True))
                n = hi - lo
                loss, metrics = self.spec.fn(
                    player[:n],
                    player[n:],
                    ref[lo:hi],
                    ref[n_pairs + lo : n_pairs + hi],
                    opp_w[lo:hi].to(self.device),
                    opp_l[lo:hi].to(self.device),
                    mask[lo:hi].to(self.device),
                    **self.spec.kwargs(cfg),
                )
                pull = metrics.pop("pull", None)
                if pull is not None:
                    pulls[lo] = pull.tolist()
                return loss, metrics

            return loss_fn

        # The loss is a mean over independent pairs: micro-batches of pairs (two sequences each), weighted by their
        # share, give the whole batch's gradient while memory holds one micro-batch's activations.
        per = max(1, cfg.micro_batch_size // 2)
        bounds = [(lo, min(lo + per, n_pairs)) for lo in range(0, n_pairs, per)]
        update = learner.preference_step([((hi - lo) / n_pairs, part(lo, hi)) for lo, hi in bounds])
        with self._lock:
            self.history.record(version, own)
        loss, grad_norm = update.pop("loss"), update.pop("grad_norm")
        stats.update(self._decisive_pull(pairs, [x for lo in sorted(pulls) for x in pulls[lo]]))
        stats.update({f"mnpo_{k}": v for k, v in update.items() if k not in ("opponents", "covered_frac")})
        stats.update(mnpo_loss=loss, mnpo_grad_norm=grad_norm)
        self.last = stats
        return stats

    def _decisive_pull(self, pairs: list[Pair], pulls: list[float]) -> dict[str, float]:
        """``mnpo_decisive_pull``: the share of the update's pull (``sum |pull|`` over the pairs) that pairs a right
        answer decided carry, signed (a pair pushed away from its winner counts against); compare it with their
        share of the pairs (``mnpo_exact_pairs / mnpo_pairs``) to see whether the loss weighs exactness or the
        tie-breaks. Empty without exact flags (an oracle that does not know) or without one pull per pair."""
        total = math.fsum(abs(x) for x in pulls)
        if "mnpo_exact_pairs" not in self.pair_diagnostics or len(pulls) != len(pairs) or not total > 0:
            return {}
        return {"mnpo_decisive_pull": math.fsum(x for x, p in zip(pulls, pairs, strict=True) if p.decisive) / total}

    def metrics(self) -> dict[str, Any]:
        """This step's MNPO metrics for the node's metrics line (``reward_mean`` too when GRPO did not run)."""
        out: dict[str, Any] = dict(self.last)
        with self._lock:
            out["mnpo_pool_responses"] = len(self.store)
            out["mnpo_score_peers"] = len(self.book)
        out["mnpo_counts"] = dict(self.counts)
        if not self._step_grpo and "mnpo_reward_mean" in out:
            out["reward_mean"] = out["mnpo_reward_mean"]
        return out
