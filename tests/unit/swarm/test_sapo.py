"""SAPO sampling and ingestion: re-scoring by the receiver, zero-advantage drops, per-peer caps, dedup."""

import dataclasses
from collections import Counter

import pytest

from protocol.errors import SwarmError
from protocol.types import Completion, Envelope, Group, RolloutBatch, TaskRef
from swarm.pool import SELF, PooledGroup, RolloutPool
from swarm.sapo import SapoBatch, SapoSampler, SolveRates, group_key, ingest_rollouts


def _group(index: int, texts: list[str]) -> Group:
    return Group(
        task=TaskRef("chain_sum", {"n": 2}, seed=0, index=index),
        completions=tuple(Completion(text=t, n_tokens=3, reward_hint=1.0) for t in texts),
    )


def _envelope(sender: str, seq: int, groups: list[Group]) -> Envelope:
    batch = RolloutBatch(model="m", policy_version=3, tokenizer="tok", groups=tuple(groups))
    return Envelope(1, "rollouts", "swarm", sender, b"k" * 32, seq, 0, 0.0, batch)


def _scorer(task: TaskRef, texts):
    # The "gold answer" of item i is str(i): the receiver's own verifier.
    if task.family != "chain_sum":
        raise SwarmError("unknown family")
    return [1.0 if t == str(task.index) else 0.0 for t in texts]


def _pooled(key: str, source: str, rewards: tuple[float, ...], step: int = 0) -> PooledGroup:
    return PooledGroup(key=key, source=source, group=_group(0, ["x"] * len(rewards)), rewards=rewards, step=step)


def test_ingest_rescores_locally_and_ignores_reward_hints():
    pool = RolloutPool(100, 10)
    env = _envelope("peerA", 7, [_group(5, ["5", "4", "5"]), _group(6, ["1", "2", "3"])])
    counts = ingest_rollouts(pool, env, _scorer, step=1)
    assert counts == Counter(accepted=1, zero_advantage=1)
    stored = {g.key: g for g in pool}
    assert stored[group_key("peerA", 7, 0)].rewards == (1.0, 0.0, 1.0)
    assert stored[group_key("peerA", 7, 0)].policy_version == 3
    # Every completion claimed reward 1.0; the receiver's verifier says all are wrong: refused, not pooled.
    assert group_key("peerA", 7, 1) not in pool


def test_ingest_drops_and_counts_bad_groups_without_raising():
    pool = RolloutPool(100, 10)
    bad_task = Group(TaskRef("evil_family", {}, 0, 0), (Completion("a", 1), Completion("b", 1)))
    tiny = _group(1, ["1"])

    def crashing(task, texts):
        if task.index == 9:
            raise ZeroDivisionError("verifier bug")
        return _scorer(task, texts)

    env = _envelope("p", 1, [bad_task, tiny, _group(9, ["a", "b"]), _group(2, ["2", "0"])])
    counts = ingest_rollouts(pool, env, crashing, step=0)
    assert counts == Counter(task_rejected=1, bad_group_size=1, score_error=1, accepted=1)
    # Delivered again (a replay that slipped past the validator, or a duplicate): stored once.
    again = ingest_rollouts(pool, env, crashing, step=0)
    assert again["duplicate"] == 1 and again["accepted"] == 0 and len(pool) == 1


def test_pool_evicts_oldest_and_filters_by_age():
    pool = RolloutPool(capacity=3, max_age_steps=2)
    for i in range(4):
        pool.add(_pooled(f"k{i}", "p", (0.0, 1.0), step=i))
    assert [g.key for g in pool] == ["k1", "k2", "k3"] and pool.evicted == 1
    assert [g.key for g in pool.fresh(4)] == ["k2", "k3"]
    assert pool.prune(4) == 1 and len(pool) == 2


