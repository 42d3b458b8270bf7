"""The node's side of SAPO's switches: importance weights on peers' completions can be turned off."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from node.config import NodeConfig
from node.model import tiny
from protocol.types import Completion, Group, TaskRef
from swarm.pool import PooledGroup
from swarm.sapo import SapoBatch

if TYPE_CHECKING:
    from node.runtime import Node


@pytest.fixture(scope="module")
def model_dir(tiny_cache: Path) -> Path:
    return tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE)


def _peer_group(node, ref: TaskRef) -> PooledGroup:
    completions = tuple(
        Completion(text=t, n_tokens=3, finish_reason="stop", logprob_mean=-0.7) for t in ("<answer>3</answer>", "x")
    )
    return PooledGroup(
        key="peer:1:0",
        source="peer",
        group=Group(task=ref, completions=completions),
        rewards=(1.0, 0.0),
        step=0,
        tokenizer=node.policy.tokenizer_id,
    )


@pytest.mark.parametrize("weights", [True, False])
def test_peer_importance_weights_switch(model_dir: Path, tmp_path: Path, weights: bool) -> None:
    from node.runtime import Node, build_parts

    cfg = NodeConfig.model_validate(
        {
            "model": {"name": str(model_dir), "device": "cpu"},
            "sapo": {"peer_importance_weights": weights, "peer_advantage": "group"},
        }
    )

    async def run():
        node = await Node.create(cfg, tmp_path / str(weights), parts=build_parts(cfg), live=False)
        try:
            import random

            ref = node.tasks.sample(random.Random(0), 1)[0]
            samples = node.samples.build(SapoBatch(external=[_peer_group(node, ref)]), {})
        finally:
            await node.close()
        return samples

    samples = asyncio.run(run())
    assert len(samples) == 2 and all(s.external for s in samples)
    assert all(s.behaviour_logprob_mean == (-0.7 if weights else None) for s in samples)


def test_close_does_not_wait_for_a_task_that_ignores_its_cancellation(
    model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopping node closes its channel and flushes its files even while a background task is stuck; it names
    the task."""
    from node.runtime import Node, build_parts

    cfg = NodeConfig.model_validate(
        {"model": {"name": str(model_dir), "device": "cpu"}, "runtime": {"shutdown_timeout_s": 0.5}}
    )
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await release.wait()  # ignores its cancellation until the test lets it go

    async def run() -> tuple[bool, bool]:
        node = await Node.create(cfg, tmp_path, parts=build_parts(cfg), live=False)
        task = node._spawn(stubborn(), "stubborn")
        await asyncio.sleep(0)
        await node.close()
        still_running, flushed = not task.done(), node._metrics is not None and node._metrics.closed
        release.set()
        await task
        return still_running, flushed

    with caplog.at_level("WARNING", logger="node.runtime"):
        still_running, flushed = asyncio.run(run())
    assert still_running and flushed, "closed without waiting for the stuck task"
    assert ":stubborn did not stop within" in caplog.text, caplog.text


def test_the_sybil_budget_settings_reach_the_nodes_sampler(tmp_path: Path) -> None:
    from node.runtime import Node
    from sim.scripted import build_scripted_parts

    cfg = NodeConfig.model_validate({"sapo": {"newcomer_share": 0.5, "establish_steps": 7}})
    parts = build_scripted_parts(cfg, lr=1.0, init_p=0.1, init_spread=0.0, max_p=0.9, answer_tokens=4)
    node = Node(cfg, tmp_path, parts, live=False)
    assert (node.sampler.newcomer_share, node.sampler.establish_steps) == (0.5, 7)
    with pytest.raises(ValueError, match="newcomer_share"):
        NodeConfig.model_validate({"sapo": {"newcomer_share": 1.5}})


