"""node.learn.losses against naive per-token Python loops on tiny tensors."""

import math

import pytest
import torch

from node.learn.losses import (
    LOSSES,
    LossSpec,
    advantages_for,
    aggregate,
    get_loss,
    group_advantages,
    kl_k3,
    policy_gradient_loss,
    register_loss,
    sequence_is_weights,
    shaped_guidance,
    truncated_is_weights,
)

B, T = 3, 5
LENGTHS = [5, 2, 4]
EPS_LOW, EPS_HIGH = 0.2, 0.28


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    old = logp.detach() + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios well outside the clip
    adv = torch.tensor([1.5, -0.7, 0.3], dtype=torch.float64)
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(T)] for n in LENGTHS], dtype=torch.float64)
    ref = logp.detach() - 0.3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    w = torch.rand(B, T, generator=g, dtype=torch.float64)
    return logp, old, adv, mask, ref, w


def _naive_token(lp, ol, a, w, rf, beta):
    ratio = math.exp(lp - ol)
    clipped = min(max(ratio, 1 - EPS_LOW), 1 + EPS_HIGH)
    pg = -min(ratio * a, clipped * a) * w
    kl = math.exp(rf - lp) - (rf - lp) - 1 if beta else 0.0
    return pg + beta * kl


def _naive_loss(logp, old, adv, ref, w, beta, aggregation, max_tokens):
    logp = logp.detach()
    per_seq_sums, per_seq_means, total = [], [], 0.0
    for i in range(B):
        s = 0.0
        for t in range(LENGTHS[i]):
            s += _naive_token(
                float(logp[i, t]), float(old[i, t]), float(adv[i]), float(w[i, t]), float(ref[i, t]), beta
            )
        per_seq_sums.append(s)
        per_seq_means.append(s / LENGTHS[i])
        total += s
    if aggregation == "token_mean":
        return total / sum(LENGTHS)
    if aggregation == "seq_mean_token_mean":
        return sum(per_seq_means) / B
    return sum(per_seq_sums) / (max_tokens * B)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("weighted", [False, True])
def test_policy_gradient_loss_matches_naive_loop(aggregation, beta, weighted):
    logp, old, adv, mask, ref, w = _inputs()
    loss, metrics = policy_gradient_loss(
        logp,
        old,
        adv,
        mask,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        aggregation=aggregation,
        max_tokens=8,
        is_weights=w if weighted else None,
        ref_logp=ref if beta else None,
        beta=beta,
    )
    expected = _naive_loss(logp, old, adv, ref, w if weighted else torch.ones(B, T), beta, aggregation, 8)
    assert loss.item() == pytest.approx(expected, abs=1e-10)
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())

    # Gradient of the naive loss by finite differences on one real token and zero on padding.
    loss.backward()
    h = 1e-6
    bumped = logp.detach().clone()
    bumped[0, 1] += h
    fd = (_naive_loss(bumped, old, adv, ref, w if weighted else torch.ones(B, T), beta, aggregation, 8) - expected) / h
    assert logp.grad[0, 1].item() == pytest.approx(fd, rel=1e-4, abs=1e-7)
    assert logp.grad[1, 3].item() == 0.0


def test_metrics_match_naive_counts():
    logp, old, adv, mask, _, w = _inputs(1)
    _, m = policy_gradient_loss(
        logp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, aggregation="token_mean", is_weights=w
    )
    low = high = 0
    ratios, weights = [], []
    for i in range(B):
        for t in range(LENGTHS[i]):
            r = math.exp(float(logp.detach()[i, t]) - float(old[i, t]))
            ratios.append(r)
            weights.append(float(w[i, t]))
            low += r < 1 - EPS_LOW and adv[i] < 0
            high += r > 1 + EPS_HIGH and adv[i] > 0
    n = sum(LENGTHS)
    assert m["clip_low_frac"].item() == pytest.approx(low / n)
    assert m["clip_high_frac"].item() == pytest.approx(high / n)
    assert low + high > 0
    assert m["ratio_mean"].item() == pytest.approx(sum(ratios) / n)
    assert m["is_weight_mean"].item() == pytest.approx(sum(weights) / n)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batch_sums_equal_full_batch(aggregation):
    logp, old, adv, mask, _, _ = _inputs(2)
    kw = dict(eps_low=EPS_LOW, eps_high=EPS_HIGH, aggregation=aggregation, max_tokens=8)
    full, _ = policy_gradient_loss(logp, old, adv, mask, **kw)
    parts = sum(
        policy_gradient_loss(
            logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1],
            batch_tokens=mask.sum(), batch_sequences=B, **kw,
        )[0]
        for i in range(B)
    )  # fmt: skip
    assert parts.item() == pytest.approx(full.item(), abs=1e-12)