def test_sampler_takes_i_local_and_j_external_informative_groups():
    pool = RolloutPool(100, 10)
    for i in range(6):
        pool.add(_pooled(f"a{i}", f"peer{i % 3}", (0.0, 1.0)))
    pool.add(_pooled("flat", "peer0", (1.0, 1.0)))
    own = [_pooled(f"own{i}", SELF, (0.0, 1.0) if i % 2 else (0.0, 0.0)) for i in range(8)]
    batch = SapoSampler(2, 3, seed=1, establish_steps=0).sample(pool, 0, own)
    assert len(batch.local) == 2 and all(g.local and g.informative for g in batch.local)
    assert len(batch.external) == 3 and all(not g.local for g in batch.external)
    assert "flat" not in {g.key for g in batch.external}
    assert batch.dropped_local_zero_adv == 4
    assert batch.metrics()["external_groups"] == 3


def test_sampler_caps_groups_per_peer():
    pool = RolloutPool(100, 10)
    for i in range(10):
        pool.add(_pooled(f"f{i}", "flooder", (0.0, 1.0)))
    pool.add(_pooled("h0", "honest", (0.0, 1.0)))
    batch = SapoSampler(0, 4, fill_local=False, seed=0, establish_steps=0).sample(pool, 0, [])
    sources = Counter(g.source for g in batch.external)
    assert sources["flooder"] == 2 and sources["honest"] == 1  # default cap ceil(4/2) = 2


def test_external_groups_are_used_once():
    pool = RolloutPool(100, 10)
    for i in range(4):
        pool.add(_pooled(f"g{i}", f"p{i}", (0.0, 1.0)))
    sampler = SapoSampler(0, 3, fill_local=False, max_per_peer=3, seed=0, establish_steps=0)
    first = {g.key for g in sampler.sample(pool, 0, []).external}
    second = {g.key for g in sampler.sample(pool, 0, []).external}
    assert len(first) == 3 and len(second) == 1 and not first & second


def test_newcomers_share_a_bounded_number_of_slots():
    """Sybil budget: senders with informative groups at fewer than establish_steps of our steps share
    floor(J * newcomer_share) slots; established peers get the rest, however many newcomers there are."""
    pool = RolloutPool(10_000, 10)
    for step in range(3):  # an honest peer contributed at three steps: established
        pool.add(_pooled(f"h{step}", "honest", (0.0, 1.0), step=step))
    pool.add(_pooled("h3", "honest", (0.0, 1.0), step=3))
    pool.add(_pooled("h4", "honest", (0.0, 1.0), step=3))
    for i in range(1000):  # a flood of throwaway identities, one informative group each
        pool.add(_pooled(f"s{i}", f"sybil{i}", (0.0, 1.0), step=3))
    sampler = SapoSampler(0, 4, fill_local=False, seed=0)
    batch = sampler.sample(pool, 3, [])
    sources = Counter(g.source for g in batch.external)
    assert batch.external_newcomer == 1 == sum(n for s, n in sources.items() if s.startswith("sybil"))
    assert sources["honest"] == 2  # its cap (ceil(4/2)); the slot left over is not handed to newcomers
    assert pool.trusted(3, 3)[0] == "honest"  # ranked by steps with useful groups


@pytest.mark.parametrize("fill", [True, False])
def test_alone_node_fills_with_local_only_when_asked(fill):
    own = [_pooled(f"own{i}", SELF, (0.0, 1.0)) for i in range(8)]
    batch = SapoSampler(4, 4, fill_local=fill, seed=0).sample(RolloutPool(10, 10), 0, own)
    assert len(batch.external) == 0
    assert len(batch.local) == (8 if fill else 4)


def test_sampler_is_deterministic_given_seed():
    def run():
        pool = RolloutPool(100, 10)
        for i in range(20):
            pool.add(_pooled(f"g{i}", f"p{i % 5}", (0.0, 1.0)))
        own = [_pooled(f"own{i}", SELF, (0.0, 1.0)) for i in range(8)]
        b = SapoSampler(3, 5, seed=42).sample(pool, 0, own)
        return [g.key for g in b.groups]

    assert run() == run()


