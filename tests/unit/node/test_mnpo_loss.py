"""node.learn.losses.mnpo_loss / dpo_loss against naive per-pair Python loops, and the paper's special cases."""

import math

import pytest
import torch

from node.learn.losses import dpo_loss, get_loss, mnpo_loss

P, J = 5, 3


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)

    def lp(*shape):
        return -torch.rand(*shape, generator=g, dtype=torch.float64) * 3

    pw, pl = lp(P).requires_grad_(True), lp(P).requires_grad_(True)
    rw, rl = lp(P), lp(P)
    ow, ol = lp(P, J), lp(P, J)
    mask = torch.tensor(
        [[1, 1, 1], [1, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 0]], dtype=torch.bool
    )  # row 2: no opponent covers the pair
    return pw, pl, rw, rl, ow, ol, mask


def _naive(pw, pl, rw, rl, ow, ol, mask, eta, ratio, weights=None, max_opp=None):
    total = 0.0
    for p in range(P):
        d_player = float(pw[p]) - float(pl[p])
        d_ref = float(rw[p]) - float(rl[p])
        cols = [j for j in range(J) if mask[p, j]]
        if max_opp is not None:
            cols = cols[:max_opp]
        if cols:
            w = [1.0 if weights is None else float(weights[j]) for j in cols]
            if sum(w) > 0:
                lam = [x / sum(w) for x in w]
                d_opp = sum(lam[k] * (float(ow[p, j]) - float(ol[p, j])) for k, j in enumerate(cols))
            else:
                d_opp = d_ref
        else:
            d_opp = d_ref
        h = d_player - ratio * d_ref - (1 - ratio) * d_opp
        total += (h - 1 / (2 * eta)) ** 2
    return total / P


@pytest.mark.parametrize("eta, ratio", [(0.0075, 0.33), (0.1, 0.85), (1.0, 0.0), (0.5, 1.0)])
@pytest.mark.parametrize("max_opp", [None, 1, 2])
def test_mnpo_matches_naive_loop(eta, ratio, max_opp):
    pw, pl, rw, rl, ow, ol, mask = _inputs()
    loss, m = mnpo_loss(pw, pl, rw, rl, ow, ol, mask, eta=eta, ratio=ratio, max_opponents=max_opp)
    assert float(loss) == pytest.approx(_naive(pw, pl, rw, rl, ow, ol, mask, eta, ratio, max_opp=max_opp), rel=1e-12)
    assert float(m["covered_frac"]) == pytest.approx(4 / 5)


def test_configured_weights_are_used_and_renormalised_over_covering_opponents():
    pw, pl, rw, rl, ow, ol, mask = _inputs(1)
    weights = torch.tensor([3.0, 1.0, 0.5], dtype=torch.float64)
    loss, _ = mnpo_loss(pw, pl, rw, rl, ow, ol, mask, eta=0.2, ratio=0.4, opp_weights=weights)
    want = _naive(pw, pl, rw, rl, ow, ol, mask, 0.2, 0.4, weights=weights)
    assert float(loss) == pytest.approx(want, rel=1e-12)
    uniform, _ = mnpo_loss(pw, pl, rw, rl, ow, ol, mask, eta=0.2, ratio=0.4)
    assert abs(float(loss) - float(uniform)) > 1e-6, "configured weights must change the loss"


def test_gradient_matches_naive_autograd():
    pw, pl, rw, rl, ow, ol, mask = _inputs(2)
    loss, m = mnpo_loss(pw, pl, rw, rl, ow, ol, mask, eta=0.3, ratio=0.5)
    loss.backward()
    # the per-pair pull is minus the gradient of the pair's own loss (P times the mean's)
    assert m["pull"].shape == (P,) and torch.allclose(m["pull"], -P * pw.grad, rtol=1e-10)
    # d/d pw_p of mean (h_p - c)^2 = 2 (h_p - c) / P
    c = 1 / (2 * 0.3)
    for p in range(P):
        d_ref = float(rw[p] - rl[p])
        cols = [j for j in range(J) if mask[p, j]]
        d_opp = sum(float(ow[p, j] - ol[p, j]) for j in cols) / len(cols) if cols else d_ref
        h = float(pw[p] - pl[p]) - 0.5 * d_ref - 0.5 * d_opp
        assert float(pw.grad[p]) == pytest.approx(2 * (h - c) / P, rel=1e-10)
        assert float(pl.grad[p]) == pytest.approx(-2 * (h - c) / P, rel=1e-10)


def _ipo(pw, pl, rw, rl, tau):
    return sum(((float(pw[p] - pl[p]) - float(rw[p] - rl[p])) - 1 / (2 * tau)) ** 2 for p in range(P)) / P