@pytest.mark.parametrize("kind", ["partial", "exact"])
def test_the_training_reward_is_partial_credit_or_exact_match(tmp_path: Path, kind: str) -> None:
    """``tasks.reward: exact`` gives a near miss 0 (reasoning-gym gives it partial credit) and the right answer 1."""
    from dataclasses import replace

    from node.runtime import Node
    from node.tasks import TaskSource
    from sim.scripted import build_scripted_parts

    chain = {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
    cfg = NodeConfig.model_validate({"tasks": {"families": [chain], "reward": kind}})
    parts = build_scripted_parts(cfg, lr=1.0, init_p=0.1, init_spread=0.0, max_p=0.9, answer_tokens=4)
    tasks = TaskSource(cfg.tasks)
    node = Node(cfg, tmp_path, replace(parts, tasks=tasks), live=False)
    item = next(
        it
        for it in (tasks.materialize(r) for r in tasks.sample(__import__("random").Random(0), 50))
        if int(it.answer) > 0
    )
    near, right = f"<answer>-{item.answer}</answer>", f"<answer>{item.answer}</answer>"
    assert tasks.score(item, near) > 0  # reasoning-gym's partial credit for the right digits with the wrong sign
    assert node.reward(item, right) == 1.0
    assert node.reward(item, near) == (0.0 if kind == "exact" else tasks.score(item, near))


def _scripted_node(tmp_path: Path, name: str, mode: str, init_p: float, **sapo: object):
    from node.runtime import Node
    from sim.scripted import build_scripted_parts

    chain = {"name": "chain_sum", "config": {"n": 2}}
    cfg = NodeConfig.model_validate(
        {
            "seed": 3,
            "tasks": {"families": [chain]},
            "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 32},
            "sapo": {"local_groups": 2, "external_groups": 2, "peer_advantage": mode, "publish_solved": True, **sapo},
        }
    )
    parts = build_scripted_parts(cfg, lr=1.0, init_p=init_p, init_spread=0.0, max_p=0.99, answer_tokens=4)
    return Node(cfg, tmp_path / f"{mode}-{name}", parts, live=False)


@pytest.mark.parametrize("steps", [15])
def test_a_receiver_credited_node_learns_from_a_strong_peers_solved_groups(tmp_path: Path, steps: int) -> None:
    """A weak node (1% right) beside a strong peer (85% right: a quarter of its groups are all right): with
    group-relative credit the weak node gets its peer's mixed groups, whose right answers are credited by how rare
    they are in that group; with receiver credit it also gets the all-right groups, each right answer worth 1 - b."""
    from protocol.types import Envelope, RolloutBatch

    def run(mode: str) -> tuple[float, dict[str, float]]:
        strong = _scripted_node(tmp_path, "strong", mode, 0.85)
        weak = _scripted_node(tmp_path, "weak", mode, 0.01)
        trained: dict[str, float] = {"external": 0, "credit": 0.0}

        async def loop() -> None:
            for seq in range(steps):
                published = strong.generate().informative(solved=strong.cfg.sapo.publish_solved)
                batch = RolloutBatch(
                    model="m", policy_version=0, tokenizer="scripted-bytes-v1", groups=tuple(published)
                )
                weak.ingest(Envelope(1, "rollouts", "swarm", "strong", b"k" * 32, seq, 0, 0.0, batch))
                own = weak.generate()
                train = weak.make_batch(own)
                ext = [s for s in train.samples if s.external]
                trained["external"] += len(ext)
                trained["credit"] += sum(s.advantage for s in ext)
                if mode == "receiver":  # a wrong peer answer is never a training sample there
                    assert all(s.advantage > 0 for s in ext)
                weak.learn(train)
                weak.step += 1
                strong.step += 1  # the step seeds the node's prompts and samples

        asyncio.run(loop())
        return weak.policy.model.p("chain_sum"), trained

    p_group, group = run("group")
    p_receiver, receiver = run("receiver")
    assert receiver["credit"] > 2 * group["credit"] > 0, (group, receiver)
    assert p_receiver > 0.5 > p_group, (p_group, p_receiver)


def test_publish_solved_adds_all_right_groups_to_what_a_node_publishes(tmp_path: Path) -> None:
    node = _scripted_node(tmp_path, "strong", "receiver", 0.97)
    own = node.generate()
    solved = [g for g in own.groups if g.solved]
    assert solved, "a 97% node should solve some group outright"
    assert len(own.informative(solved=True)) == len(own.informative()) + len(solved)
    assert node.solve_rates.rate("chain_sum") == 0.0  # updated when the batch is made, from the node's own groups
    node.make_batch(own)
    assert node.solve_rates.rate("chain_sum") > 0.8
    with pytest.raises(ValueError, match="peer_advantage"):
        NodeConfig.model_validate({"sapo": {"peer_advantage": "sender"}})
    with pytest.raises(ValueError, match="peer_groups: stronger needs sapo.peer_advantage: receiver"):
        NodeConfig.model_validate({"sapo": {"peer_groups": "stronger", "peer_advantage": "group"}})


@pytest.mark.parametrize("peer_groups", ["solved", "stronger"])
def test_peer_groups_stronger_keeps_a_strong_node_off_a_weaker_peers_right_answers(
    tmp_path: Path, peer_groups: str
) -> None:
    from protocol.types import Envelope, RolloutBatch

    strong = _scripted_node(tmp_path, "strong", "receiver", 0.9, peer_groups=peer_groups)
    weak = _scripted_node(tmp_path, "weak", "receiver", 0.3)
    trained = []

    async def loop() -> None:
        for seq in range(6):
            batch = RolloutBatch(model="m", policy_version=0, tokenizer="scripted-bytes-v1",
                                 groups=tuple(weak.generate().informative(solved=True)))  # fmt: skip
            strong.ingest(Envelope(1, "rollouts", "swarm", "weak", b"k" * 32, seq, 0, 0.0, batch))
            train = strong.make_batch(strong.generate())
            trained.append(sum(1 for s in train.samples if s.external))
            weak.step += 1
            strong.step += 1

    asyncio.run(loop())
    assert strong.solve_rates.rate("chain_sum") > 0.8
    if peer_groups == "solved":
        assert sum(trained[1:]) > 0, trained
    else:  # from its second step on, its own rate is known and above the weak peer's groups' share
        assert trained[1:] == [0] * 5, trained


_LAB = [
    {"name": "lab_add", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}},
    {"name": "lab_sub", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}},
]


