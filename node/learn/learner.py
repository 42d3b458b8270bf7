"""The node's local learner: one GRPO-family optimizer update per call on a batch of scored completions.

It turns :class:`TrainSample` s (own rollouts and re-tokenized peer rollouts) into padded tensors, computes
completion logprobs under the current policy micro-batch by micro-batch, weights off-policy tokens with
truncated importance sampling (DART), applies the loss preset named by ``LearnerConfig.loss`` (see
``node.learn.losses``), clips the gradient and steps AdamW. It is synchronous: the runtime calls :meth:`Learner.step`
through ``asyncio.to_thread``. The learner is the one owner of the optimizer: every update (policy gradient, or
MNPO's preference loss through :meth:`Learner.preference_step`) zeroes, clips, steps and bumps ``policy_version``
here. It knows nothing about rollouts, peers, rewards or checkpoint files; advantages arrive already computed
(``node.learn.batch``).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, overload

import torch
from torch import Tensor, nn

from node.config import LearnerConfig
from node.learn.losses import LossSpec, get_loss, sequence_is_weights, truncated_is_weights
from node.seams import BEHAVIOUR_LOGPROB_FLOOR, TrainSample

logger = logging.getLogger(__name__)

#: Log-ratio above the cap (0.1%) before a token counts as truncated in ``is_truncated_frac``.
TRUNCATION_TOLERANCE = 1e-3


@overload
def completion_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_lens: Tensor,
    completion_lens: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: Literal[False] = False,
) -> Tensor: ...
@overload
def completion_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_lens: Tensor,
    completion_lens: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool,
) -> Tensor | tuple[Tensor, Tensor]: ...
def completion_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_lens: Tensor,
    completion_lens: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Logprobs of the completion tokens of right-padded ``prompt + completion`` rows.

    Only positions from the shortest prompt onward are projected to the vocabulary (``logits_to_keep`` where
    the model supports it), and each kept position is reduced to one number (``logit[target] - logsumexp``)
    without a full ``log_softmax`` copy of the logits.

    Args:
        model: a Hugging Face causal LM (``model(input_ids=..., attention_mask=...).logits``).
        input_ids: ``(B, L)`` prompt then completion, right-padded.
        attention_mask: ``(B, L)``.
        prompt_lens: ``(B,)`` prompt lengths ``P_i >= 1``.
        completion_lens: ``(B,)`` completion lengths ``C_i``.
        temperature: logits are divided by it (match the rollout engine's sampling temperature).
        with_entropy: also return the detached entropy ``H = logsumexp(z) - sum softmax(z) * z`` of each position's
            next-token distribution, ``(B, T)``, 0 beyond ``C_i`` (for high-entropy token selection).

    Returns:
        ``(B, T)`` with ``T = max C_i``: entry ``(i, j)`` is ``log pi(completion_ij | prefix)``, 0 beyond ``C_i``
        (and the entropies when ``with_entropy``).
    """
    picked, targets, mask = _completion_logits(model, input_ids, attention_mask, prompt_lens, completion_lens)
    if temperature != 1.0:
        picked = picked / temperature
    lse = torch.logsumexp(picked, dim=-1)  # (B, T)
    logp = picked.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse  # (B, T)
    if not with_entropy:
        return logp * mask
    with torch.no_grad():
        entropy = lse - (picked.softmax(dim=-1) * picked).sum(-1)  # (B, T)
    return logp * mask, entropy * mask


