"""Batch -> samples: the groups SAPO sampled for a step, as learner samples with their advantages.

* own groups train on the engine's exact tokens and per-token behaviour logprobs
  (:class:`node.rollout.groups.OwnRollouts`);
* peers' groups are re-tokenized here, once, with the local tokenizer (:meth:`SampleBuilder.tokenize`, which the
  MNPO phase uses too); their behaviour information is the sender's mean logprob, an untrusted hint that is
  clamped, and used only when the sender's tokenizer is ours (``sapo.peer_importance_weights``);
* advantages are computed here, in one place, from the rewards this node gave each group
  (``node.learn.losses.advantages_for``), and travel with the samples: the loss never recomputes them.

Knows nothing about how groups were chosen (``swarm.sapo``), the network, or tensors beyond the advantage helper.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from node.seams import BEHAVIOUR_LOGPROB_FLOOR, Generation, PolicyLike, TasksLike, TrainSample
from node.tasks import TaskItem, extract_answer, format_answer
from protocol.types import TaskRef
from swarm.pool import SOLVED, PooledGroup, solve_share
from swarm.sapo import SapoBatch

#: Behaviour log-prob hints from peers are clamped to this range (per-token mean, nats); the learner clamps
#: peers' values to the same range.
HINT_RANGE = (BEHAVIOUR_LOGPROB_FLOOR, 0.0)


@dataclass
class TrainBatch:
    """What one learner step trains on: the SAPO batch (for metrics) and its samples."""

    sapo: SapoBatch
    samples: list[TrainSample]


def clamp_hint(hint: float | None) -> float | None:
    """A peer's mean behaviour logprob, clamped to :data:`HINT_RANGE`; None when absent or not finite."""
    if hint is None or not math.isfinite(hint):
        return None
    return min(max(float(hint), HINT_RANGE[0]), HINT_RANGE[1])