@pytest.mark.parametrize(("trace", "trace_only"), [(False, False), (True, False), (True, True)])
def test_gold_labels_add_own_labelled_samples_of_the_named_families(
    model_dir: Path, tmp_path: Path, trace: bool, trace_only: bool
) -> None:
    """``labels``: each step adds ``per_step`` samples of the node's own gold completions (bare, or the family's
    trace) on the named families only, credited 1 - b; the batch is otherwise what SAPO sampled. With
    ``labels.trace_only`` the traces are the trace step's only (no RL row)."""
    from node.rollout.groups import OwnRollouts
    from node.runtime import Node, build_parts

    cfg = NodeConfig.model_validate(
        {
            "model": {"name": str(model_dir), "device": "cpu"},
            "tasks": {"families": _LAB},
            "rollout": {"max_new_tokens": 200},  # the built-in tiny tokenizer spends a token a character
            "labels": {"families": ["lab_sub"], "per_step": 5, "trace": trace, "trace_only": trace_only},
            "learner": {"trace_lr": 1e-4 if trace_only else 0.0},
            "sapo": {"peer_advantage": "receiver"},  # the control: alone + labels, no peers' traces
        }
    )

    async def run():
        node = await Node.create(cfg, tmp_path / f"{trace}{trace_only}", parts=build_parts(cfg), live=False)
        try:
            return node.make_batch(OwnRollouts()).samples, node.policy.tokenizer
        finally:
            await node.close()

    samples, tok = asyncio.run(run())
    assert len(samples) == 5 and all(s.external and s.advantage == 1.0 for s in samples)
    for s in samples:
        prompt, text = tok.decode(s.prompt_ids), tok.decode(s.completion_ids, skip_special_tokens=True)
        assert " - " in prompt  # lab_sub's questions only
        terms = [int(x) for x in prompt.split("Compute ")[1].split(".")[0].split(" - ")]
        assert text.endswith(f"<answer>{terms[0] - terms[1]}</answer>")
        assert text.startswith("<think>") == trace
        assert s.trace == trace  # written working is what the trace step (learner.trace_lr) imitates
        assert s.trace_only == trace_only


