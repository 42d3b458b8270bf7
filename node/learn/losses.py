"""GRPO-family losses as pure tensor functions, and the registry the learner selects them from.

Every function takes tensors and config values and returns tensors (``(loss, metrics)`` for losses); none
holds state, does I/O or calls ``.item()``, so they run unchanged inside a micro-batch loop, under
``torch.compile`` or on any device. This module knows nothing about models, tokenizers, optimizers or peers:
the learner (``node.learn.learner``) turns samples into the ``(B, T)`` tensors these functions consume.

Shapes: ``B`` sequences, ``T`` completion tokens (right-padded; ``mask`` is 1 on real tokens).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

if TYPE_CHECKING:
    from node.config import LearnerConfig

logger = logging.getLogger(__name__)

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
AdvantageScale = Literal["std", "none"]
AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def group_advantages(rewards: Tensor, scale: AdvantageScale = "std", eps: float = 1e-8) -> Tensor:
    """Group-relative advantages of the G completions of one prompt.

    GRPO (Shao et al. 2024, arXiv 2402.03300): ``A_i = (r_i - mean(r)) / (std(r) + eps)``.
    Dr.GRPO (Liu et al. 2025, arXiv 2503.20783), ``scale="none"``: ``A_i = r_i - mean(r)`` (the std division
    up-weights prompts that are nearly always solved or always failed, a difficulty bias).

    ``std`` is the *unbiased* sample standard deviation (Bessel's correction, divisor ``G - 1``), which is what
    TRL's ``GRPOTrainer`` uses (``trl.trainer.utils.nanstd``) and what ``torch.std`` does by default. TRL adds
    ``eps = 1e-4``; this project's default is ``1e-8``; pass ``eps=1e-4`` to reproduce TRL.
    A group of one has no baseline: its advantage is 0.

    Args:
        rewards: ``(G,)`` rewards of one group.
        scale: ``"std"`` (GRPO) or ``"none"`` (Dr.GRPO).
        eps: added to the std so an all-equal group gives 0 instead of 0/0.

    Returns:
        ``(G,)`` advantages, same dtype as ``rewards`` (floating).
    """
    rewards = rewards.float() if not rewards.is_floating_point() else rewards  # (G,)
    if rewards.numel() < 2:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()  # (G,)
    if scale == "none":
        return centred
    if scale == "std":
        return centred / (rewards.std(correction=1) + eps)
    raise ValueError(f"unknown advantage scale {scale!r}; use 'std' or 'none'")


def advantages_for(cfg: LearnerConfig, rewards: Sequence[float]) -> list[float]:
    """Advantages of one group as Python floats, scaled as the preset ``cfg.loss`` says (the runtime's entry point).

    The one function here that leaves tensor land: it is the boundary between reward lists and the learner's
    ``TrainSample.advantage``. Computed in float64.
    """
    scale = get_loss(cfg.loss).advantage_scale
    return group_advantages(torch.tensor(list(rewards), dtype=torch.float64), scale).tolist()


@torch.no_grad()
def truncated_is_weights(old_logp: Tensor, behaviour_logp: Tensor, cap: float) -> Tensor:
    """Per-token truncated importance weights ``w_t = min(pi_old(a_t) / pi_behaviour(a_t), C)``.

    Truncated importance sampling as in DART (arXiv 2509.23866) and TIS (Yao et al. 2025): the rollout came
    from a behaviour policy (a stale local version, another engine, a peer) that differs from ``pi_old``;
    weighting each token's loss by the capped ratio corrects the mismatch with bounded variance. No gradient
    flows through ``w`` (the function runs under ``no_grad`` and returns a tensor that does not require grad).
    The ratio is formed in log space and clamped before ``exp`` so extreme logprobs cannot overflow.

    Args:
        old_logp: ``(B, T)`` logprobs of the sampled tokens under ``pi_old``.
        behaviour_logp: ``(B, T)`` logprobs under the behaviour policy (same tokens).
        cap: ``C > 0``.

    Returns:
        ``(B, T)`` weights in ``(0, C]``.
    """
    log_ratio = (old_logp - behaviour_logp).clamp(max=math.log(cap))  # (B, T)
    return log_ratio.clamp(min=-80.0).exp()  # (B, T)


@torch.no_grad()
def sequence_is_weights(old_logp: Tensor, mask: Tensor, behaviour_logp_mean: Tensor, cap: float) -> Tensor:
    """Truncated importance weight from a sequence-mean behaviour logprob, broadcast over the sequence's tokens.

    A peer may send only ``mean_t log pi_behaviour(a_t)`` of each completion (tokens re-tokenized locally
    do not align with the peer's). The per-sequence ratio is the geometric mean of the token ratios,
    ``w_i = min(exp(mean_t log pi_old(a_t) - hint_i), C)``, used for every token of sequence ``i`` (as GSPO's
    length-normalised sequence ratio, arXiv 2507.18071). Comparing the hint with each token's own logprob
    instead would down-weight every below-average token even when the peer runs exactly our policy.

    Args:
        old_logp: ``(B, T)`` logprobs under ``pi_old``.
        mask: ``(B, T)`` 1 on completion tokens.
        behaviour_logp_mean: ``(B,)`` the hint (the caller clamps it to a sane range: it is untrusted).
        cap: ``C > 0``.

    Returns:
        ``(B, T)`` weights in ``(0, C]``, constant along each row.
    """
    mask = mask.to(old_logp.dtype)
    old_mean = (old_logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
    log_ratio = (old_mean - behaviour_logp_mean).clamp(min=-80.0, max=math.log(cap))  # (B,)
    return log_ratio.exp().unsqueeze(-1).expand_as(old_logp)  # (B, T)


def shaped_guidance(logp: Tensor, gamma: float) -> Tensor:
    """LUFFY's policy shaping of an off-policy token, ``f(p) = p / (p + gamma)`` with ``p = exp(logp)``.

    Its gradient is ``gamma * p / (p + gamma)^2 * grad log p``: against plain importance sampling with the trace
    policy's probability taken as 1 (``p * grad log p``) it lifts the weight of low-probability tokens by up to
    ``1 / gamma``, where the learner and the trace disagree, so the learner does not only sharpen what it already
    writes (Yan et al. 2025, arXiv 2504.14945, section 3.3). The weight peaks at ``1/4`` where ``p = gamma`` and
    stays bounded, so no token of a far-off trace can take the update over (no ``1/p`` of a likelihood loss).
    Formed as ``sigmoid(logp - log gamma)``, exact and stable for any ``logp <= 0``.

    Args:
        logp: ``(B, T)`` logprobs of the trace's tokens under the policy being trained (with gradient).
        gamma: ``> 0``.

    Returns:
        ``(B, T)`` ``f(p)`` in ``(0, 1 / (1 + gamma)]``.
    """
    if not gamma > 0:
        raise ValueError(f"shaping gamma must be > 0, got {gamma}")
    return torch.sigmoid(logp - math.log(gamma))  # (B, T)  p / (p + gamma) = 1 / (1 + gamma / p)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): ``exp(ref - logp) - (ref - logp) - 1`` (Schulman 2020).

    Unbiased for tokens sampled from pi, always >= 0; GRPO (arXiv 2402.03300, eq. 4) uses it as its KL penalty.

    Args:
        logp: ``(B, T)`` current-policy logprobs (with gradient).
        ref_logp: ``(B, T)`` reference-policy logprobs (no gradient).

    Returns:
        ``(B, T)`` per-token KL estimates.
    """
    delta = ref_logp - logp  # (B, T)
    return delta.exp() - delta - 1.0


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    aggregation: Aggregation,
    *,
    max_tokens: int | None = None,
    batch_tokens: Tensor | float | None = None,
    batch_sequences: int | None = None,
) -> Tensor:
    """Reduce a ``(B, T)`` per-token loss to a scalar.

    * ``token_mean`` (DAPO, arXiv 2503.14476): ``sum_{i,t} l_it / sum_i |o_i|`` -- every token weighs the same,
      so long completions are not diluted.
    * ``seq_mean_token_mean`` (GRPO, arXiv 2402.03300): ``(1/B) sum_i (1/|o_i|) sum_t l_it``.
    * ``seq_mean_token_sum_norm`` (Dr.GRPO, arXiv 2503.20783): ``(1/B) sum_i (1/L_max) sum_t l_it`` with a
      constant ``L_max = max_tokens`` (removes the length bias of the per-sequence mean).

    ``batch_tokens`` / ``batch_sequences`` are the normalisers of the *whole* batch when this call sees one
    micro-batch of it: with them, the sum of the micro-batch losses equals the full-batch loss exactly, under
    every mode. They default to this call's own counts.

    Args:
        per_token: ``(B, T)`` loss per token.
        mask: ``(B, T)`` 1 on completion tokens.
        aggregation: one of :data:`AGGREGATIONS`.
        max_tokens: ``L_max`` for ``seq_mean_token_sum_norm``.
        batch_tokens: total completion tokens of the full batch (``token_mean``).
        batch_sequences: total sequences of the full batch (the two ``seq_mean`` modes).

    Returns:
        0-d loss tensor.
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask  # (B, T)
    n_seq = per_token.shape[0] if batch_sequences is None else batch_sequences
    if aggregation == "token_mean":
        n_tok = mask.sum() if batch_tokens is None else batch_tokens
        if isinstance(n_tok, Tensor):
            return masked.sum() / n_tok.clamp(min=1.0)
        return masked.sum() / max(float(n_tok), 1.0)
    if aggregation == "seq_mean_token_mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
        return per_seq.sum() / max(n_seq, 1)
    if aggregation == "seq_mean_token_sum_norm":
        if max_tokens is None or max_tokens < 1:
            raise ValueError("seq_mean_token_sum_norm needs max_tokens >= 1 (the completion token budget)")
        return masked.sum() / (max_tokens * max(n_seq, 1))
    raise ValueError(f"unknown aggregation {aggregation!r}; use one of {AGGREGATIONS}")


def policy_gradient_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    aggregation: Aggregation,
    max_tokens: int | None = None,
    is_weights: Tensor | None = None,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    batch_tokens: Tensor | float | None = None,
    batch_sequences: int | None = None,
    guided: Tensor | None = None,
    shaping_gamma: float = 0.1,
    guided_weight: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate policy-gradient loss of the GRPO family, with truncated IS and an optional k3 KL.

    Per token ``t`` of completion ``i``, with ``rho = exp(logp - old_logp)``::

        l_it = -w_it * min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i) + beta * KL_k3

    (PPO's clipped objective as used by GRPO, arXiv 2402.03300; asymmetric "clip-higher" ranges from DAPO,
    arXiv 2503.14476; ``w`` is the truncated importance weight of DART, arXiv 2509.23866, see
    :func:`truncated_is_weights`). ``w`` multiplies the policy-gradient term only, not the KL term, exactly as
    TRL's ``GRPOTrainer`` applies its vLLM importance-sampling ratio. Then :func:`aggregate` reduces ``l``.

    Rows marked ``guided`` (a peer's verified-right completion trained as off-policy guidance) take LUFFY's
    off-policy term instead (Yan et al. 2025, Learning to Reason under Off-Policy Guidance, arXiv 2504.14945, eq. 6
    with the trace policy's probability set to 1, as their implementation does), see :func:`shaped_guidance`::

        l_it = -k * A_i * f(pi(a_t)),   f(p) = p / (p + gamma)

    no clip, no importance weight (``is_weights`` is ignored on those rows), ``k = guided_weight``. The token-mean
    normaliser stays the whole batch's, own and guided tokens together, as in LUFFY's mixed-policy objective.

    Args:
        logp: ``(B, T)`` logprobs of the sampled tokens under the policy being trained (with gradient).
        old_logp: ``(B, T)`` the same under ``pi_old`` (no gradient).
        advantages: ``(B,)`` one advantage per sequence.
        mask: ``(B, T)`` 1 on completion tokens, 0 on padding.
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]`` of the ratio.
        aggregation, max_tokens, batch_tokens, batch_sequences: see :func:`aggregate`.
        is_weights: ``(B, T)`` truncated IS weights, or None for all-ones.
        ref_logp: ``(B, T)`` reference-policy logprobs, needed when ``beta > 0``.
        beta: KL coefficient.
        guided: ``(B,)`` bool, rows trained with the shaped off-policy term; None for none.
        shaping_gamma: ``gamma > 0`` of the shaping (LUFFY's default 0.1).
        guided_weight: ``k``, a trace-level weight on the guided rows' term.

    Returns:
        ``(loss, metrics)``: the scalar loss and detached 0-d metrics, each a mean over this call's masked tokens:
        ``clip_low_frac`` / ``clip_high_frac`` (tokens whose gradient the lower / upper clip removes),
        ``ratio_mean``, ``is_weight_mean``, ``kl`` (0 when ``beta == 0``), ``pg_loss`` (policy term, aggregated).
    """
    adv = advantages.to(logp.dtype).unsqueeze(-1)  # (B, 1)
    fmask = mask.to(logp.dtype)  # (B, T)
    ratio = torch.exp(logp - old_logp)  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # (B, T)
    pg = -torch.min(ratio * adv, clipped * adv)  # (B, T)
    if is_weights is not None:
        pg = pg * is_weights.detach()  # (B, T)
    on_policy = fmask
    if guided is not None:
        rows = guided.to(torch.bool).unsqueeze(-1)  # (B, 1)
        shaped = -guided_weight * adv * shaped_guidance(logp, shaping_gamma)  # (B, T)
        pg = torch.where(rows, shaped, pg)  # (B, T)
        on_policy = fmask * (~rows).to(fmask.dtype)  # (B, T) the clip and IS metrics read own-policy rows only
    per_token = pg
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (the reference policy's logprobs)")
        kl = kl_k3(logp, ref_logp)  # (B, T)
        per_token = pg + beta * kl
    else:
        kl = torch.zeros_like(logp)

    def agg(x: Tensor) -> Tensor:
        return aggregate(
            x, mask, aggregation, max_tokens=max_tokens, batch_tokens=batch_tokens, batch_sequences=batch_sequences
        )

    loss = agg(per_token)

    with torch.no_grad():
        n = fmask.sum().clamp(min=1.0)

        def mean(x: Tensor, over: Tensor = fmask) -> Tensor:
            return (x.to(fmask.dtype) * over).sum() / n

        weights = torch.ones_like(logp) if is_weights is None else is_weights
        metrics = {
            "pg_loss": agg(pg.detach()),
            "clip_low_frac": mean((ratio < 1.0 - eps_low) & (adv < 0), on_policy),
            "clip_high_frac": mean((ratio > 1.0 + eps_high) & (adv > 0), on_policy),
            "ratio_mean": mean(ratio),
            "is_weight_mean": mean(weights),
            "kl": mean(kl.detach()),
        }
    return loss, metrics


# ----------------------------------------------------------------------------------------------------------
# Registry: the config's ``learner.loss`` names an entry; the learner reads its settings, never branches on names.


@dataclass(frozen=True)
class LossSpec:
    """A named loss preset.

    ``kind`` says what batch the loss consumes: ``"policy_gradient"`` (per-token logprobs + per-sequence
    advantages, :func:`policy_gradient_loss`); other kinds (e.g. ``"preference"`` for MNPO pairs) register their
    own ``fn`` and are driven by a learner that understands that kind.
    """

    name: str
    """Key in the registry and value of ``LearnerConfig.loss``."""
    kind: str
    """Batch the loss consumes; the learner checks it supports this kind."""
    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    """The pure loss function."""
    aggregation: Aggregation = "token_mean"
    """How per-token losses are reduced (policy-gradient kinds)."""
    advantage_scale: AdvantageScale = "std"
    """How group advantages are normalised (policy-gradient kinds)."""
    clip_higher: bool = True
    """Use ``eps_high`` for the upper clip; False clips symmetrically at ``1 +- eps_low``."""
    citation: str = ""
    """Paper the preset follows."""
    settings: Callable[[Any], dict[str, Any]] | None = None
    """Builds the loss's keyword arguments from a config object (preference kinds: ``eta``/``ratio``/... from an
    MNPO config), so callers pass ``**spec.kwargs(cfg)`` and never branch on the loss's name."""

    def kwargs(self, cfg: Any) -> dict[str, Any]:
        """The keyword arguments this loss takes from ``cfg`` (none for presets without ``settings``)."""
        return self.settings(cfg) if self.settings is not None else {}


LOSSES: dict[str, LossSpec] = {}


def register_loss(spec: LossSpec) -> LossSpec:
    """Add ``spec`` to the registry (a name can be registered once) and return it."""
    if spec.name in LOSSES:
        raise ValueError(f"loss {spec.name!r} is already registered")
    LOSSES[spec.name] = spec
    return spec


def get_loss(name: str) -> LossSpec:
    """The registered preset called ``name``."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; registered: {sorted(LOSSES)}") from None


register_loss(
    LossSpec(
        "grpo",
        "policy_gradient",
        policy_gradient_loss,
        aggregation="seq_mean_token_mean",
        advantage_scale="std",
        clip_higher=False,
        citation="Shao et al. 2024, DeepSeekMath, arXiv 2402.03300",
    )
)
register_loss(
    LossSpec(
        "dapo",
        "policy_gradient",
        policy_gradient_loss,
        aggregation="token_mean",
        advantage_scale="std",
        clip_higher=True,
        citation="Yu et al. 2025, DAPO, arXiv 2503.14476",
    )
)
register_loss(
    LossSpec(
        "dr_grpo",
        "policy_gradient",
        policy_gradient_loss,
        aggregation="seq_mean_token_sum_norm",
        advantage_scale="none",
        clip_higher=False,
        citation="Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv 2503.20783",
    )
)


# ----------------------------------------------------------------------------------------------------------
# Preference losses (kind "mnpo"): a batch of P preference pairs (y_w, y_l) with length-averaged logprobs of the
# player, the reference and up to J opponents. The node's MNPO phase (``node.mnpo.phase``) drives them.


def _opponent_lambdas(opp_mask: Tensor, opp_weights: Tensor | None, max_opponents: int | None) -> Tensor:
    """Per-pair opponent weights ``lam_pj``: configured (or uniform) weights of the covering opponents, renormalised
    to sum to 1 per pair; only the first ``max_opponents`` covering opponents of each row count. ``(P, J)``."""
    mask = opp_mask.to(torch.bool)  # (P, J)
    if max_opponents is not None:
        mask = mask & (mask.to(torch.int64).cumsum(-1) <= max_opponents)  # (P, J) first k covering columns
    if opp_weights is None:
        w = torch.ones(mask.shape, dtype=torch.float64, device=mask.device)  # (P, J)
    else:
        w = opp_weights.to(device=mask.device, dtype=torch.float64).expand(mask.shape)  # (J,) or (P, J) -> (P, J)
    w = torch.where(mask, w, torch.zeros_like(w))  # (P, J)
    total = w.sum(-1, keepdim=True)  # (P, 1)
    return torch.where(total > 0, w / total.clamp(min=1e-300), torch.zeros_like(w))  # (P, J)


def mnpo_loss(
    player_w: Tensor,
    player_l: Tensor,
    ref_w: Tensor,
    ref_l: Tensor,
    opp_w: Tensor | None = None,
    opp_l: Tensor | None = None,
    opp_mask: Tensor | None = None,
    *,
    eta: float,
    ratio: float,
    opp_weights: Tensor | None = None,
    max_opponents: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Multiplayer Nash Preference Optimization loss (Wu et al. 2025, MNPO, arXiv 2509.23102).

    For pair ``p`` with winner ``y_w`` and loser ``y_l`` and *length-averaged* logprobs (mean over the completion's
    tokens, each player under its own tokenizer)::

        d_pi(p) = log pi(y_w) - log pi(y_l)                                       (a log-ratio)
        h_p     = d_player(p) - ratio * d_ref(p) - (1 - ratio) * sum_j lam_pj * d_j(p)
        loss    = mean_p (h_p - 1 / (2 * eta))^2

    ``lam_pj`` are the opponent weights (``opp_weights``, uniform if None) restricted to the opponents that *cover*
    pair ``p`` (``opp_mask``; at most ``max_opponents`` of them, the first ones in column order) and renormalised to
    sum to 1 per pair. A pair no opponent covers plays against the reference alone (``d_j := d_ref``): then
    ``h = d_player - d_ref`` and the loss is IPO's (Azar et al. 2023, arXiv 2310.12036) with ``tau = eta`` -- the
    paper's n = 2 special case. ``ratio = 1`` ignores the opponents; ``ratio = 0`` with the previous iterate as the
    only opponent is INPO (Zhang et al. 2024, arXiv 2407.00617). TD-MNPO takes opponents from the player's own past
    iterates, HT-MNPO from other players (here: peers' cross-scores).

    Args:
        player_w, player_l: ``(P,)`` the player's length-averaged logprobs (with gradient).
        ref_w, ref_l: ``(P,)`` the reference policy's (no gradient).
        opp_w, opp_l: ``(P, J)`` the opponents' (no gradient; entries where ``opp_mask`` is False are ignored).
        opp_mask: ``(P, J)`` bool, opponent ``j`` has scores on both responses of pair ``p``.
        eta: ``> 0``, the step size of the mirror-descent game (paper default 0.0075); the target margin is
            ``1 / (2 eta)``.
        ratio: in ``[0, 1]``, weight of the reference in the mixture it competes against (paper 0.33..0.85).
        opp_weights: ``(J,)`` or ``(P, J)`` non-negative unnormalised ``lam``; None = uniform.
        max_opponents: at most this many covering opponents per pair (None = all).

    Returns:
        ``(loss, metrics)``: 0-d loss; detached 0-d metrics ``h_mean`` (mean h), ``margin`` (mean player log-ratio
        minus reference log-ratio), ``pref_acc`` (fraction with player log-ratio > reference log-ratio),
        ``opponents`` (mean covering opponents used per pair), ``covered_frac`` (pairs with at least one); and the
        ``(P,)`` ``pull``, ``-d loss_p / d d_player(p) = 2 (1/(2 eta) - h_p)``: how hard each pair pulls the
        player's log-ratio toward its winner (negative: away, past the target), which pairs drive the update.
    """
    if not eta > 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio}")
    d_player = player_w - player_l  # (P,)
    d_ref = (ref_w - ref_l).to(d_player.dtype).detach()  # (P,)
    n_opp = torch.zeros_like(d_ref)  # (P,)
    if opp_w is None or opp_l is None or opp_mask is None or opp_w.shape[-1] == 0:
        d_opp = d_ref  # (P,) no opponents at all: the reference is the opponent
    else:
        lam = _opponent_lambdas(opp_mask, opp_weights, max_opponents)  # (P, J)
        covered = lam.sum(-1) > 0  # (P,)
        d_j = (opp_w - opp_l).to(torch.float64).detach()  # (P, J)
        d_j = torch.where(lam > 0, d_j, torch.zeros_like(d_j))  # masked entries may hold anything (even NaN)
        mix = (lam * d_j).sum(-1).to(d_player.dtype)  # (P,)
        d_opp = torch.where(covered, mix, d_ref)  # (P,)
        n_opp = (lam > 0).sum(-1).to(d_player.dtype)  # (P,)
    h = d_player - ratio * d_ref - (1.0 - ratio) * d_opp  # (P,)
    target = 1.0 / (2.0 * eta)
    loss = ((h - target) ** 2).mean()
    with torch.no_grad():
        margin = d_player.detach() - d_ref  # (P,)
        metrics = {
            "h_mean": h.detach().mean(),
            "margin": margin.mean(),
            "pref_acc": (margin > 0).to(d_player.dtype).mean(),
            "opponents": n_opp.mean(),
            "covered_frac": (n_opp > 0).to(d_player.dtype).mean(),
            "pull": 2.0 * (target - h.detach()),  # (P,)
        }
    return loss, metrics


def dpo_loss(
    player_w: Tensor,
    player_l: Tensor,
    ref_w: Tensor,
    ref_l: Tensor,
    opp_w: Tensor | None = None,
    opp_l: Tensor | None = None,
    opp_mask: Tensor | None = None,
    *,
    beta: float,
    **_: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO (Rafailov et al. 2023, arXiv 2305.18290) on length-averaged logprobs: the two-player baseline of MNPO.

    ``loss = mean_p -log sigmoid(beta * [(log pi(y_w) - log pi(y_l)) - (log pi_ref(y_w) - log pi_ref(y_l))])``.
    The reference is the only opponent; opponent arguments are accepted (same call shape as :func:`mnpo_loss`) and
    ignored. Length-averaged logprobs make this the length-normalised variant (as SimPO's normalisation).

    Returns:
        ``(loss, metrics)`` with ``margin``, ``pref_acc`` as in :func:`mnpo_loss` (``opponents`` and
        ``covered_frac`` are 0) and the ``(P,)`` ``pull`` ``beta * sigmoid(-beta * margin_p)`` (always toward the
        winner, at most ``beta``).
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    margin = (player_w - player_l) - (ref_w - ref_l).to(player_w.dtype).detach()  # (P,)
    loss = -torch.nn.functional.logsigmoid(beta * margin).mean()
    with torch.no_grad():
        zero = torch.zeros((), dtype=margin.dtype, device=margin.device)
        metrics = {
            "h_mean": margin.detach().mean(),
            "margin": margin.detach().mean(),
            "pref_acc": (margin.detach() > 0).to(margin.dtype).mean(),
            "opponents": zero,
            "covered_frac": zero,
            "pull": beta * torch.sigmoid(-beta * margin.detach()),  # (P,)
        }
    return loss, metrics


def opponent_tensors(
    opponents: Sequence[Sequence[tuple[float, float]]], slots: int, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor, Tensor]:
    """Pack each pair's opponents' ``(log pi_j(y_w), log pi_j(y_l))`` into the ``(P, J)`` tensors the preference
    losses take: ``opp_w``, ``opp_l`` and the boolean ``opp_mask`` of filled slots (at most ``slots`` per pair)."""
    n = len(opponents)
    opp_w = torch.zeros((n, slots), dtype=dtype)  # (P, J)
    opp_l = torch.zeros((n, slots), dtype=dtype)  # (P, J)
    mask = torch.zeros((n, slots), dtype=torch.bool)  # (P, J)
    for i, row in enumerate(opponents):
        for j, (lp_w, lp_l) in enumerate(row[:slots]):
            opp_w[i, j], opp_l[i, j], mask[i, j] = lp_w, lp_l, True
    return opp_w, opp_l, mask


def _mnpo_settings(cfg: Any) -> dict[str, Any]:
    weights = getattr(cfg, "opponent_weights", None)
    return {
        "eta": cfg.eta,
        "ratio": cfg.ratio,
        "opp_weights": None if weights is None else torch.tensor(weights),
        "max_opponents": cfg.max_opponents,
    }


register_loss(
    LossSpec("mnpo", "mnpo", mnpo_loss, citation="Wu et al. 2025, MNPO, arXiv 2509.23102", settings=_mnpo_settings)
)
register_loss(
    LossSpec(
        "dpo",
        "mnpo",
        dpo_loss,
        citation="Rafailov et al. 2023, DPO, arXiv 2305.18290",
        settings=lambda cfg: {"beta": cfg.dpo_beta},
    )
)
