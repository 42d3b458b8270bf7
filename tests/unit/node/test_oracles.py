"""Preference oracles: verifiable (pairs only where rewards differ), a local reward model, the synthetic one."""

import random
import threading
from collections import Counter

import pytest

from node.mnpo.oracles import (
    OracleError,
    RewardModelOracle,
    SyntheticOracle,
    VerifiableOracle,
    build_oracle,
    response_text,
)
from protocol.types import TaskRef
from swarm.mnpo import History, Response, ResponseStore, ScoreBook
from swarm.scores import response_hash

T = TaskRef("chain_sum", {}, 0, 1)


class FakeTasks:
    """Gold answer "4": reward 1 for it, 0.5 for "3", 0 otherwise."""

    def materialize(self, ref):
        return ref

    def score(self, item, text):
        return {"4": 1.0, "3": 0.5}.get(text, 0.0)


def test_verifiable_pairs_only_where_rewards_differ():
    o = VerifiableOracle(FakeTasks())
    texts = ["4", "x", "y", "3", "4"]
    pairs = o.pairs(T, texts, random.Random(0))
    assert set(pairs) == {(0, 1), (0, 2), (0, 3), (3, 1), (3, 2), (4, 1), (4, 2), (4, 3)}
    assert o.pairs(T, ["x", "y"], random.Random(0)) == []  # a tie says nothing
    assert VerifiableOracle(FakeTasks(), margin=0.6).pairs(T, ["4", "3", "x"], random.Random(0)) == [(0, 2)]


class GoldTasks:
    """An item with gold answer "4"; partial credit 0.5 for "3", as a lenient verifier might give."""

    class Item:
        answer = "4"

    def materialize(self, ref):
        return self.Item()

    def score(self, item, text):
        from node.tasks import extract_answer

        return {"4": 1.0, "3": 0.5}.get(extract_answer(text) or "", 0.0)


def test_exact_rank_puts_right_first_then_format_then_length():
    o = VerifiableOracle(GoldTasks(), rank="exact")
    texts = [
        "<answer>4</answer>",  # 0: right, short
        "so <answer>4</answer>",  # 1: right, longer
        "<answer>3</answer>",  # 2: wrong (partial credit does not count), formatted
        "4",  # 3: no answer in the format
        "<answer>5</answer>",  # 4: wrong, formatted, as long as 2: a tie with it
    ]
    pairs = set(o.pairs(T, texts, random.Random(0)))
    assert pairs == {(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4), (2, 3), (4, 3)}
    assert (2, 4) not in pairs and (4, 2) not in pairs  # equal on all three keys: no pair
    # the reward rank would let partial credit decide "3" over "5", and say nothing between the two right answers
    by_reward = set(VerifiableOracle(GoldTasks()).pairs(T, texts, random.Random(0)))
    assert (2, 4) in by_reward and (0, 1) not in by_reward


def test_without_the_length_tie_break_two_wrong_answers_make_no_pair():
    o = VerifiableOracle(GoldTasks(), rank="exact", shorter_wins=False)
    texts = ["<answer>4</answer>", "so <answer>4</answer>", "<answer>3</answer>", "4", "it is <answer>57</answer>"]
    pairs = set(o.pairs(T, texts, random.Random(0)))
    # right over wrong and in-format over not stay; right vs right and wrong vs wrong (both formatted) are ties now
    assert pairs == {(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4), (2, 3), (4, 3)}
    with_length = set(VerifiableOracle(GoldTasks(), rank="exact").pairs(T, texts, random.Random(0)))
    assert with_length - pairs == {(0, 1), (2, 4)}  # the shorter right answer, the shorter wrong one


