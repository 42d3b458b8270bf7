"""The MNPO phase's pairs from a verifier: decisive pairs first, and the figures that say what limited the signal."""

import random
import threading
from collections import Counter

from node.config import MnpoConfig
from node.mnpo.oracles import VerifiableOracle
from node.mnpo.phase import MnpoPhase
from protocol.types import TaskRef
from swarm.mnpo import History, Response, ResponseStore, ScoreBook
from swarm.scores import response_hash

T = TaskRef("chain_sum", {}, 0, 1)
OTHER = TaskRef("chain_sum", {}, 0, 2)
LONE = TaskRef("chain_sum", {}, 0, 3)
TEXTS = ["<answer>4</answer>", "<answer>3</answer>", "<answer>5</answer>", "so <answer>5</answer>"]


class GoldTasks:
    """Gold answer "4" for every item."""

    class Item:
        answer = "4"

    def materialize(self, ref):
        return self.Item()

    def score(self, item, text):
        from node.tasks import extract_answer

        return float(extract_answer(text) == "4")


def phase_with(pool, oracle=None, pairs_per_step=16):
    """A phase with only what ``build_pairs`` uses (the pool, the oracle, the config): no model, no learner."""
    phase = object.__new__(MnpoPhase)
    phase.cfg = MnpoConfig(opponents="none", pairs_per_step=pairs_per_step)
    phase.store, phase.book, phase.history = ResponseStore(), ScoreBook(), History(2)
    phase.oracle, phase.rng = oracle or VerifiableOracle(GoldTasks(), rank="exact"), random.Random(0)
    phase.counts, phase._lock, phase.pair_diagnostics = Counter(), threading.Lock(), {}
    for task, texts in pool:
        for t in texts:
            assert phase.store.add(Response(response_hash(task, t), task, t, "self", 0)) == "added"
    return phase


POOL = [(T, TEXTS), (OTHER, ["<answer>7</answer>", "<answer>8</answer>"]), (LONE, ["<answer>4</answer>"])]


def test_diagnostics_count_ties_and_what_exactness_decided():
    phase = phase_with(POOL)
    pairs = phase.build_pairs()
    # T: 6 pairs of distinct responses, "3" and "5" tied (both wrong, one length): 5 pairs, 3 of them "4" over a wrong
    # one; OTHER: two wrong answers of one length, a tie; LONE has one response and makes no pair
    assert len(pairs) == 5 and sum(p.decisive for p in pairs) == 3
    assert phase.pair_diagnostics == {
        "mnpo_pool_prompts": 2.0,
        "mnpo_distinct_per_prompt": 3.0,
        "mnpo_candidates": 5.0,
        "mnpo_ties": 2.0,
        "mnpo_exact_pairs": 3.0,
    }


def test_decisive_pairs_go_first():
    phase = phase_with(POOL, pairs_per_step=3)  # 3 of the 5: in random order (this seed) one would be a tie-break's
    chosen = phase.build_pairs()
    assert all(p.decisive and p.win.text == TEXTS[0] for p in chosen) and len(chosen) == 3
    assert phase.pair_diagnostics["mnpo_exact_pairs"] == 3.0


def test_an_oracle_failing_on_exactness_still_pairs():
    from node.mnpo.oracles import PointwiseOracle

    class Broken(PointwiseOracle):  # pairs by the verifier's reward; its exact flags come one for many texts
        def scores(self, task, texts):
            return [GoldTasks().score(None, t) for t in texts]

        def exact(self, task, texts):
            return [True]

    phase = phase_with(POOL, Broken())
    pairs = phase.build_pairs()
    assert len(pairs) == 3 and not any(p.decisive for p in pairs)  # "4" over each wrong answer on T
    assert phase.counts["exact_errors"] == 2 and "mnpo_exact_pairs" not in phase.pair_diagnostics


def test_the_reward_rank_also_trains_decisive_pairs_first():
    pairs = phase_with(POOL, VerifiableOracle(GoldTasks())).build_pairs()
    assert len(pairs) == 3 and all(p.decisive for p in pairs)  # rewards 1 and 0: only "4" over a wrong answer


def test_nothing_pooled_gives_no_figures():
    phase = phase_with([(LONE, ["<answer>4</answer>"])])
    assert phase.build_pairs() == [] and phase.pair_diagnostics == {}