def _completion_logits(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, prompt_lens: Tensor, completion_lens: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The float logits ``(B, T, V)`` at the positions that predict each row's completion tokens, the tokens
    ``(B, T)`` and the mask ``(B, T)`` of real ones (``T = max C_i``); arguments as :func:`completion_logprobs`."""
    batch, length = input_ids.shape
    start = int(prompt_lens.min()) - 1  # first position whose logits predict a completion token
    kwargs = {}
    if _accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = length - start
    logits = model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits  # (B, K, V)
    logits = logits[:, -(length - start) :, :]  # (B, L - start, V) whatever the model kept
    t_max = int(completion_lens.max())
    offsets = torch.arange(t_max, device=input_ids.device)  # (T,)
    # Position p's logits predict token p + 1: completion token j of row i sits at P_i + j.
    pos = (prompt_lens.unsqueeze(-1) - 1 + offsets).clamp(max=length - 2)  # (B, T) absolute positions
    targets = input_ids.gather(1, pos + 1)  # (B, T)
    picked = logits.gather(1, (pos - start).unsqueeze(-1).expand(batch, t_max, logits.shape[-1]))  # (B, T, V)
    return picked.float(), targets, offsets < completion_lens.unsqueeze(-1)


def completion_kl(
    model: nn.Module,
    ref_model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_lens: Tensor,
    completion_lens: Tensor,
) -> Tensor:
    """``KL(pi_ref || pi)`` over the whole vocabulary at each completion position, ``(B, T)``, 0 beyond ``C_i``:
    ``sum_v pi_ref(v | s) * (log pi_ref(v | s) - log pi(v | s))`` on the states ``s`` of the given rows, with a
    gradient through ``model`` only. Unlike the sampled k3 estimate of the RL loss's guard, it sees every token the
    reference would write at a state, so it holds a distribution in place even where the sampled token is already
    near-certain. Arguments as :func:`completion_logprobs`."""
    logits, _, mask = _completion_logits(model, input_ids, attention_mask, prompt_lens, completion_lens)
    with torch.no_grad():
        ref_logits, _, _ = _completion_logits(ref_model, input_ids, attention_mask, prompt_lens, completion_lens)
        ref_logp = ref_logits.log_softmax(dim=-1)
    kl = (ref_logp.exp() * (ref_logp - logits.log_softmax(dim=-1))).sum(-1)  # (B, T)
    return kl * mask


def by_length(rows: Sequence[TrainSample]) -> list[TrainSample]:
    """``rows`` shortest first (prompt + completion; stable), so the micro-batches cut from them pad little: a row's
    loss and gradient do not depend on the rows it shares a micro-batch with, only the padding does."""
    return sorted(rows, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))


def high_entropy_mask(entropy: Tensor, mask: Tensor, top_frac: float) -> Tensor:
    """1 for the ``ceil(top_frac * N)`` valid tokens with the highest entropy, 0 elsewhere (ties kept).

    The "80/20" selection (Wang et al. 2025, Beyond the 80/20 Rule, arXiv 2506.01939; DART's optional token
    selection): the policy gradient on the high-entropy "forking" minority carries most of the learning signal.
    ``entropy, mask  # (B, T)``; returns ``(B, T)`` float, no gradient."""
    valid = mask.to(torch.bool)
    n = int(valid.sum())
    if top_frac >= 1.0 or n == 0:
        return valid.to(entropy.dtype)
    k = max(1, math.ceil(top_frac * n))
    threshold = entropy[valid].topk(k).values.min()
    return (valid & (entropy >= threshold)).to(entropy.dtype)


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


#: ``loss_fn(model) -> (loss, metrics)``: one part of a preference step's loss (:meth:`Learner.preference_step`).
PreferenceLoss = Callable[[nn.Module], tuple[Tensor, dict[str, Tensor]]]


@dataclass
class _Batch:
    """Padded tensors of one micro-batch."""

    input_ids: Tensor  # (b, L)
    attention_mask: Tensor  # (b, L)
    prompt_lens: Tensor  # (b,)
    completion_lens: Tensor  # (b,)
    mask: Tensor  # (b, T)
    advantages: Tensor  # (b,)
    behaviour_logp: Tensor  # (b, T) per-token behaviour logprobs (valid where has_token_behaviour)
    has_token_behaviour: Tensor  # (b,) bool
    behaviour_mean: Tensor  # (b,) sequence-mean hint (valid where has_mean_behaviour)
    has_mean_behaviour: Tensor  # (b,) bool
    external: Tensor  # (b,) bool: a peer's sample
    guided: Tensor  # (b,) bool: a peer's sample trained as off-policy guidance
    families: list[str]  # (b,) the task family of each peer's sample ("" for own)


class PeerTokenStats:
    """Per task family, what peers' completions weigh in an update (the transfer diagnosis, issue 67).

    For the peers' rows of each micro-batch: completions and tokens that reached the learner, the mean importance
    weight of their tokens and the share weighted below 1/2 (where the receiver is unlike the sender the truncated
    ratio ``min(pi_old / pi_peer, 1)`` vanishes), their mean log-probability under the receiver, and for guided rows
    the mean gradient weight LUFFY's shaping gives a token, ``gamma p / (p + gamma)^2`` (1 would be a likelihood
    loss's). A single update per batch means the clipped surrogate never clips (``rho = 1`` at ``pi_old``), so a
    clipped share is not kept. Sums only, no ``.item()`` per micro-batch; :meth:`metrics` divides once.
    """

    KEYS = ("n", "tokens", "w", "w_low", "logp", "shaping")

    def __init__(self) -> None:
        self.sums: dict[str, dict[str, Tensor]] = {}

    def add(self, batch: _Batch, old_logp: Tensor, weights: Tensor, gamma: float) -> None:
        families = sorted({f for f in batch.families if f})
        if not families:
            return
        mask = batch.mask.to(old_logp.dtype)  # (b, T)
        p = old_logp.exp()  # (b, T)
        shaping = gamma * p / (p + gamma) ** 2 * batch.guided.unsqueeze(-1).to(mask.dtype)  # (b, T) guided rows only
        for fam in families:
            rows = torch.tensor([f == fam for f in batch.families], device=mask.device)  # (b,)
            m = mask * rows.unsqueeze(-1).to(mask.dtype)  # (b, T)
            acc = self.sums.setdefault(fam, {k: torch.zeros((), device=mask.device) for k in self.KEYS})
            acc["n"] += rows.sum()
            acc["tokens"] += m.sum()
            acc["w"] += (weights * m).sum()
            acc["w_low"] += ((weights < 0.5).to(m.dtype) * m).sum()
            acc["logp"] += (old_logp * m).sum()
            acc["shaping"] += (shaping * m).sum()

    def metrics(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for fam, acc in self.sums.items():
            tok = acc["tokens"].clamp(min=1.0)
            out |= {
                f"peer_completions_{fam}": acc["n"],
                f"peer_tokens_{fam}": acc["tokens"],
                f"peer_is_weight_{fam}": acc["w"] / tok,
                f"peer_weight_low_frac_{fam}": acc["w_low"] / tok,
                f"peer_logp_{fam}": acc["logp"] / tok,
                f"peer_shaping_weight_{fam}": acc["shaping"] / tok,
            }
        return out


class Learner:
    """AdamW learner for the GRPO-family losses, with micro-batching and truncated importance sampling.

    ``policy_version`` counts optimizer updates; the runtime tags rollouts with it. With ``beta > 0`` a frozen
    copy of the model as it is at construction time serves as the KL reference. Dropout is off throughout
    (the model stays in ``eval`` mode), so pi_old and the trained policy are the same function before the update.
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: LearnerConfig,
        *,
        device: torch.device | str,
        pad_token_id: int,
        max_tokens: int,
        temperature: float = 1.0,
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.pad_token_id = pad_token_id
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.spec: LossSpec = get_loss(cfg.loss)
        if self.spec.kind != "policy_gradient":
            raise ValueError(f"loss {cfg.loss!r} is a {self.spec.kind!r} loss; this learner trains policy_gradient")
        self.eps_low = cfg.eps_low
        self.eps_high = cfg.eps_high if self.spec.clip_higher else cfg.eps_low
        self.model = model.to(self.device)
        self.model.eval()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        #: The trace step's own AdamW state (``learner.trace_lr``; None when off): its moments are the verified
        #: working's alone, so the RL update's state does not set its scale.
        self.trace_optimizer: torch.optim.Optimizer | None = None
        if getattr(cfg, "trace_lr", 0.0) > 0:
            self.trace_optimizer = torch.optim.AdamW(self.params, lr=cfg.trace_lr, weight_decay=cfg.weight_decay)
        self.ref_model: nn.Module | None = None
        if cfg.beta > 0 or getattr(cfg, "trace_anchor", 0.0) > 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        #: ``learner.trace_anchor``: a uniform reservoir of ``trace_anchor_rows`` of this node's own right
        #: completions over the whole run (prompt and completion tokens), whose states the anchor holds. Kept
        #: across steps because the step's own right completions alone select against exactly the states the
        #: model has drifted on (they are the ones that stopped being right). Saved in checkpoints.
        self.anchor_pool: list[TrainSample] = []
        self.anchor_seen = 0
        #: ``learner.trace_batch``: the trace step's replay buffer of distinct verified traces, oldest first (token
        #: ids only), and the keys it holds. Saved in checkpoints.
        self.trace_buffer: list[TrainSample] = []
        self.trace_keys: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        self.policy_version = 0

    def keep_anchor(self, rows: Sequence[TrainSample]) -> None:
        """Offer ``rows`` to the anchor reservoir (Vitter's algorithm R; the slot a row may take is a hash of the
        seed and its index, so a resumed run continues the same draws without saving an RNG)."""
        size = int(getattr(self.cfg, "trace_anchor_rows", 64))
        for row in rows:
            kept = TrainSample(list(row.prompt_ids), list(row.completion_ids), 0.0)
            if len(self.anchor_pool) < size:
                self.anchor_pool.append(kept)
            else:
                digest = hashlib.blake2b(f"{self.cfg.seed}:{self.anchor_seen}".encode(), digest_size=8).digest()
                slot = int.from_bytes(digest, "big") % (self.anchor_seen + 1)
                if slot < size:
                    self.anchor_pool[slot] = kept
            self.anchor_seen += 1

    def select_traces(self, rows: Sequence[TrainSample]) -> tuple[list[TrainSample], dict[str, float]]:
        """The rows the trace step trains on this step. With ``learner.trace_batch`` (B > 0): ``rows`` deduplicated
        (a specialist writes one right text per problem, many times), the new distinct ones added to the replay
        buffer, and B of them returned: this step's new ones first, then a uniform draw without replacement of
        earlier ones (an RNG of the seed and the policy version, so a resumed run continues the same draws). Also
        returns ``trace_new`` (new distinct traces), ``trace_dup`` (rows dropped as already held) and
        ``trace_buffer`` (its size). With B = 0, ``rows`` as they come and no metrics.

        With traces of more than one source in the buffer (peers, or a peer and this node), slots and room are
        shared by **groups** (a source's prompt), not by distinct texts (:meth:`_share_by_groups`): deduplication
        keeps every distinct text, so a peer that writes a different right text each time would otherwise take the
        whole trace batch and buffer with the same number of groups an honest specialist sends as duplicates. A
        source's groups are what the sampler already bounds (``sapo.max_per_peer``, the newcomers' budget), so
        its share of the trace step is bounded by the same numbers. With one source nothing changes."""
        batch = int(getattr(self.cfg, "trace_batch", 0))
        if batch <= 0:
            return list(rows), {}
        fresh: list[TrainSample] = []
        for row in rows:
            key = (tuple(row.prompt_ids), tuple(row.completion_ids))
            if key not in self.trace_keys:
                self.trace_keys.add(key)
                fresh.append(
                    TrainSample(list(key[0]), list(key[1]), 0.0, family=row.family, trace=True, source=row.source)
                )
        older = self.trace_buffer
        size = int(getattr(self.cfg, "trace_buffer_rows", 2048))
        if len({r.source for r in older} | {r.source for r in fresh}) > 1:
            chosen, self.trace_buffer = self._share_by_groups(fresh, older, batch, size)
        else:
            chosen = fresh[:batch]
            if len(chosen) < batch and older:
                draw = random.Random(f"{self.cfg.seed}:{self.policy_version}")
                chosen += [older[i] for i in draw.sample(range(len(older)), min(batch - len(chosen), len(older)))]
            self.trace_buffer = (older + fresh)[-size:]
        if len(older) + len(fresh) > len(self.trace_buffer):
            kept = {(tuple(r.prompt_ids), tuple(r.completion_ids)) for r in self.trace_buffer}
            self.trace_keys = {key for key in self.trace_keys if key in kept}
        return chosen, {
            "trace_new": float(len(fresh)),
            "trace_dup": float(len(rows) - len(fresh)),
            "trace_buffer": float(len(self.trace_buffer)),
        }

    def _share_by_groups(
        self, fresh: list[TrainSample], older: list[TrainSample], batch: int, size: int
    ) -> tuple[list[TrainSample], list[TrainSample]]:
        """:meth:`select_traces` with several sources: (chosen rows, the buffer). A group is a (source, prompt), and
        it gets at most one slot a step: this step's first new text of each group first, then one uniform text each
        of a uniform draw of the buffer's other groups, so a group's weight does not grow with its number of texts
        (a batch may stay under B while the buffer holds fewer groups). Over its size the buffer drops the oldest
        text of its largest group (the oldest text overall once every group holds one)."""

        def group(row: TrainSample) -> tuple[str, tuple[int, ...]]:
            return row.source, tuple(row.prompt_ids)

        chosen: list[TrainSample] = []
        seen: set[tuple[str, tuple[int, ...]]] = set()
        for row in fresh:
            if len(chosen) < batch and group(row) not in seen:
                seen.add(group(row))
                chosen.append(row)
        others: dict[tuple[str, tuple[int, ...]], list[TrainSample]] = {}
        for row in older + fresh:
            if group(row) not in seen:
                others.setdefault(group(row), []).append(row)
        draw = random.Random(f"{self.cfg.seed}:{self.policy_version}")
        for key in draw.sample(list(others), min(batch - len(chosen), len(others))):
            chosen.append(draw.choice(others[key]))
        held = older + fresh
        if len(held) > size:
            counts: dict[tuple[str, tuple[int, ...]], int] = {}
            for row in held:
                counts[group(row)] = counts.get(group(row), 0) + 1
            gone: set[int] = set()
            for _ in range(len(held) - size):
                largest = max(counts.values())
                victim = next(r for r in held if id(r) not in gone and (largest == 1 or counts[group(r)] == largest))
                gone.add(id(victim))
                counts[group(victim)] -= 1
            held = [r for r in held if id(r) not in gone]
        return chosen, held

    # ------------------------------------------------------------------------------------------------------
    def step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer update on ``samples``; returns float metrics.

        pi_old is the current policy, read from the same forward pass as the trained logprobs (detached):
        with one update per batch and no dropout the separate no-grad pass of multi-epoch PPO would give the
        same numbers at 1.5x the compute. Gradients are accumulated over micro-batches of
        ``cfg.micro_batch_size`` sequences with the full batch's normalisers, so the update does not depend on
        the micro-batch size. With ``learner.trace_lr`` the trace step (:meth:`trace_step`) follows on the batch's
        ``trace`` rows, within the same policy version.
        """
        t0 = time.perf_counter()
        rl = [s for s in samples if not s.trace_only]
        if any(s.completion_ids for s in rl) or self.trace_optimizer is None:
            totals = self.accumulate_gradients(rl)
            t_opt = time.perf_counter()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            totals["opt_s"] = torch.tensor(time.perf_counter() - t_opt)
            metrics = {k: float(v) for k, v in totals.items()}
        else:  # only trace-only rows this step (no own group was informative): the trace step alone
            grad_norm, metrics = 0.0, {"tokens": 0.0, "sequences": 0.0, "rl_skipped": 1.0}
        self.policy_version += 1
        if self.trace_optimizer is not None:
            if getattr(self.cfg, "trace_anchor", 0.0) > 0:
                self.keep_anchor([s for s in samples if s.right and not s.external and s.completion_ids])
            cap = getattr(self.cfg, "trace_max_own_solve", 1.0)
            offered = [s for s in samples if s.trace and s.completion_ids]
            traces = [s for s in offered if s.own_solve is None or s.own_solve <= cap]
            rows, replay = self.select_traces(traces)
            metrics.update(self.trace_step(rows, self.anchor_pool), **replay)
            if cap < 1.0:  # peers' traces of prompts this node already solves, left out of the trace step
                metrics["trace_solved_skipped"] = float(len(offered) - len(traces))
        seconds = time.perf_counter() - t0
        metrics.update(
            grad_norm=grad_norm,
            seconds=seconds,
            tokens_per_s=metrics["tokens"] / max(seconds, 1e-9),
            policy_version=float(self.policy_version),
        )
        return metrics

    def trace_step(self, rows: list[TrainSample], anchor: Sequence[TrainSample] = ()) -> dict[str, float]:
        """The trace step (``learner.trace_lr``): one supervised update on verified worked solutions, the token-mean
        negative log-likelihood of their completions (micro-batched, the whole set's normaliser), with the trace
        optimizer. With ``learner.trace_anchor`` (``lambda``) the loss adds ``lambda`` times the token-mean
        :func:`completion_kl` to the initial policy on the states of ``anchor`` (``anchor_pool``, the run's reservoir
        of own right completions: what the node already does), so imitating a peer's working cannot move the node's
        distribution where it was already right for free. Returns ``trace_rows``, ``trace_tokens``, ``trace_nll``
        (read after the step's RL update, before this one), ``trace_grad_norm`` and, with the anchor,
        ``trace_anchor_rows`` and ``trace_anchor_kl`` (nats a token, before this update); all 0 when the step had
        no trace row."""
        if self.trace_optimizer is None:
            raise RuntimeError("the trace step is off (learner.trace_lr: 0)")
        n_tok = sum(len(s.completion_ids) for s in rows)
        out = {"trace_rows": float(len(rows)), "trace_tokens": float(n_tok), "trace_nll": 0.0, "trace_grad_norm": 0.0}
        lam = getattr(self.cfg, "trace_anchor", 0.0)
        anchor = list(anchor) if lam > 0 else []
        if lam > 0:
            out.update(trace_anchor_rows=float(len(anchor)), trace_anchor_kl=0.0)
        if not rows:
            return out
        self.trace_optimizer.zero_grad(set_to_none=True)
        rows, anchor = by_length(rows), by_length(anchor)
        nll = 0.0
        for lo in range(0, len(rows), self.cfg.micro_batch_size):
            batch = self._collate(rows[lo : lo + self.cfg.micro_batch_size])
            logp = completion_logprobs(
                self.model, batch.input_ids, batch.attention_mask, batch.prompt_lens, batch.completion_lens
            )  # (b, T)
            loss = -(logp * batch.mask).sum() / n_tok
            loss.backward()
            nll += float(loss.detach())
        if anchor:
            assert self.ref_model is not None  # made whenever trace_anchor > 0
            a_tok = sum(len(s.completion_ids) for s in anchor)
            kl_sum = 0.0
            for lo in range(0, len(anchor), self.cfg.micro_batch_size):
                batch = self._collate(anchor[lo : lo + self.cfg.micro_batch_size])
                kl = completion_kl(self.model, self.ref_model, batch.input_ids, batch.attention_mask,
                                   batch.prompt_lens, batch.completion_lens)  # fmt: skip
                part = (kl * batch.mask).sum() / a_tok
                (lam * part).backward()
                kl_sum += float(part.detach())
            out["trace_anchor_kl"] = kl_sum
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.trace_optimizer.step()
        self.trace_optimizer.zero_grad(set_to_none=True)
        return {**out, "trace_nll": nll, "trace_grad_norm": float(grad_norm)}

    def preference_step(self, parts: Sequence[tuple[float, PreferenceLoss]]) -> dict[str, float]:
        """One optimizer update on a loss the caller builds from the trained model (MNPO's pairs), in parts.

        The loss is ``sum_i w_i * loss_i`` over ``parts = [(w_i, loss_fn_i)]``, ``loss_fn(model) -> (loss,
        metrics)`` running the forward passes it needs. Each part's forward and backward run before the next
        part's (gradient accumulation), so memory holds one part's activations: for a loss that is a mean over
        independent pairs, micro-batches of pairs weighted by their share give the whole batch's gradient. This
        method owns the rest, as :meth:`step` does: zero the gradients, backward, clip to ``max_grad_norm``, step,
        bump ``policy_version``. Returns the ``w``-weighted sums of the loss and of the parts' 0-d metrics (metrics
        with a dimension, per pair, are the caller's to read), and the gradient norm before clipping.
        """
        if not parts:
            raise ValueError("a preference step needs at least one part")
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        sums: dict[str, float] = {}
        for w, loss_fn in parts:
            loss, metrics = loss_fn(self.model)
            (w * loss).backward()
            total += w * float(loss.detach())
            for k, v in metrics.items():
                if v.dim() == 0:
                    sums[k] = sums.get(k, 0.0) + w * float(v)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy_version += 1
        return {**sums, "loss": total, "grad_norm": float(grad_norm)}

    def mean_logprobs(
        self,
        rows: Sequence[tuple[list[int], list[int]]],
        *,
        model: nn.Module | None = None,
        grad: bool = False,
        micro_batch_size: int | None = None,
    ) -> Tensor:
        """Length-averaged logprobs ``(n,)`` of ``(prompt_ids, completion_ids)`` rows under ``model`` (default: the
        trained model), micro-batched; an empty completion is scored on one pad token so it still has a value."""
        model = self.model if model is None else model
        outs = []
        mb = micro_batch_size or self.cfg.micro_batch_size
        for lo in range(0, len(rows), mb):
            chunk = [TrainSample(p, c if c else [self.pad_token_id], 0.0) for p, c in rows[lo : lo + mb]]
            batch = self._collate(chunk)
            with torch.set_grad_enabled(grad):
                logp = completion_logprobs(
                    model, batch.input_ids, batch.attention_mask, batch.prompt_lens, batch.completion_lens
                )  # (b, T)
                outs.append(logp.sum(-1) / batch.completion_lens.to(logp.dtype))  # (b,)
        return torch.cat(outs) if outs else torch.zeros(0, device=self.device)

    def accumulate_gradients(self, samples: list[TrainSample]) -> dict[str, Tensor]:
        """Forward + backward over micro-batches, leaving the full batch's gradient in ``.grad``; no update.

        Returns 0-d tensor totals: the batch loss, token-weighted means of the per-token metrics, counts.
        """
        samples = [s for s in samples if s.completion_ids]
        if not samples:
            raise ValueError("no sample with a non-empty completion to train on")
        top_frac = getattr(self.cfg, "entropy_top_frac", 1.0)
        if top_frac >= 1.0:  # every row's loss has the full batch's normalisers: the order only sets the padding
            samples = by_length(samples)
        n_seq = len(samples)
        n_tok = sum(len(s.completion_ids) for s in samples)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, Tensor] = {}
        loss_total = torch.zeros((), device=self.device)
        pg_total = torch.zeros((), device=self.device)
        trunc_hits = torch.zeros((), device=self.device)
        trunc_tokens = torch.zeros((), device=self.device)
        ext_weight = torch.zeros((), device=self.device)  # sum of IS weights over peers' tokens
        ext_tokens = torch.zeros((), device=self.device)
        peer_sums = PeerTokenStats()
        mb = self.cfg.micro_batch_size
        fwd_s = bwd_s = 0.0  # the step's time split (the forward pass also gives pi_old: no separate logprob pass)
        for lo in range(0, n_seq, mb):
            t_fwd = time.perf_counter()
            batch = self._collate(samples[lo : lo + mb])
            logp = completion_logprobs(
                self.model,
                batch.input_ids,
                batch.attention_mask,
                batch.prompt_lens,
                batch.completion_lens,
                temperature=self.temperature,
                with_entropy=top_frac < 1.0,
            )  # (b, T)
            entropy = None
            if isinstance(logp, tuple):
                logp, entropy = logp
            old_logp = logp.detach()  # (b, T)
            weights, hits, counted = self._is_weights(old_logp, batch)  # (b, T)
            # guidance rows carry no importance weight at all (LUFFY): neither the peer's hint nor the cap applies
            weights = torch.where(batch.guided.unsqueeze(-1), torch.ones_like(weights), weights)  # (b, T)
            if entropy is not None:  # high-entropy token selection (per micro-batch): other tokens get weight 0
                keep = high_entropy_mask(entropy, batch.mask, top_frac)  # (b, T)
                weights = weights * keep
                sums["entropy_kept_frac"] = sums.get("entropy_kept_frac", torch.zeros((), device=self.device)) + (
                    keep.sum() / n_tok
                )
            ref_logp = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref_logp = completion_logprobs(
                        self.ref_model,
                        batch.input_ids,
                        batch.attention_mask,
                        batch.prompt_lens,
                        batch.completion_lens,
                        temperature=self.temperature,
                    )
            loss, metrics = self.spec.fn(
                logp,
                old_logp,
                batch.advantages,
                batch.mask,
                eps_low=self.eps_low,
                eps_high=self.eps_high,
                aggregation=self.spec.aggregation,
                max_tokens=self.max_tokens,
                is_weights=weights,
                ref_logp=ref_logp,
                beta=self.cfg.beta,
                batch_tokens=float(n_tok),
                batch_sequences=n_seq,
                **self._guidance_kwargs(batch),
            )
            t_bwd = time.perf_counter()
            fwd_s += t_bwd - t_fwd
            loss.backward()
            bwd_s += time.perf_counter() - t_bwd
            loss_total += loss.detach()
            pg_total += metrics.pop("pg_loss")
            share = batch.mask.sum() / n_tok
            for key, value in metrics.items():
                sums[key] = sums.get(key, torch.zeros((), device=self.device)) + value * share
            trunc_hits += hits
            trunc_tokens += counted
            with torch.no_grad():
                ext_mask = batch.mask.to(weights.dtype) * batch.external.unsqueeze(-1).to(weights.dtype)  # (b, T)
                ext_weight += (weights * ext_mask).sum()
                ext_tokens += ext_mask.sum()
                peer_sums.add(batch, old_logp, weights, self.cfg.guidance_gamma)
        out = {"loss": loss_total, "pg_loss": pg_total, **sums}
        out["is_truncated_frac"] = trunc_hits / trunc_tokens.clamp(min=1.0)
        # What a peer's rollouts weigh in this update: their share of the tokens, and their mean IS weight (1 where
        # the sender's hint was not used; 0 when there were none).
        out["external_token_share"] = ext_tokens / n_tok
        out["external_is_weight_mean"] = ext_weight / ext_tokens.clamp(min=1.0)
        out.update(peer_sums.metrics())
        out["tokens"] = torch.tensor(float(n_tok))
        out["sequences"] = torch.tensor(float(n_seq))
        out["fwd_s"], out["bwd_s"] = torch.tensor(fwd_s), torch.tensor(bwd_s)
        return out

    # ------------------------------------------------------------------------------------------------------
    def _guidance_kwargs(self, batch: _Batch) -> dict[str, object]:
        """The loss's guidance arguments: none when the micro-batch holds no guided row."""
        if not bool(batch.guided.any()):
            return {}
        return {
            "guided": batch.guided,
            "shaping_gamma": self.cfg.guidance_gamma,
            "guided_weight": self.cfg.guidance_weight,
        }

    def _is_weights(self, old_logp: Tensor, batch: _Batch) -> tuple[Tensor, Tensor, Tensor]:
        """Truncated IS weights (1 where no behaviour information), and (#truncated, #tokens with information)."""
        cap = self.cfg.is_cap
        mask = batch.mask.to(old_logp.dtype)  # (b, T)
        tok = truncated_is_weights(old_logp, batch.behaviour_logp, cap)  # (b, T)
        seq = sequence_is_weights(old_logp, batch.mask, batch.behaviour_mean, cap)  # (b, T)
        ones = torch.ones_like(old_logp)
        weights = torch.where(batch.has_token_behaviour.unsqueeze(-1), tok, ones)
        weights = torch.where(batch.has_mean_behaviour.unsqueeze(-1), seq, weights)  # (b, T)
        with torch.no_grad():
            # A token counts as truncated only when the cap changes its weight noticeably: on-policy tokens have
            # pi_old / pi_behaviour = 1 up to float noise (the sampler's cached forward vs the learner's padded
            # one), and half of them land a hair above a cap of 1, which is no truncation at all.
            log_cap = math.log(cap) + TRUNCATION_TOLERANCE
            tok_over = (old_logp - batch.behaviour_logp) > log_cap  # (b, T)
            old_mean = (old_logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (b,)
            seq_over = ((old_mean - batch.behaviour_mean) > log_cap).unsqueeze(-1).expand_as(tok_over)
            over = torch.where(
                batch.has_mean_behaviour.unsqueeze(-1), seq_over, tok_over & batch.has_token_behaviour.unsqueeze(-1)
            )
            informed = (batch.has_token_behaviour | batch.has_mean_behaviour).unsqueeze(-1).to(mask.dtype) * mask
            hits = (over.to(mask.dtype) * informed).sum()
        return weights, hits, informed.sum()

    def _collate(self, samples: list[TrainSample]) -> _Batch:
        """Right-pad ``prompt + completion`` rows and gather the per-token behaviour information."""
        lens = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
        length = max(lens)
        t_max = max(len(s.completion_ids) for s in samples)
        b = len(samples)
        input_ids = torch.full((b, length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((b, length), dtype=torch.long)
        behaviour = torch.zeros((b, t_max))
        has_tok = torch.zeros(b, dtype=torch.bool)
        means = torch.zeros(b)
        has_mean = torch.zeros(b, dtype=torch.bool)
        for i, s in enumerate(samples):
            if not s.prompt_ids:
                raise ValueError("a sample has an empty prompt (the first completion token needs a prefix)")
            row = s.prompt_ids + s.completion_ids
            input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention_mask[i, : len(row)] = 1
            n = len(s.completion_ids)
            per_token = s.behaviour_logprobs
            if per_token is not None and len(per_token) != n:
                if not s.external:
                    raise ValueError(f"{len(per_token)} behaviour logprobs for {n} completion tokens")
                per_token = None  # a peer's tokens need not align with ours after re-tokenization
            if per_token is not None:
                values = torch.tensor(per_token, dtype=torch.float32)
                if s.external:
                    values = values.nan_to_num(nan=0.0).clamp(BEHAVIOUR_LOGPROB_FLOOR, 0.0)
                behaviour[i, :n] = values
                has_tok[i] = True
            elif s.behaviour_logprob_mean is not None and math.isfinite(s.behaviour_logprob_mean):
                means[i] = min(max(s.behaviour_logprob_mean, BEHAVIOUR_LOGPROB_FLOOR), 0.0)
                has_mean[i] = True
        comp = torch.tensor([len(s.completion_ids) for s in samples])
        mask = torch.arange(t_max).unsqueeze(0) < comp.unsqueeze(-1)  # (b, T)
        dev = self.device
        return _Batch(
            input_ids=input_ids.to(dev),
            attention_mask=attention_mask.to(dev),
            prompt_lens=torch.tensor([len(s.prompt_ids) for s in samples], device=dev),
            completion_lens=comp.to(dev),
            mask=mask.to(dev),
            advantages=torch.tensor([float(s.advantage) for s in samples], device=dev),
            behaviour_logp=behaviour.to(dev),
            has_token_behaviour=has_tok.to(dev),
            behaviour_mean=means.to(dev),
            has_mean_behaviour=has_mean.to(dev),
            external=torch.tensor([s.external for s in samples], dtype=torch.bool, device=dev),
            guided=torch.tensor([s.guided for s in samples], dtype=torch.bool, device=dev),
            families=[s.family if s.external else "" for s in samples],
        )