def test_labels_trace_only_needs_traces_and_the_trace_step() -> None:
    with pytest.raises(ValueError, match="trace_only needs labels.trace"):
        NodeConfig.model_validate({"labels": {"trace_only": True}, "learner": {"trace_lr": 1e-4}})
    labels = {"families": ["lab_sub"], "trace": True, "trace_only": True}
    with pytest.raises(ValueError, match="trace_only needs the trace step"):
        NodeConfig.model_validate({"tasks": {"families": _LAB}, "labels": labels, "sapo": {"external_groups": 0}})
    on = NodeConfig.model_validate({"tasks": {"families": _LAB}, "labels": labels})  # peer-trace: the step is on
    assert on.learner.trace_lr == on.learner.lr


def test_labels_must_name_the_nodes_own_families() -> None:
    with pytest.raises(ValueError, match="not among tasks.families"):
        NodeConfig.model_validate({"tasks": {"families": _LAB}, "labels": {"families": ["chain_sum"]}})


@pytest.mark.parametrize("peer_text", ["full", "answer"])
def test_peer_text_answer_trains_on_a_peers_answer_only(model_dir: Path, tmp_path: Path, peer_text: str) -> None:
    from node.runtime import Node, build_parts

    cfg = NodeConfig.model_validate(
        {
            "model": {"name": str(model_dir), "device": "cpu"},
            "sapo": {"peer_text": peer_text, "peer_advantage": "group"},
        }
    )

    async def run():
        node = await Node.create(cfg, tmp_path / peer_text, parts=build_parts(cfg), live=False)
        try:
            import random

            ref = node.tasks.sample(random.Random(0), 1)[0]
            group = _peer_group(node, ref)
            working = Completion(text="2+1 is <answer>3</answer>", n_tokens=5, finish_reason="stop")
            group.group = Group(task=ref, completions=(working, group.group.completions[1]))
            return node.samples.build(SapoBatch(external=[group]), {}), node.policy.tokenizer
        finally:
            await node.close()

    samples, tok = asyncio.run(run())
    texts = [tok.decode(s.completion_ids, skip_special_tokens=True) for s in samples]
    if peer_text == "full":
        assert texts == ["2+1 is <answer>3</answer>", "x"]
    else:  # the answer re-written alone; a completion without an answer is no sample
        assert texts == ["<answer>3</answer>"]