def test_keep_zero_advantage_trains_own_flat_groups_after_informative_ones():
    own = [_pooled(f"self:0:{i}", SELF, (1.0, 1.0) if i % 2 else (1.0, 0.0)) for i in range(6)]
    filtered = SapoSampler(8, 0, seed=1).sample(RolloutPool(10, 5), 0, own)
    assert len(filtered.local) == 3 and filtered.dropped_local_zero_adv == 3
    kept = SapoSampler(4, 0, seed=1, keep_zero_advantage=True).sample(RolloutPool(10, 5), 0, own)
    assert len(kept.local) == 4 and kept.dropped_local_zero_adv == 0
    assert [g.informative for g in kept.local] == [True, True, True, False]  # informative ones first


def test_batch_metrics_separate_own_skill_from_training_batch_reward():
    pool = RolloutPool(100, 50)
    for i in range(4):
        pool.add(_pooled(f"p:{i}:0", f"peer{i % 2}", (1.0, 1.0, 1.0, 0.0), step=2))
    own = [_pooled(f"self:5:{i}", SELF, (1.0, 0.0, 0.0, 0.0)) for i in range(2)]
    batch = SapoSampler(2, 2, seed=0, establish_steps=0).sample(pool, 5, own)
    m = batch.metrics()
    assert m["external_groups"] == 2
    assert m["batch_reward_mean"] == pytest.approx((2 * 0.25 + 2 * 0.75) / 4)
    assert m["external_reward_mean"] == pytest.approx(0.75)
    assert m["external_age_mean"] == pytest.approx(3.0)


def _flooded_pool(honest_peers: int, sybils: int = 64) -> RolloutPool:
    """``honest_peers`` established sources (informative groups at 3 distinct steps, more than any batch takes) and
    ``sybils`` fresh identities with one informative group each, all fresh at step 2."""
    pool = RolloutPool(10_000, 50)
    for h in range(honest_peers):
        for step in range(3):
            for i in range(8):
                pool.add(_pooled(f"h{h}:{step}:{i}", f"honest{h}", (1.0, 0.0), step=step))
    for s in range(sybils):
        pool.add(_pooled(f"s{s}", f"sybil{s}", (1.0, 0.0), step=2))
    return pool