class SampleBuilder:
    """Turns sampled groups into :class:`TrainSample` s for one policy's tokenizer and prompt format."""

    def __init__(
        self,
        policy: PolicyLike,
        tasks: TasksLike,
        *,
        max_new_tokens: int,
        advantages: Callable[[Sequence[float]], list[float]],
        peer_importance_weights: bool = True,
        peer_advantages: Callable[[PooledGroup], list[float]] | None = None,
        peer_text: str = "full",
        guided_negatives: str = "keep",
        trace_own: bool = False,
        trace_texts: str = "all",
    ) -> None:
        self.policy = policy
        self.tasks = tasks
        self.max_new_tokens = max_new_tokens
        self.advantages = advantages
        self.peer_importance_weights = peer_importance_weights
        #: Credits peers' groups another way than group-relative (``sapo.peer_advantage: receiver``); their
        #: completions credited 0 are then left out, since they would only dilute the token-mean loss.
        self.peer_advantages = peer_advantages
        #: ``sapo.peer_text``: ``answer`` trains on a peer completion's answer only (the labels-only control).
        self.peer_text = peer_text
        #: ``sapo.guided_negatives``: ``drop`` leaves a mixed group's own below-baseline completions out.
        self.guided_negatives = guided_negatives
        #: ``learner.trace_own``: this node's own right completions are marked ``trace`` too (the trace step's
        #: rehearsal of what the node knows).
        self.trace_own = trace_own
        #: ``sapo.trace_texts``: which of a trace group's right texts become trace rows (``all``, ``mode``, or the
        #: ``generator`` diagnostic).
        self.trace_texts = trace_texts

    def prompt_ids(self, task: TaskRef) -> list[int]:
        """The local prompt tokens of ``task`` (regenerated from its ref, formatted as this policy prompts)."""
        item = self.tasks.materialize(task)
        return self.policy.encode(self.policy.format_prompt(item.question))

    def completion_ids(self, text: str, finish_reason: str) -> list[int]:
        """``text`` in local tokens, cut to the token budget; EOS appended when the sender's completion stopped."""
        ids = self.policy.encode(text)[: self.max_new_tokens]
        eos = self.policy.tokenizer.eos_token_id
        if finish_reason == "stop" and eos is not None and len(ids) < self.max_new_tokens:
            ids.append(eos)
        return ids

    def tokenize(self, task: TaskRef, text: str, finish_reason: str) -> tuple[list[int], list[int]]:
        """``(prompt_ids, completion_ids)`` of a completion someone (a peer, or this node earlier) wrote as text."""
        return self.prompt_ids(task), self.completion_ids(text, finish_reason)

    def build(self, batch: SapoBatch, generations: Mapping[str, Sequence[Generation]]) -> list[TrainSample]:
        """Samples of every group in ``batch``; own groups' tokens come from ``generations`` (by group key)."""
        samples: list[TrainSample] = []
        own_tokenizer = self.policy.tokenizer_id
        for g in batch.groups:
            credit = None if g.local else self.peer_advantages
            receiver = credit is not None
            advs = credit(g) if credit is not None else self.advantages(g.rewards)
            if g.local:
                for gen, adv, r in zip(generations[g.key], advs, g.rewards, strict=True):
                    if gen.token_ids:
                        samples.append(self._own(gen, adv, r))
                continue
            prompt_ids = self.prompt_ids(g.group.task)
            use_hint = self.peer_importance_weights and g.tokenizer == own_tokenizer
            for comp, adv in zip(g.group.completions, advs, strict=True):
                if receiver and adv == 0.0:
                    continue
                text = self._peer_text(comp.text)
                ids = self.completion_ids(text, comp.finish_reason) if text else []
                if not ids:
                    continue
                hint = clamp_hint(comp.logprob_mean) if use_hint else None
                samples.append(TrainSample(prompt_ids, ids, adv, None, hint, external=True, family=g.group.task.family))
        return samples

    def guided(self, own: PooledGroup, generations: Sequence[Generation], guide: PooledGroup) -> list[TrainSample]:
        """One mixed group (LUFFY's Mixed-Policy GRPO, Yan et al. 2025, arXiv 2504.14945): this node's own ``G``
        completions of a peer's prompt and the peer's completions of it that this node's verifier scored right
        (``guide.rewards`` are the receiver's own scores, from ingest), under one group baseline,
        ``A_i = (r_i - mean(G_on + G_off)) / std(G_on + G_off)`` (as the loss preset scales advantages). Own samples
        train on the engine's tokens with their behaviour logprobs; the peer's are marked ``guided`` (shaped, no
        clip, no importance weight). The peer's wrong completions are never trained on; with ``guided_negatives: drop``
        neither are this node's own completions credited below zero."""
        peer_ids = self._right_peer_ids(guide)
        advs = self.advantages([*own.rewards, *[1.0] * len(peer_ids)])
        keep_negative = self.guided_negatives == "keep"
        samples = [
            self._own(gen, adv, r)
            for gen, adv, r in zip(generations, advs, own.rewards, strict=False)
            if gen.token_ids and (keep_negative or adv >= 0.0)
        ]
        if not peer_ids:
            return samples
        prompt_ids = self.prompt_ids(guide.group.task)
        family = guide.group.task.family
        own_solve = solve_share(own.rewards) if own.rewards else None
        samples += [
            TrainSample(prompt_ids, ids, adv, external=True, guided=True, family=family, trace=True,
                        own_solve=own_solve, source=guide.source)
            for ids, adv in zip(peer_ids, advs[len(own.rewards) :], strict=True)
        ]  # fmt: skip
        return samples

    def traces(self, guide: PooledGroup, credit: float | None = None) -> list[TrainSample]:
        """A ``sapo.trace_groups`` group: the peer's completions this node's verifier scored right (``guide.rewards``,
        from ingest), as rows for the trace step only (``trace_only``: no RL row, no rollout of this node on the
        prompt, so no own solve share). With ``credit`` (``sapo.trace_credit``) each distinct text is instead one
        row of both the RL update, at advantage ``credit`` with no importance weight (as ``labels`` credits a gold
        trace), and the trace step; its repeats are left out (the trace step keeps distinct texts only)."""
        prompt_ids = self.prompt_ids(guide.group.task)
        rows = self._trace_texts(guide, self._right_peer_ids(guide))
        if credit is not None:
            rows = list({tuple(r): r for r in rows}.values())
        return [
            TrainSample(prompt_ids, row, 0.0 if credit is None else credit, external=True,
                        family=guide.group.task.family, trace=True, trace_only=credit is None, source=guide.source)
            for row in rows
        ]  # fmt: skip

    def _trace_texts(self, guide: PooledGroup, rows: list[list[int]]) -> list[list[int]]:
        """``sapo.trace_texts`` on a trace group's right rows: ``all`` keeps them; ``mode`` keeps the copies of the
        text the peer wrote most often among them (the first of equals), the working it writes with confidence, not
        a right answer reached once by other working; ``generator`` (a diagnostic of the laboratory families, whose
        generator writes the working) keeps the texts equal to the generator's own completion."""
        if self.trace_texts == "mode" and rows:
            counts = Counter(tuple(r) for r in rows)
            top = max(counts.values())
            mode = next(r for r in rows if counts[tuple(r)] == top)
            return [r for r in rows if r == mode]
        if self.trace_texts == "generator" and rows:
            written = self.tasks.trace(self.tasks.materialize(guide.group.task))
            want = self.completion_ids(written, "stop") if written else None
            return [r for r in rows if r == want]
        return rows

    def _right_peer_ids(self, guide: PooledGroup) -> list[list[int]]:
        """The token ids of the peer's completions this node's verifier scored right (``guide.rewards``), as
        ``sapo.peer_text`` has them; a completion left empty (no answer to keep) is none."""
        right = [c for c, r in zip(guide.group.completions, guide.rewards, strict=True) if r >= SOLVED]
        texts = [(self._peer_text(c.text), c.finish_reason) for c in right]
        return [ids for ids in (self.completion_ids(t, fr) for t, fr in texts if t) if ids]

    def _own(self, gen: Generation, adv: float, reward: float) -> TrainSample:
        """One of this node's own completions: trained on the engine's tokens with their behaviour logprobs."""
        right = reward >= SOLVED
        return TrainSample(gen.prompt_ids, list(gen.token_ids), adv, list(gen.logprobs), right=right,
                           trace=self.trace_own and right)  # fmt: skip

    def _peer_text(self, text: str) -> str:
        if self.peer_text == "full":
            return text
        answer = extract_answer(text)
        return "" if answer is None else format_answer(answer)

    def labels(
        self, items: Sequence[TaskItem], credit: Callable[[str], float], *, trace: bool, trace_only: bool = False
    ) -> list[TrainSample]:
        """Gold-label samples (``labels``): each item's own gold completion -- ``<answer>gold</answer>``, or with
        ``trace`` the family's written working first where it writes one (its ``trace`` method, e.g. the laboratory
        families') -- plus EOS, with advantage ``credit(family)``. No behaviour information: the learner treats them
        like a peer's completion. ``trace_only`` (``labels.trace_only``): written traces go to the trace step only."""
        samples = []
        for item in items:
            if item.answer is None:
                continue
            written = self.tasks.trace(item) if trace else None
            text = written or format_answer(item.answer)
            samples.append(
                TrainSample(self.prompt_ids(item.ref), self.completion_ids(text, "stop"), credit(item.ref.family),
                            None, None, external=True, trace=written is not None,
                            trace_only=trace_only and written is not None)
            )  # fmt: skip
        return samples