@pytest.mark.parametrize("negatives", ["keep", "drop"])
def test_a_guided_node_rolls_out_on_its_peers_prompts_and_shares_one_baseline(tmp_path: Path, negatives: str) -> None:
    """``sapo.peer_advantage: guided``: the peers' groups are drawn before the node generates (at most
    ``max_per_peer`` from one sender), the node rolls out G completions on each of their prompts too, and each peer's
    right completions join that own group under one group baseline (LUFFY's mixed group); the peer's wrong ones are
    never trained on, and its right ones are marked as guidance. ``guided_negatives: drop`` leaves out the node's own
    completions of a mixed group credited below zero (and only those)."""
    from node.learn.losses import advantages_for
    from protocol.types import Envelope, RolloutBatch

    strong = _scripted_node(tmp_path, "strong", "receiver", 0.85)
    weak = _scripted_node(tmp_path, "weak", "guided", 0.05, max_per_peer=1, guided_negatives=negatives)
    guided_steps = 0

    async def loop() -> None:
        nonlocal guided_steps
        for seq in range(4):
            published = strong.generate().informative(solved=True)
            batch = RolloutBatch(model="m", policy_version=0, tokenizer="scripted-bytes-v1", groups=tuple(published))
            weak.ingest(Envelope(1, "rollouts", "swarm", "strong", b"k" * 32, seq, 0, 0.0, batch))
            own = weak.generate()
            guides = weak.choose_guides().external
            assert len(guides) <= 1  # max_per_peer: one sender fills at most one of the J = 2 slots
            assert len(own.groups) == weak.cfg.rollout.prompts_per_step + len(guides)
            train = weak.make_batch(own)
            assert train.sapo.external == guides
            for mine, guide in zip(own.groups[-len(guides) :] if guides else [], guides, strict=True):
                assert mine.group.task == guide.group.task  # the node's own group on the peer's prompt
                right = sum(1 for r in guide.rewards if r >= 1.0)
                advs = advantages_for(weak.cfg.learner, [*mine.rewards, *[1.0] * right])
                peer = [s for s in train.samples if s.guided]
                assert len(peer) == right and all(s.external and s.trace and s.family == "chain_sum" for s in peer)
                assert all(s.source == guide.source == "strong" for s in peer)  # the replay shares by its groups
                share = sum(1 for r in mine.rewards if r >= 1.0) / len(mine.rewards)
                assert all(s.own_solve == pytest.approx(share) for s in peer)  # the node's own solve share there
                assert not [s for s in train.samples if s.trace and not s.guided]  # own samples are never traces
                assert [s.advantage for s in peer] == pytest.approx(advs[len(mine.rewards) :])
                assert mine in train.sapo.local  # trained whatever its own rewards
                mixed = weak.samples.guided(mine, own.generations[mine.key], guide)
                own_advs = [s.advantage for s in mixed if not s.external]
                below = sum(1 for a in advs[: len(mine.rewards)] if a < 0)
                assert len(own_advs) == len(mine.rewards) - (below if negatives == "drop" else 0)
                assert sum(a < 0 for a in own_advs) == (0 if negatives == "drop" else below)
                guided_steps += 1
            assert all(s.guided for s in train.samples if s.external)
            weak.learn(train)
            weak.step += 1
            strong.step += 1

    asyncio.run(loop())
    assert guided_steps >= 2

    # A step without own rollouts (a side phase's turn, e.g. MNPO's) has nothing to mix the guides with: no crash,
    # no peer sample.
    from node.rollout.groups import OwnRollouts

    weak.choose_guides()
    assert not [s for s in weak.make_batch(OwnRollouts()).samples if s.external]


@pytest.mark.parametrize("trace_own", [False, True])
def test_trace_own_marks_the_nodes_own_right_completions_for_the_trace_step(tmp_path: Path, trace_own: bool) -> None:
    """``learner.trace_own``: the node's own completions its verifier scored right are marked ``trace`` (the trace
    step's rehearsal), its wrong ones never; off, no own completion is."""
    from node.runtime import Node
    from sim.scripted import build_scripted_parts

    learner = {"trace_lr": 1e-4, "trace_own": trace_own}
    cfg = NodeConfig.model_validate(
        {
            "seed": 3,
            "tasks": {"families": [{"name": "chain_sum", "config": {"n": 2}}]},
            "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 32},
            "sapo": {"local_groups": 4, "external_groups": 0},
            "learner": learner,
        }
    )
    parts = build_scripted_parts(cfg, lr=1.0, init_p=0.5, init_spread=0.0, max_p=0.99, answer_tokens=4)
    node = Node(cfg, tmp_path / str(trace_own), parts, live=False)
    own = node.generate()
    samples = node.make_batch(own).samples
    rewards = {}
    for g in own.groups:
        for gen, r in zip(own.generations[g.key], g.rewards, strict=True):
            rewards[tuple(gen.token_ids)] = r
    assert samples and {rewards[tuple(s.completion_ids)] >= 1.0 for s in samples} == {True, False}
    for s in samples:
        assert s.trace == (trace_own and rewards[tuple(s.completion_ids)] >= 1.0)
    with pytest.raises(ValueError, match="trace_own needs the trace step"):
        NodeConfig.model_validate({"learner": {"trace_own": True}, "sapo": {"peer_advantage": "receiver"}})
    assert NodeConfig.model_validate({"learner": {"trace_own": True}}).learner.trace_own  # peer-trace: step on


