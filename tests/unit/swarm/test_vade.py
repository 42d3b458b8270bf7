"""VADE posteriors (exact numbers), global decay, Thompson top-B, JSON state; DART rollout counts (table)."""

from __future__ import annotations

import json
import random

import pytest

from swarm.vade import SCORES, VadeSelector, beta_update, dart_rollouts, global_decay, register_score


def test_posterior_updates_follow_the_formula_exactly() -> None:
    v = VadeSelector(prior_a=1.0, prior_b=2.0, lam=0.5, gamma=0.5, stale_steps=10)
    assert v.posterior("x", 0) == (1.0, 2.0)
    # a <- lam a + (1 - lam) a0 + k ; b <- lam b + (1 - lam) b0 + (n - k)
    assert v.update("x", 3, 4, step=0) == pytest.approx((0.5 * 1 + 0.5 * 1 + 3, 0.5 * 2 + 0.5 * 2 + 1))  # (4, 3)
    assert v.update("x", 0, 4, step=1) == pytest.approx((0.5 * 4 + 0.5 + 0, 0.5 * 3 + 1 + 4))  # (2.5, 6.5)
    assert v.update("x", 2.5, 4, step=2) == pytest.approx((0.5 * 2.5 + 0.5 + 2.5, 0.5 * 6.5 + 1 + 1.5))  # fractional k
    assert v.posterior("x", 2) == pytest.approx((4.25, 5.75))
    assert v.mean("x", 2) == pytest.approx(4.25 / 10.0)
    # idle for 12 steps (> stale_steps = 10): 2 steps of decay by gamma toward the prior
    a, b = v.posterior("x", 14)
    assert a == pytest.approx(1.0 + (4.25 - 1.0) * 0.25) and b == pytest.approx(2.0 + (5.75 - 2.0) * 0.25)
    assert v.posterior("x", 12) == pytest.approx((4.25, 5.75))  # not yet stale
    # the next update starts from the decayed posterior
    assert v.update("x", 1, 1, step=14) == pytest.approx((0.5 * a + 0.5 + 1, 0.5 * b + 1 + 0))


def test_lam_one_is_plain_bayes_and_lam_zero_forgets() -> None:
    assert beta_update(2.0, 3.0, 1, 4, a0=1, b0=1, lam=1.0) == (3.0, 6.0)
    assert beta_update(2.0, 3.0, 1, 4, a0=1, b0=1, lam=0.0) == (2.0, 4.0)
    assert global_decay(5.0, 1.0, 3, stale_steps=3, gamma=0.0) == 5.0
    assert global_decay(5.0, 1.0, 4, stale_steps=3, gamma=0.0) == 1.0
    with pytest.raises(ValueError):
        beta_update(1, 1, 5, 4, a0=1, b0=1, lam=0.5)


def test_thompson_selection_prefers_uncertain_prompts() -> None:
    v = VadeSelector(lam=1.0)
    for step in range(20):
        v.update("easy", 8, 8, step)  # always solved: p -> 1, p(1-p) -> 0
        v.update("hard", 0, 8, step)  # never solved
        v.update("mid", 4, 8, step)  # half solved: most informative
    rng = random.Random(0)
    picks = [v.select(["easy", "hard", "mid", "mid"], 1, rng, 20)[0] for _ in range(200)]
    assert picks.count(2) > 190  # "mid" (first occurrence), duplicates considered once
    assert sorted(v.select(["easy", "hard", "mid"], 3, rng, 20)) == [0, 1, 2]
    # an unknown prompt (prior Beta(1,1)) beats a certain one most of the time
    wins = sum(v.select(["easy", "new"], 1, rng, 20) == [1] for _ in range(200))
    assert wins > 180


def test_selection_is_deterministic_given_the_rng() -> None:
    v = VadeSelector()
    keys = [f"k{i}" for i in range(30)]
    for i, k in enumerate(keys):
        v.update(k, i % 5, 4 if i % 5 < 5 else 5, i)
    assert v.select(keys, 5, random.Random(3), 40) == v.select(keys, 5, random.Random(3), 40)


def test_state_roundtrips_through_json_and_max_tracked_evicts_oldest() -> None:
    v = VadeSelector(max_tracked=2)
    v.update("a", 1, 2, 0, payload={"family": "f", "index": 1})
    v.update("b", 2, 2, 1)
    v.update("a", 0, 2, 2)  # refreshes "a" (payload kept)
    v.update("c", 1, 1, 3)  # evicts "b", the least recently updated
    state = json.loads(json.dumps(v.state_dict()))
    w = VadeSelector(max_tracked=2)
    w.load_state_dict(state)
    assert [k for k, _ in w.tracked()] == ["a", "c"]
    assert w.tracked()[0][1] == {"family": "f", "index": 1}
    assert w.posterior("a", 5) == v.posterior("a", 5) and w.posterior("b", 5) == (1.0, 1.0)


def test_scores_are_pluggable() -> None:
    register_score("p", lambda p: p)
    v = VadeSelector(score="p", lam=1.0)
    v.update("good", 10, 10, 0)
    v.update("bad", 0, 10, 0)
    assert v.select(["bad", "good"], 1, random.Random(0), 0) == [1]
    del SCORES["p"]
    with pytest.raises(ValueError):
        VadeSelector(score="nope")


@pytest.mark.parametrize(
    ("s", "g", "n_min", "expected"),
    [
        (0.0, 8, 2, 8),
        (0.3, 8, 2, 8),
        (0.59, 8, 2, 8),
        (0.6, 8, 2, 8),  # 9/0.6 - 7 = 8
        (0.65, 8, 2, 6),  # floor(6.846)
        (0.7, 8, 2, 5),  # floor(5.857)
        (0.75, 8, 2, 5),  # 9/0.75 - 7 = 5
        (0.8, 8, 2, 4),  # floor(4.25)
        (0.9, 8, 2, 3),  # 9/0.9 - 7 = 3
        (0.95, 8, 2, 2),  # floor(2.47)
        (1.0, 8, 2, 2),
        (1.0, 8, 4, 4),  # n_min wins
        (0.6, 4, 2, 4),  # never more than G
        (0.2, 16, 2, 16),
        (0.7, 16, 2, 5),
        (1.5, 8, 2, 2),  # clamped to [0, 1]
    ],
)
def test_dart_rollout_counts(s: float, g: int, n_min: int, expected: int) -> None:
    assert dart_rollouts(s, g, n_min) == expected