@pytest.mark.parametrize("ratio", [0.0, 0.33, 0.85])
def test_two_players_with_the_reference_as_opponent_is_ipo(ratio):
    pw, pl, rw, rl, *_ = _inputs(3)
    # n = 2: the reference is the only opponent
    ref_as_opp = mnpo_loss(
        pw, pl, rw, rl, rw.unsqueeze(-1), rl.unsqueeze(-1), torch.ones(P, 1, dtype=torch.bool), eta=0.1, ratio=ratio
    )[0]
    no_opp = mnpo_loss(pw, pl, rw, rl, eta=0.1, ratio=ratio)[0]
    uncovered = mnpo_loss(
        pw, pl, rw, rl, torch.zeros(P, 2), torch.zeros(P, 2), torch.zeros(P, 2, dtype=bool), eta=0.1, ratio=ratio
    )[0]
    ipo = _ipo(pw, pl, rw, rl, tau=0.1)
    for x in (ref_as_opp, no_opp, uncovered):
        assert float(x) == pytest.approx(ipo, rel=1e-12)


def test_ratio_one_ignores_opponents():
    pw, pl, rw, rl, ow, ol, mask = _inputs(4)
    a = mnpo_loss(pw, pl, rw, rl, ow, ol, mask, eta=0.1, ratio=1.0)[0]
    b = mnpo_loss(pw, pl, rw, rl, ow * 7 - 3, ol + 5, ~mask, eta=0.1, ratio=1.0)[0]
    assert float(a) == pytest.approx(float(b), rel=1e-12)
    assert float(a) == pytest.approx(_ipo(pw, pl, rw, rl, tau=0.1), rel=1e-12)


def test_masked_entries_may_hold_garbage():
    pw, pl, rw, rl, ow, ol, mask = _inputs(5)
    a = mnpo_loss(pw, pl, rw, rl, ow, ol, mask, eta=0.1, ratio=0.5)[0]
    ow2 = torch.where(mask, ow, torch.full_like(ow, float("nan")))
    b = mnpo_loss(pw, pl, rw, rl, ow2, ol, mask, eta=0.1, ratio=0.5)[0]
    assert math.isfinite(float(b)) and float(a) == pytest.approx(float(b), rel=1e-12)


def test_td_with_the_current_iterate_is_inpo():
    # INPO (arXiv 2407.00617): ratio = tau-mixture with the current iterate pi_t as the only opponent
    pw, pl, rw, rl, *_ = _inputs(6)
    tw, tl = pw.detach() - 0.1, pl.detach() + 0.2
    loss = mnpo_loss(pw, pl, rw, rl, tw[:, None], tl[:, None], torch.ones(P, 1, dtype=torch.bool), eta=0.2, ratio=0.3)[
        0
    ]
    want = (
        sum(
            (float(pw[p] - pl[p]) - 0.3 * float(rw[p] - rl[p]) - 0.7 * float(tw[p] - tl[p]) - 2.5) ** 2
            for p in range(P)
        )
        / P
    )
    assert float(loss) == pytest.approx(want, rel=1e-12)


def test_dpo_matches_naive():
    pw, pl, rw, rl, *_ = _inputs(7)
    loss, m = dpo_loss(pw, pl, rw, rl, beta=0.5)
    want = sum(math.log1p(math.exp(-0.5 * (float(pw[p] - pl[p]) - float(rw[p] - rl[p])))) for p in range(P)) / P
    assert float(loss) == pytest.approx(want, rel=1e-12)
    assert 0.0 <= float(m["pref_acc"]) <= 1.0
    loss.backward()
    assert torch.allclose(m["pull"], -P * pw.grad, rtol=1e-10) and torch.allclose(m["pull"], P * pl.grad, rtol=1e-10)
    assert bool(((m["pull"] > 0) & (m["pull"] < 0.5)).all())  # toward the winner, at most beta


def test_bad_arguments_and_registry():
    pw, pl, rw, rl, *_ = _inputs()
    with pytest.raises(ValueError):
        mnpo_loss(pw, pl, rw, rl, eta=0.0, ratio=0.5)
    with pytest.raises(ValueError):
        mnpo_loss(pw, pl, rw, rl, eta=0.1, ratio=1.5)
    with pytest.raises(ValueError):
        dpo_loss(pw, pl, rw, rl, beta=0.0)
    assert get_loss("mnpo").kind == "mnpo" and get_loss("mnpo").fn is mnpo_loss
    assert get_loss("dpo").kind == "mnpo"