def _trace_node(tmp_path: Path, trace_groups: int, *, credit: bool = False) -> Node:
    """A weak scripted guided node taking ``trace_groups`` peers' groups a step for its trace step."""
    from node.runtime import Node
    from sim.scripted import build_scripted_parts

    cfg = NodeConfig.model_validate(
        {
            "seed": 3,
            "tasks": {"families": [{"name": "chain_sum", "config": {"n": 2}}]},
            "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 32},
            "sapo": {"local_groups": 2, "external_groups": 1, "peer_advantage": "guided", "max_per_peer": 2,
                     "publish_solved": True, "trace_groups": trace_groups, "trace_credit": credit},
            "learner": {"trace_lr": 1e-4},
        }
    )  # fmt: skip
    parts = build_scripted_parts(cfg, lr=1.0, init_p=0.05, init_spread=0.0, max_p=0.99, answer_tokens=4)
    return Node(cfg, tmp_path / f"weak{trace_groups}{'c' * credit}", parts, live=False)


def test_trace_groups_add_a_peers_verified_completions_to_the_trace_step_only(tmp_path: Path) -> None:
    """``sapo.trace_groups``: beside the J mixed groups, more of a peer's groups give the trace step their completions
    the node's own verifier scored right (``trace_only``: no RL row, no rollout of the node on their prompts), once
    the peer is established; the RL part of the batch is what it would be without them."""
    from protocol.types import Envelope, RolloutBatch

    strong = _scripted_node(tmp_path, "strong", "receiver", 0.85)
    weak, plain = _trace_node(tmp_path, 2), _trace_node(tmp_path, 0)
    seen = 0
    for seq in range(5):
        published = strong.generate().informative(solved=True)
        batch = RolloutBatch(model="m", policy_version=0, tokenizer="scripted-bytes-v1", groups=tuple(published))
        for node in (weak, plain):
            node.ingest(Envelope(1, "rollouts", "swarm", "strong", b"k" * 32, seq, 0, 0.0, batch))
        guides, without = weak.choose_guides(), plain.choose_guides()
        same_pool = seen == 0  # until traces have taken groups the plain node's pool still holds
        if same_pool:
            assert [g.key for g in guides.external] == [g.key for g in without.external]
        own, own_plain = weak.generate(), plain.generate()
        assert len(own.groups) == len(own_plain.groups) == 4 + len(guides.external)  # no rollout for a trace
        train, train_plain = weak.make_batch(own), plain.make_batch(own_plain)
        only = [s for s in train.samples if s.trace_only]
        if weak.pool.active_steps("strong") < weak.cfg.sapo.establish_steps:  # a newcomer: RL slots only
            assert not guides.traces and not only
        else:
            right = sum(1 for g in guides.traces for r in g.rewards if r >= 1.0)
            assert guides.traces and len(only) == right > 0
            assert all(s.trace and s.external and not s.guided and s.source == "strong" for s in only)
            assert {tuple(s.prompt_ids) for s in only} == {
                tuple(weak.samples.prompt_ids(g.group.task)) for g in guides.traces
            }  # fmt: skip
            seen += 1
        rl = [(s.prompt_ids, s.completion_ids, s.advantage) for s in train.samples if not s.trace_only]
        if same_pool:
            assert rl == [(s.prompt_ids, s.completion_ids, s.advantage) for s in train_plain.samples]
        for node in (weak, plain, strong):
            node.step += 1
    assert seen >= 1
    with pytest.raises(ValueError, match=r"trace_groups \(\d+\) needs the trace step"):
        NodeConfig.model_validate({"sapo": {"peer_advantage": "guided", "trace_groups": 4}})
    with pytest.raises(ValueError, match="trace_groups needs sapo.peer_advantage: guided"):
        NodeConfig.model_validate(
            {"sapo": {"trace_groups": 4, "peer_advantage": "receiver"}, "learner": {"trace_lr": 1e-4}}
        )