def test_build_oracle_from_config():
    from node.config import VerifiableOracleConfig

    o = build_oracle(VerifiableOracleConfig(margin=0.1), FakeTasks(), prompt_of=str, device="cpu")
    assert isinstance(o, VerifiableOracle) and o.margin == 0.1 and o.rank == "reward"
    o = build_oracle(VerifiableOracleConfig(rank="exact"), FakeTasks(), prompt_of=str, device="cpu")
    assert isinstance(o, VerifiableOracle) and o.rank == "exact" and o.shorter_wins
    o = build_oracle(VerifiableOracleConfig(rank="exact", shorter_wins=False), FakeTasks(), prompt_of=str, device="cpu")
    assert isinstance(o, VerifiableOracle) and not o.shorter_wins


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory):
    """A randomly initialised one-layer sequence-classification model and tokenizer, saved locally (no download)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerFast, Qwen2Config

    d = tmp_path_factory.mktemp("rm")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["what is 2 + 2?", "<answer>4</answer>", "<answer>5</answer>"], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(d)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=fast.pad_token_id,
    )
    AutoModelForSequenceClassification.from_config(cfg).save_pretrained(d)
    return d


def test_reward_model_oracle_scores_and_pairs(tiny_reward_model):
    o = RewardModelOracle(str(tiny_reward_model), prompt_of=lambda t: "what is 2 + 2?", batch_size=2)
    texts = ["<answer>4</answer>", "<answer>5</answer>", "no idea", "<answer>4</answer> ok"]
    s = o.scores(T, texts)
    assert len(s) == 4 and s == o.scores(T, texts)  # deterministic, batching does not matter
    assert s == pytest.approx(
        RewardModelOracle(str(tiny_reward_model), prompt_of=lambda t: "what is 2 + 2?", batch_size=16).scores(T, texts),
        abs=1e-5,
    )
    for w, lo in o.pairs(T, texts, random.Random(0)):
        assert s[w] > s[lo]
    assert len(o.pairs(T, texts, random.Random(0))) == 6  # random scores: no ties


def test_reward_model_missing_is_one_clear_error(tmp_path):
    with pytest.raises(OracleError, match="does not exist"):
        RewardModelOracle(str(tmp_path / "nope" / "x" / "y"), prompt_of=str)
    with pytest.raises(OracleError):
        RewardModelOracle(str(tmp_path), prompt_of=str)  # a directory without a model


def test_synthetic_cyclic_matrix_is_rock_paper_scissors():
    m = SyntheticOracle.cyclic_matrix(3)
    assert m[0][1] == 1.0 and m[1][2] == 1.0 and m[2][0] == 1.0  # r0 > r1 > r2 > r0
    for a in range(3):
        for b in range(3):
            assert m[a][b] + m[b][a] == pytest.approx(1.0)
    with pytest.raises(OracleError):
        SyntheticOracle.cyclic_matrix(4)
    with pytest.raises(OracleError):
        SyntheticOracle([[0.5, 0.9], [0.9, 0.5]])


def test_synthetic_population_is_heterogeneous_and_centred():
    pop, players = SyntheticOracle.population(4, 5, cyclic=0.6, transitive=0.3, heterogeneity=0.5, seed=1)
    assert len(players) == 4
    assert any(abs(players[0].prob(0, 1) - players[1].prob(0, 1)) > 1e-3 for _ in range(1))
    for a in range(5):
        for b in range(5):
            mean = sum(p.prob(a, b) for p in players) / 4
            assert mean == pytest.approx(pop.prob(a, b), abs=0.2)  # centred noise (up to clipping)
            assert players[2].prob(a, b) + players[2].prob(b, a) == pytest.approx(1.0)


def test_synthetic_pairs_follow_the_matrix():
    o = SyntheticOracle(SyntheticOracle.cyclic_matrix(3, cyclic=0.5))  # P(r0 > r1) = 0.75
    rng = random.Random(0)
    wins = sum(o.pairs(T, [response_text(0), response_text(1)], rng) == [(0, 1)] for _ in range(4000))
    assert 0.72 < wins / 4000 < 0.78
    assert o.pairs(T, ["r0", "r0", "other"], rng) == []


def test_exact_flags_only_from_an_oracle_that_knows():
    o = VerifiableOracle(GoldTasks(), rank="exact")
    assert o.exact(T, ["<answer>4</answer>", "<answer>3</answer>", "4"]) == [True, False, False]
    assert SyntheticOracle([[0.5, 0.5], [0.5, 0.5]]).exact(T, ["a", "b"]) is None


# ------------------------------------------------------------------ the MNPO phase's pairs from a verifier

PAIR_TEXTS = ["<answer>4</answer>", "<answer>3</answer>", "<answer>5</answer>", "so <answer>5</answer>"]
OTHER = TaskRef("chain_sum", {}, 0, 2)
LONE = TaskRef("chain_sum", {}, 0, 3)


def phase_with(pool, oracle=None, pairs_per_step=16):
    """A phase with only what ``build_pairs`` uses (the pool, the oracle, the config): no model, no learner."""
    from node.config import MnpoConfig
    from node.mnpo.phase import MnpoPhase

    phase = object.__new__(MnpoPhase)
    phase.cfg = MnpoConfig(opponents="none", pairs_per_step=pairs_per_step)
    phase.store, phase.book, phase.history = ResponseStore(), ScoreBook(), History(2)
    phase.oracle, phase.rng = oracle or VerifiableOracle(GoldTasks(), rank="exact"), random.Random(0)
    phase.counts, phase._lock, phase.pair_diagnostics = Counter(), threading.Lock(), {}
    for task, texts in pool:
        for t in texts:
            assert phase.store.add(Response(response_hash(task, t), task, t, "self", 0)) == "added"
    return phase


POOL = [(T, PAIR_TEXTS), (OTHER, ["<answer>7</answer>", "<answer>8</answer>"]), (LONE, ["<answer>4</answer>"])]


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


def test_decisive_pull_is_the_signed_share_of_the_update_on_pairs_exactness_decided():
    phase = phase_with(POOL)
    pairs = phase.build_pairs()
    pulls = [4.0 if p.decisive else -1.0 for p in pairs]  # 3 decisive pairs pulled, 2 tie-breaks pushed back
    assert phase._decisive_pull(pairs, pulls) == {"mnpo_decisive_pull": pytest.approx(12.0 / 14.0)}
    assert phase._decisive_pull(pairs, [0.0 if p.decisive else 1.0 for p in pairs]) == {"mnpo_decisive_pull": 0.0}
    assert phase._decisive_pull(pairs, pulls[:-1]) == {}  # a pull missing: no figure rather than a wrong one
    assert phase._decisive_pull(pairs, [0.0] * len(pairs)) == {}
    phase.pair_diagnostics.pop("mnpo_exact_pairs")  # an oracle without exact flags
    assert phase._decisive_pull(pairs, pulls) == {}


def test_decisive_pairs_go_first():
    phase = phase_with(POOL, pairs_per_step=3)  # 3 of the 5: in random order (this seed) one would be a tie-break's
    chosen = phase.build_pairs()
    assert all(p.decisive and p.win.text == PAIR_TEXTS[0] for p in chosen) and len(chosen) == 3
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
    assert len(pairs) == 5 and not any(p.decisive for p in pairs)  # by reward on T: "4" > "3" > the two "5"s
    assert phase.counts["exact_errors"] == 2 and "mnpo_exact_pairs" not in phase.pair_diagnostics


def test_the_reward_rank_also_trains_decisive_pairs_first():
    pairs = phase_with(POOL, VerifiableOracle(GoldTasks())).build_pairs()
    assert len(pairs) == 5 and sum(p.decisive for p in pairs) == 3  # partial credit orders "3" over the "5"s too
    pairs = phase_with(POOL, VerifiableOracle(GoldTasks()), pairs_per_step=3).build_pairs()
    assert all(p.decisive for p in pairs)


def test_nothing_pooled_gives_no_figures():
    phase = phase_with([(LONE, ["<answer>4</answer>"])])
    assert phase.build_pairs() == [] and phase.pair_diagnostics == {}