@pytest.mark.parametrize("j", range(1, 17))
def test_spec_11_per_step_bound_with_default_settings(j):
    """SPEC 11: s = max(1, floor(J/4)) newcomer slots; one established honest peer gets min(ceil(J/2), J - s)
    groups a step (its share h / (h + s)), two or more get J - s; the flood gets exactly s."""
    s = max(1, j // 4)
    m = max(1, -(-j // 2))
    one = SapoSampler(0, j, seed=j).sample(_flooded_pool(1), step=2, own=[])
    by = Counter("honest" if g.source.startswith("honest") else "sybil" for g in one.external)
    assert by["sybil"] == s and by["honest"] == min(m, j - s)
    many = SapoSampler(0, j, seed=j).sample(_flooded_pool(4), step=2, own=[])
    by = Counter("honest" if g.source.startswith("honest") else "sybil" for g in many.external)
    assert by["sybil"] == s and by["honest"] == j - s


def test_spec_11_worked_numbers():
    """The shares SPEC 11 quotes for one honest established peer against a flood: h / (h + s)."""

    def share(j: int) -> float:
        s, m = max(1, j // 4), max(1, -(-j // 2))
        h = min(m, j - s)
        return h / (h + s)

    assert (share(2), share(4), share(8), share(16)) == (1 / 2, 2 / 3, 2 / 3, 2 / 3)


@pytest.mark.parametrize("j", [1, 2, 4, 8, 16])
def test_spec_11_run_bound_holds_over_every_stretch_when_honest_supply_varies(j):
    """SPEC 11 over a run: whatever the honest peers supply a step (here 0..J groups, at random), newcomers never get
    more than s + rho * E groups over any stretch of steps (E: the established senders' groups trained in it, rho =
    sigma / (1 - sigma)), so over the run the flood's share tends to sigma and the honest share is >= 1/2 once E >= 3.
    Before the credit (issue 33) the flood took its s slots of every step, however few honest groups there were."""
    import random

    rng = random.Random(j)
    sampler = SapoSampler(0, j, seed=j)
    pool = RolloutPool(capacity=100_000, max_age_steps=1)
    honest = [f"honest{i}" for i in range(4)]
    for step in range(3):  # the honest peers are established before the flood (3 distinct steps each)
        for h in honest:
            pool.add(_pooled(f"{h}:warm{step}", h, (0.0, 1.0), step))
    per_step: list[tuple[int, int, int]] = []  # (newcomer groups, established groups, credit refilled) a step
    for step in range(3, 303):
        for i in range(rng.randrange(j + 1)):
            h = honest[i % len(honest)]
            pool.add(_pooled(f"{h}:{step}:{i}", h, (0.0, 1.0), step))
        for i in range(2 * j + 2):  # a fresh identity per group: never established
            pool.add(_pooled(f"sybil{step}:{i}:g", f"sybil{step}:{i}", (0.0, 1.0), step))
        batch = sampler.sample(pool, step, own=[])
        assert batch.external_newcomer <= sampler.newcomer_slots  # the per-step cap still holds
        sybil = sum(1 for g in batch.external if g.source.startswith("sybil"))
        assert sybil == batch.external_newcomer
        per_step.append((sybil, len(batch.external) - sybil, int(batch.newcomer_refill)))
    s, rho = sampler.newcomer_slots, 0.25 / 0.75
    for a in range(0, len(per_step), 7):
        for b in range(a + 1, len(per_step) + 1, 13):
            n = sum(x for x, _, _ in per_step[a:b])
            e = sum(y for _, y, _ in per_step[a:b])
            q = sum(z for _, _, z in per_step[a:b])  # steps no established sender was heard (none with j >= 2)
            assert n <= s * (1 + q) + rho * e + 1e-9, (a, b, n, e, q)
    n = sum(x for x, _, _ in per_step)
    e = sum(y for _, y, _ in per_step)
    assert e >= 3 and e / (n + e) >= 0.5
    assert n > 0  # the flood did reach the learner: the bound is what held it, not a lack of sybil groups


def test_newcomer_credit_lets_a_fresh_node_try_newcomers_at_once_and_refills_from_established_groups():
    sampler = SapoSampler(0, 8, seed=1)
    pool = RolloutPool(capacity=1000, max_age_steps=5)
    for step in range(3):  # an established sender, heard recently, whose groups were all trained on already
        pool.add(_pooled(f"old:{step}", "old", (0.0, 1.0), step))
    for g in pool:
        g.uses = 1
    for i in range(6):
        pool.add(_pooled(f"new{i}:g", f"new{i}", (0.0, 1.0), 3))
    first = sampler.sample(pool, 3, own=[])
    assert first.external_newcomer == 2 and sampler.newcomer_credit == 0.0 and not first.newcomer_refill
    assert sampler.sample(pool, 4, own=[]).external_newcomer == 0  # nothing established trained: no credit
    for i in range(3):
        pool.add(_pooled(f"old:5:{i}", "old", (0.0, 1.0), 5))
    earning = sampler.sample(pool, 5, own=[])
    assert (earning.external_newcomer, len(earning.external)) == (0, 3)
    assert sampler.newcomer_credit == pytest.approx(1.0)  # rho = 1/3 per established group trained
    assert sampler.sample(pool, 6, own=[]).external_newcomer == 1


def test_quiet_swarm_refills_the_credit_so_rarely_publishing_peers_are_still_trained_on():
    """Slow peers (real models beside a fast node) publish an informative group now and then and never become
    established at the fast node. Before the refill the fast node trained one newcomer group and then none for the
    rest of the run (the mixed-model test: 1 group in 8,336 steps, the other slow peer's never). With no established
    sender heard within the pool's max_age_steps the credit refills to s; once one is heard, the credit rule is
    back."""
    sampler = SapoSampler(0, 8, seed=3)
    pool = RolloutPool(capacity=1000, max_age_steps=5)
    trained: Counter[str] = Counter()
    for step in range(300):
        if step % 37 == 0:  # each slow peer publishes one informative group every 37 steps
            for peer in ("slow-a", "slow-b"):
                pool.add(_pooled(f"{peer}:{step}", peer, (0.0, 1.0), step))
        batch = sampler.sample(pool, step, own=[])
        if step < 74:  # newcomers until their third group (step 74), and nobody else to hear
            assert batch.newcomer_refill and batch.newcomer_credit == 2.0 - batch.external_newcomer
        trained.update(g.source for g in batch.external)
    assert trained == {"slow-a": 9, "slow-b": 9}  # every group they published (steps 0, 37, ..., 296)

    for step in range(300, 303):  # a sender gets established (3 distinct steps) and is heard...
        pool.add(_pooled(f"steady:{step}", "steady", (0.0, 1.0), step))
        sampler.sample(pool, step, own=[])
    for step in range(303, 309):  # ...then newcomers pay from the credit again, until it has been quiet for 5 steps
        pool.add(_pooled(f"fresh{step}:g", f"fresh{step}", (0.0, 1.0), step))
        batch = sampler.sample(pool, step, own=[])
        assert batch.newcomer_refill == (step - 302 > 5), step
    assert pool.hears_established(307, 3) and not pool.hears_established(308, 3)


def test_a_flood_of_fresh_identities_cannot_evict_established_peers_from_the_source_table():
    pool = RolloutPool(capacity=10_000, max_age_steps=50)
    pool.max_sources = 16
    for step in range(3):
        for h in ("honest-a", "honest-b"):
            pool.add(_pooled(f"{h}:{step}", h, (0.0, 1.0), step))
    for i in range(1000):  # fresh identities, each newer than the honest peers' last group
        pool.add(_pooled(f"sybil{i}:g", f"sybil{i}", (0.0, 1.0), 3 + i // 100))
    assert pool.active_steps("honest-a") == pool.active_steps("honest-b") == 3  # still established
    assert len(pool._sources) == 16
    assert pool.hears_established(40, 3) and not pool.hears_established(60, 3)  # heard until max_age_steps pass
    # a table full of established sources still evicts (the oldest): it stays bounded
    pool.protect_steps = 1
    pool.add(_pooled("late:g", "late", (0.0, 1.0), 20))
    assert len(pool._sources) == 16


# ---------------------------------------------------------------- receiver credit (sapo.peer_advantage: receiver)


def _own(key: str, rewards: tuple[float, ...], family: str = "chain_sum") -> PooledGroup:
    group = Group(TaskRef(family, {"n": 2}, 0, 0), tuple(Completion("x", 1) for _ in rewards))
    return PooledGroup(key=key, source=SELF, group=group, rewards=rewards, step=0)


def test_solve_rates_credit_a_peers_right_answers_against_the_receivers_own_rate():
    rates = SolveRates(decay=0.5)
    peer = _pooled("p:1:0", "peer", (1.0, 0.0, 1.0, 0.25))
    # Before the receiver generated anything on the family, a right answer is worth the most it can be.
    assert rates.advantages(peer) == [1.0, 0.0, 1.0, 0.0]
    rates.update([_own("a", (1.0, 0.0, 0.0, 0.0)), peer])  # peers' groups do not move the receiver's rate
    assert rates.rate("chain_sum") == 0.25
    rates.update([_own("b", (1.0, 1.0, 1.0, 0.0))])
    assert rates.rate("chain_sum") == pytest.approx(0.5 * 0.25 + 0.5 * 0.75)
    assert rates.advantages(peer) == pytest.approx([0.5, 0.0, 0.5, 0.0])
    assert rates.metrics() == {"receiver_baseline_chain_sum": 0.5}
    rates.update([_own("c", (1.0,) * 4)] * 60)  # a receiver that solves the family learns nothing from it
    assert max(rates.advantages(peer)) < 1e-6
    assert rates.teaches(peer) and not rates.teaches(_pooled("p:1:1", "peer", (0.5, 0.0)))
    with pytest.raises(ValueError, match="decay"):
        SolveRates(decay=1.0)


def test_stronger_only_takes_a_peer_group_only_when_it_solves_more_often_than_the_receiver():
    rates = SolveRates(decay=0.5, stronger_only=True)
    weak, strong = _pooled("w:1:0", "weak", (1.0, 0.0, 0.0, 0.0)), _pooled("s:1:0", "strong", (1.0, 1.0, 1.0, 0.0))
    assert rates.teaches(weak) and rates.teaches(strong)  # b = 0 before the receiver's first group
    rates.update([_own("a", (1.0, 1.0, 0.0, 0.0))])  # b = 0.5
    assert not rates.teaches(weak) and rates.teaches(strong)
    assert not rates.teaches(_pooled("e:1:0", "even", (1.0, 1.0, 0.0, 0.0)))  # as often as the receiver: not above b
    # Another family's rate is its own: the receiver has not tried it, so the weak peer's right answer counts there.
    other = _own("o", (1.0, 0.0, 0.0, 0.0), family="other")
    assert rates.teaches(PooledGroup(key="o:1:0", source="weak", group=other.group, rewards=other.rewards, step=0))
    rates.update([_own("b", (1.0,) * 4)] * 10)  # b near 1: only an all-right group is above it, and worth ~0
    assert not rates.teaches(strong) and rates.teaches(_pooled("p:1:0", "perfect", (1.0,) * 4))
    assert SolveRates().teaches(weak)  # the default takes any group with a right answer


def test_receiver_ingest_keeps_all_right_groups_and_drops_groups_without_a_right_answer():
    env = _envelope("peerA", 3, [_group(5, ["5", "5"]), _group(6, ["1", "2"]), _group(7, ["7", "0"])])
    group_pool, receiver_pool = RolloutPool(100, 10), RolloutPool(100, 10)
    assert ingest_rollouts(group_pool, env, _scorer, step=1) == Counter(accepted=1, zero_advantage=2)
    assert ingest_rollouts(receiver_pool, env, _scorer, step=1, receiver=True) == Counter(accepted=2, zero_advantage=1)
    assert {g.key for g in receiver_pool} == {group_key("peerA", 3, 0), group_key("peerA", 3, 2)}
    # An all-right group establishes its sender like an informative one (the sybil budget still applies to it).
    assert receiver_pool.active_steps("peerA") == 1


def test_a_receiver_sampler_takes_groups_with_a_right_answer_only():
    pool = RolloutPool(100, 10)
    pool.add(_pooled("a:1:0", "a", (1.0, 1.0)))
    pool.add(_pooled("b:1:0", "b", (0.5, 0.0)))  # informative, but nothing right in it
    sampler = SapoSampler(0, 2, max_per_peer=2, newcomer_share=1.0, useful=SolveRates().teaches)
    assert [g.key for g in sampler.sample(pool, 0, []).external] == ["a:1:0"]
    group_sampler = SapoSampler(0, 2, max_per_peer=2, newcomer_share=1.0)
    assert [g.key for g in group_sampler.sample(pool, 0, []).external] == ["b:1:0"]


def test_trace_groups_come_after_the_rl_draw_from_established_senders_with_a_solved_completion_only():
    """``sapo.trace_groups``: more peers' groups for the trace step only. They never change the RL draw (their own
    random stream), hold a solved completion, come from established senders only (a sybil flood of fresh identities
    gets none), at most ``max_per_peer`` a sender, each group used once."""

    def pool_and_keys() -> RolloutPool:
        pool = RolloutPool(10_000, 10)
        for peer in ("a", "b", "c"):
            for step in range(3):  # established: informative groups at three steps of ours
                for i in range(4):
                    pool.add(_pooled(f"{peer}{step}:{i}", peer, (0.0, 1.0), step=step))
            pool.add(_pooled(f"{peer}-unsolved", peer, (0.0, 0.5), step=2))  # informative, but nothing right
        for i in range(50):
            pool.add(_pooled(f"sybil{i}", f"sybil{i}", (0.0, 1.0), step=2))
        return pool

    plain_pool, pool = pool_and_keys(), pool_and_keys()
    plain = SapoSampler(0, 4, fill_local=False, seed=7, max_per_peer=3)
    sampler = SapoSampler(0, 4, fill_local=False, seed=7, max_per_peer=3)
    for step in (2, 3):
        without = plain.choose_external(plain_pool, step)
        batch = sampler.choose_external(pool, step)
        sampler.choose_traces(pool, step, batch, 8)
        if step == 2:  # the RL draw as it was (later steps draw from a pool without the groups traces took)
            assert [g.key for g in batch.external] == [g.key for g in without.external]
        assert len(batch.traces) == 8 and not {g.key for g in batch.traces} & {g.key for g in batch.external}
        assert all(g.source in "abc" and g.key != f"{g.source}-unsolved" for g in batch.traces)
        assert max(Counter(g.source for g in batch.traces).values()) <= 3  # max_per_peer
        assert all(g.uses == 1 for g in batch.traces)
        assert batch.metrics()["trace_groups"] == 8 and "trace_groups" not in without.metrics()
    for _ in range(10):  # take what is left, three a sender a step: every established sender's solved group
        sampler.choose_traces(pool, 3, SapoBatch(step=3), 100)
    assert {g.key for g in pool.fresh(3, local=False, unused_only=True) if g.source in "abc"} == {
        "a-unsolved", "b-unsolved", "c-unsolved"
    }  # fmt: skip


def test_trace_families_keep_the_trace_groups_of_those_families_only():
    """``sapo.trace_families``: a node takes peers' working for the families it names (where it lacks them); the
    other families' solved groups stay in the pool, unused."""
    pool = RolloutPool(10_000, 10)
    for step in range(3):
        for i, family in enumerate(["lab_add", "lab_sub"] * 3):
            g = _pooled(f"a{step}:{i}", "a", (0.0, 1.0), step=step)
            task = dataclasses.replace(g.group.task, family=family)
            pool.add(dataclasses.replace(g, group=dataclasses.replace(g.group, task=task)))
    sampler = SapoSampler(0, 4, fill_local=False, seed=7, max_per_peer=100)
    batch = sampler.choose_external(pool, 2)
    sampler.choose_traces(pool, 2, batch, 100, families=["lab_sub"])
    assert batch.traces and {g.group.task.family for g in batch.traces} == {"lab_sub"}
    left = {g.group.task.family for g in pool.fresh(2, local=False, unused_only=True)}
    assert left == {"lab_add"}
    every = SapoSampler(0, 4, fill_local=False, seed=7, max_per_peer=100)
    rest = SapoBatch(step=2)
    every.choose_traces(pool, 2, rest, 100)
    assert {g.group.task.family for g in rest.traces} == {"lab_add"}  # without the filter: what was left


def test_trace_groups_take_at_most_half_of_them_from_one_sender_unless_max_per_peer_is_set():
    """With ``max_per_peer`` unset (the default, peer-trace), one sender fills at most half the step's trace groups
    (rounded up), as it fills at most half the J RL slots: with J = 0 the RL slots' cap (1) does not apply. Set, it
    is the cap (the registered het comparison's two nodes set 16)."""

    def pool(peers: dict[str, int]) -> RolloutPool:
        p = RolloutPool(10_000, 10)
        for peer, n in peers.items():
            for step in range(3):
                for i in range(n):
                    p.add(_pooled(f"{peer}{step}:{i}", peer, (0.0, 1.0), step=step))
        return p

    def traces(sampler: SapoSampler, peers: dict[str, int], limit: int) -> Counter[str]:
        batch = SapoBatch(step=2)
        sampler.choose_traces(pool(peers), 2, batch, limit)
        return Counter(g.source for g in batch.traces)

    assert traces(SapoSampler(8, 0, seed=1), {"a": 12}, 16) == {"a": 8}
    assert traces(SapoSampler(8, 0, seed=1), {"a": 12}, 5) == {"a": 3}
    assert traces(SapoSampler(8, 0, seed=1), {"a": 12, "b": 2}, 16) == {"a": 8, "b": 6}
    assert traces(SapoSampler(8, 0, seed=1, max_per_peer=16), {"a": 12}, 16) == {"a": 16}
    assert traces(SapoSampler(8, 0, seed=1, max_per_peer=2), {"a": 12}, 16) == {"a": 2}