def test_a_default_node_takes_its_peers_verified_modal_working_to_the_trace_step_and_rl_on_its_own(
    tmp_path: Path,
) -> None:
    """The default credit, peer-trace, end to end in a node whose config names no credit: every RL row is the
    node's own (no rollout on a peer's prompt), and once the peer is established its groups' right completions reach
    the trace step only, each group's most often written right text, at most half the 16 trace groups from it."""
    from node.runtime import Node
    from protocol.types import Envelope, RolloutBatch
    from sim.scripted import build_scripted_parts

    cfg = NodeConfig.model_validate(
        {
            "seed": 3,
            "tasks": {"families": [{"name": "chain_sum", "config": {"n": 2}}]},
            "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 32},
        }
    )
    assert (cfg.sapo.peer_advantage, cfg.sapo.external_groups, cfg.sapo.local_groups) == ("guided", 0, 4)
    parts = build_scripted_parts(cfg, lr=1.0, init_p=0.05, init_spread=0.0, max_p=0.99, answer_tokens=4)
    weak = Node(cfg, tmp_path / "default", parts, live=False)
    strong = _scripted_node(tmp_path, "strong", "receiver", 0.85)
    took = []
    for seq in range(8):
        published = strong.generate().informative(solved=True)
        batch = RolloutBatch(model="m", policy_version=0, tokenizer="scripted-bytes-v1", groups=tuple(published))
        weak.ingest(Envelope(1, "rollouts", "swarm", "strong", b"k" * 32, seq, 0, 0.0, batch))
        guides = weak.choose_guides()
        own = weak.generate()
        assert not guides.external and len(own.groups) == 4
        train = weak.make_batch(own)
        assert all(not s.external for s in train.samples if not s.trace_only)
        only = [s for s in train.samples if s.trace_only]
        assert len(guides.traces) <= 8 and all(s.source == "strong" and s.trace for s in only)
        for g in guides.traces:  # one text a group: the one written most often among its right completions
            texts = [
                tuple(s.completion_ids)
                for s in only
                if tuple(s.prompt_ids) == tuple(weak.samples.prompt_ids(g.group.task))
            ]
            assert len(set(texts)) <= 1
        took.append(len(guides.traces))
        for node in (weak, strong):
            node.step += 1
    assert took[0] == 0 and max(took) == 8, took  # a newcomer first; then half the 16 trace groups from one peer


def test_trace_credit_makes_each_distinct_verified_trace_one_credited_rl_row(tmp_path: Path) -> None:
    """``sapo.trace_credit``: a trace group's distinct right texts become one row each of the RL update as well as
    the trace step, credited 1 - b (this node's solve rate of the family) with no importance weight, as the
    ``labels.trace`` ceiling credits a generator trace; repeats and wrong completions are left out."""
    from protocol.types import Envelope, RolloutBatch

    strong = _scripted_node(tmp_path, "strong", "receiver", 0.85)
    weak = _trace_node(tmp_path, 2, credit=True)
    credited = 0
    for seq in range(5):
        published = strong.generate().informative(solved=True)
        batch = RolloutBatch(model="m", policy_version=0, tokenizer="scripted-bytes-v1", groups=tuple(published))
        weak.ingest(Envelope(1, "rollouts", "swarm", "strong", b"k" * 32, seq, 0, 0.0, batch))
        guides = weak.choose_guides()
        train = weak.make_batch(weak.generate())
        assert not any(s.trace_only for s in train.samples)
        rows = [s for s in train.samples if s.source == "strong" and not s.guided]
        want = {
            (tuple(weak.samples.prompt_ids(g.group.task)), tuple(ids))
            for g in guides.traces
            for ids in weak.samples._right_peer_ids(g)
        }
        assert {(tuple(s.prompt_ids), tuple(s.completion_ids)) for s in rows} == want
        assert len(rows) == len(want)  # one row a distinct text
        b = weak.solve_rates.rate("chain_sum")
        assert all(s.trace and s.external and s.advantage == pytest.approx(1.0 - b) for s in rows)
        assert all(s.behaviour_logprobs is None and s.behaviour_logprob_mean is None for s in rows)
        credited += len(rows)
        for node in (weak, strong):
            node.step += 1
    assert credited > 0
    with pytest.raises(ValueError, match="trace_credit needs sapo.trace_groups"):
        NodeConfig.model_validate({"sapo": {"peer_advantage": "guided", "trace_credit": True}})
    with pytest.raises(ValueError, match="trace_families needs sapo.trace_groups"):
        NodeConfig.model_validate({"sapo": {"peer_advantage": "guided", "trace_families": ["lab_sub"]}})