def test_group_advantages_std_and_none():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    mean = sum(r.tolist()) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in r.tolist()) / 4)  # unbiased, as TRL
    a = group_advantages(r, "std")
    assert a.tolist() == pytest.approx([(x - mean) / (std + 1e-8) for x in r.tolist()])
    assert group_advantages(r, "none").tolist() == pytest.approx([x - mean for x in r.tolist()])
    assert group_advantages(torch.ones(4), "std").abs().max().item() == 0.0
    assert group_advantages(torch.tensor([3.0]), "std").tolist() == [0.0]
    with pytest.raises(ValueError):
        group_advantages(r, "batch")  # type: ignore[arg-type]


def test_truncated_is_weights_cap_and_no_gradient():
    old = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    beh = torch.tensor([[-1.5, -1.0, -0.5]])
    w = truncated_is_weights(old, beh, cap=1.0)
    assert not w.requires_grad
    assert w.tolist()[0] == pytest.approx([1.0, math.exp(-1.0), 1.0])
    w2 = truncated_is_weights(old, beh, cap=2.0)
    assert w2.tolist()[0] == pytest.approx([math.exp(0.5), math.exp(-1.0), 1.0])
    # Extreme values neither overflow nor underflow to NaN.
    w3 = truncated_is_weights(torch.tensor([[0.0, -1e4]]), torch.tensor([[-1e4, 0.0]]), cap=1.0)
    assert torch.isfinite(w3).all() and w3[0, 0] == 1.0