def test_trace_texts_pick_the_modal_right_text_or_the_generators() -> None:
    """``sapo.trace_texts``: ``mode`` keeps the copies of the text the peer wrote most often among its right
    completions (the first of equals); ``generator`` keeps the texts equal to the family's own written completion,
    none where the family writes none; ``all`` keeps every right text."""
    from types import SimpleNamespace

    from node.learn.batch import SampleBuilder

    class Policy:
        tokenizer = SimpleNamespace(eos_token_id=0)

        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

    class Tasks:
        def materialize(self, ref: TaskRef) -> SimpleNamespace:
            return SimpleNamespace(ref=ref)

        def trace(self, item: SimpleNamespace) -> str | None:
            return "gold" if item.ref.index == 1 else None

    def guide(index: int, texts: list[str], rewards: list[float]) -> PooledGroup:
        comps = tuple(Completion(text=t, n_tokens=3, finish_reason="stop") for t in texts)
        task = TaskRef("lab_sub", {}, seed=0, index=index)
        return PooledGroup(key=f"k{index}", source="p", group=Group(task=task, completions=comps),
                           rewards=tuple(rewards), step=0)  # fmt: skip

    def texts(mode: str, g: PooledGroup) -> list[str]:
        builder = SampleBuilder(Policy(), Tasks(), max_new_tokens=64, advantages=list, trace_texts=mode)
        return ["".join(map(chr, r[:-1])) for r in builder._trace_texts(g, builder._right_peer_ids(g))]

    g = guide(1, ["lucky", "gold", "wrong", "gold", "gold", "other"], [1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    assert texts("all", g) == ["lucky", "gold", "gold", "gold", "other"]
    assert texts("mode", g) == ["gold", "gold", "gold"]
    assert texts("generator", g) == ["gold", "gold", "gold"]
    tie = guide(2, ["a", "b", "b", "a"], [1.0, 1.0, 1.0, 1.0])
    assert texts("mode", tie) == ["a", "a"]  # the first of equals
    assert texts("generator", tie) == []  # item 2's family writes no working
    with pytest.raises(ValueError, match="trace_texts needs sapo.trace_groups"):
        NodeConfig.model_validate({"sapo": {"peer_advantage": "guided", "trace_texts": "mode"}})


def test_trace_rows_on_answers_only() -> None:
    """``sapo.peer_text: answer`` reaches the trace step too (the answers-only control of peer-trace): each right
    peer completion becomes its ``<answer>`` tag alone before ``trace_texts`` picks among them, a right completion
    with no answer tag is none, and a wrong one never enters."""
    from types import SimpleNamespace

    from node.learn.batch import SampleBuilder

    class Policy:
        tokenizer = SimpleNamespace(eos_token_id=0)

        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

    working = ["<think>12-5=7</think><answer>7</answer>", "<think>7</think><answer>7</answer>", "seven"]
    comps = tuple(Completion(text=t, n_tokens=3, finish_reason="stop") for t in [*working, "<answer>8</answer>"])
    task = TaskRef("lab_sub", {}, seed=0, index=3)
    g = PooledGroup(key="k3", source="p", group=Group(task=task, completions=comps), rewards=(1.0, 1.0, 1.0, 0.0),
                    step=0)  # fmt: skip

    def rows(peer_text: str, mode: str) -> list[str]:
        builder = SampleBuilder(Policy(), None, max_new_tokens=64, advantages=list, trace_texts=mode,
                                peer_text=peer_text)  # fmt: skip
        builder.prompt_ids = lambda task: [1]
        samples = builder.traces(g)
        assert all(s.trace_only and s.trace and s.external for s in samples)
        return ["".join(map(chr, s.completion_ids[:-1])) for s in samples]

    assert rows("full", "all") == working
    assert rows("answer", "all") == ["<answer>7</answer>", "<answer>7</answer>"]
    assert rows("answer", "mode") == ["<answer>7</answer>", "<answer>7</answer>"]