def test_sequence_is_weights_from_mean_hint():
    old = torch.tensor([[-1.0, -3.0, 0.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    w = sequence_is_weights(old, mask, torch.tensor([-1.0, -2.5]), cap=1.0)
    assert w[0].tolist() == pytest.approx([math.exp(-1.0)] * 3)  # mean old -2 vs hint -1
    assert w[1].tolist() == pytest.approx([1.0] * 3)  # exp(0.5) capped


def test_kl_k3_naive():
    lp = torch.tensor([-1.0, -2.0, -0.1])
    rf = torch.tensor([-1.0, -1.0, -3.0])
    expected = [math.exp(r - p) - (r - p) - 1 for p, r in zip(lp.tolist(), rf.tolist(), strict=True)]
    assert kl_k3(lp, rf).tolist() == pytest.approx(expected)
    assert kl_k3(lp, lp).abs().max().item() == 0.0


def test_aggregate_rejects_bad_settings():
    x, m = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError):
        aggregate(x, m, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError):
        aggregate(x, m, "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        policy_gradient_loss(x, x, torch.ones(2), m, eps_low=0.2, eps_high=0.2, aggregation="token_mean", beta=0.1)


def test_registry_presets_and_extension():
    assert get_loss("grpo").aggregation == "seq_mean_token_mean" and not get_loss("grpo").clip_higher
    assert get_loss("dapo").aggregation == "token_mean" and get_loss("dapo").clip_higher
    assert get_loss("dr_grpo").aggregation == "seq_mean_token_sum_norm"
    assert get_loss("dr_grpo").advantage_scale == "none"
    with pytest.raises(ValueError):
        get_loss("nope")
    with pytest.raises(ValueError):
        register_loss(get_loss("grpo"))
    spec = register_loss(LossSpec("test_pref", "preference", lambda **kw: (torch.zeros(()), {})))
    try:
        assert get_loss("test_pref") is spec
    finally:
        del LOSSES["test_pref"]


def test_advantages_for_follows_the_preset():
    from node.config import LearnerConfig

    r = [1.0, 0.0, 0.0, 1.0]
    assert advantages_for(LearnerConfig(loss="dr_grpo"), r) == pytest.approx([0.5, -0.5, -0.5, 0.5])
    std = math.sqrt(4 * 0.25 / 3)
    assert advantages_for(LearnerConfig(loss="dapo"), r) == pytest.approx(
        [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std]
    )
    assert all(isinstance(a, float) for a in advantages_for(LearnerConfig(loss="grpo"), r))


def test_shaped_guidance_hand_computed():
    # f(p) = p / (p + gamma): p = 0.1, gamma = 0.1 -> 0.5; p = 0.9 -> 0.9; p = 1e-4 -> 1e-4 / 0.1001.
    logp = torch.log(torch.tensor([[0.1, 0.9, 1e-4]], dtype=torch.float64))
    f = shaped_guidance(logp, 0.1)
    assert f.tolist()[0] == pytest.approx([0.5, 0.9, 1e-4 / 0.1001], rel=1e-12)
    with pytest.raises(ValueError, match="gamma must be > 0"):
        shaped_guidance(logp, 0.0)


def test_guided_rows_take_luffys_term_hand_computed():
    # Two rows, token-mean over 3 real tokens. Row 0 is own (ratio 1 at pi_old, IS weight 0.5 applies): its two
    # tokens give -0.5 * 1 * A0 each. Row 1 is guided, one token with p = 0.1: -k * A1 * 0.1 / (0.1 + 0.1), the IS
    # weight 0.01 and the clip ignored. A0 = 2, A1 = 0.8, k = 3:
    # loss = (2 * (-0.5 * 2) + (-3 * 0.8 * 0.5)) / 3 = (-2 - 1.2) / 3.
    logp = torch.log(torch.tensor([[0.3, 0.6], [0.1, 1.0]], dtype=torch.float64)).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([2.0, 0.8], dtype=torch.float64)
    w = torch.tensor([[0.5, 0.5], [0.01, 0.01]], dtype=torch.float64)
    loss, m = policy_gradient_loss(
        logp, logp.detach(), adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, aggregation="token_mean",
        is_weights=w, guided=torch.tensor([False, True]), shaping_gamma=0.1, guided_weight=3.0,
    )  # fmt: skip
    assert loss.item() == pytest.approx((-2.0 - 1.2) / 3, abs=1e-12)
    loss.backward()
    # d/dlogp of -k A p/(p+g) = -k A g p / (p+g)^2 = -3 * 0.8 * 0.1 * 0.1 / 0.04 = -0.6, over 3 tokens.
    assert logp.grad[1, 0].item() == pytest.approx(-0.6 / 3, abs=1e-12)
    assert logp.grad[1, 1].item() == 0.0  # padding
    # own token: d/dlogp of -w * A * exp(logp - old) at logp = old -> -0.5 * 2 = -1, over 3 tokens
    assert logp.grad[0, 0].item() == pytest.approx(-1.0 / 3, abs=1e-12)
    assert m["clip_low_frac"].item() == 0.0 and m["clip_high_frac"].item() == 0.0


def test_guided_term_stays_bounded_where_a_likelihood_loss_explodes():
    # A token the learner gives probability 1e-6: the shaped gradient weight is about p / gamma (tiny, bounded),
    # where a likelihood loss's is 1 / p relative to p's own gradient; and it peaks at 1/4 where p = gamma.
    p = torch.tensor([[1e-6, 0.1, 0.999]], dtype=torch.float64)
    logp = torch.log(p).requires_grad_(True)
    shaped_guidance(logp, 0.1).sum().backward()
    expected = (0.1 * p / (p + 0.1) ** 2)[0]
    assert logp.grad[0].tolist() == pytest.approx(expected.tolist(), rel=1e-9)
    assert logp.grad.max().item() == pytest.approx(0.25, rel=1e-9)
