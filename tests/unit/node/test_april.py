"""APRIL: engine resume correctness, early stop, no partial rollout lost across rounds, JSON buffer, restarts."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from node.config import ModelConfig
from node.model import tiny
from node.model.policy import Policy, load_policy
from node.rollout.april import AprilBuffer, PendingGroup, groups_in_flight, run_round
from node.rollout.engine import RolloutRequest, TransformersEngine, apply_top_p
from node.rollout.planner import UniformPlanner

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cache(tiny_cache: Path) -> Path:
    return tiny_cache  # holds the reduced model, shared with the other modules (tests/conftest.py)


@pytest.fixture(scope="module")
def policy(cache: Path) -> Policy:
    return load_policy(ModelConfig(name=str(tiny.ensure_built(cache, tiny.SMALL_RECIPE)), device="cpu"))


@pytest.fixture(scope="module")
def long_tail(policy: Policy) -> Policy:
    """The same model with EOS at probability 1/6 per token: geometric lengths, some groups run long."""
    spec = importlib.util.spec_from_file_location("b2_april", ROOT / "benchmarks" / "systems" / "b2_april.py")
    b2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(b2)
    return replace(policy, model=b2.stop_hazard_model(policy.model, list(policy.eos_token_ids), 1 / 6))


def _recompute(policy: Policy, prompt: list[int], tokens: list[int], temperature: float, top_p: float) -> list[float]:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
    logp = torch.log_softmax(apply_top_p(logits / temperature, top_p), dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.8, 0.9)])
def test_continuing_a_partial_completion_matches_a_recomputation(policy: Policy, temperature, top_p) -> None:
    engine = TransformersEngine(policy)
    engine.set_policy_version(3)
    prompts = [policy.encode(policy.format_prompt(q)) for q in ("What is 2 + 3?", "Hi", "Compute 7 - 1 please.")]
    first = engine.generate_requests(
        [RolloutRequest(p, 20) for p in prompts for _ in range(2)], temperature=temperature, top_p=top_p, seed=0
    )
    engine.set_policy_version(4)
    resumed = []
    for c in first:
        k = max(1, len(c.token_ids) // 2)
        req = RolloutRequest(c.prompt_ids, 20, c.token_ids[:k], c.logprobs[:k], [3] * k)
        resumed.append((k, req))
    outs = engine.generate_requests([r for _, r in resumed], temperature=temperature, top_p=top_p, seed=5)
    for (k, req), c in zip(resumed, outs, strict=True):
        assert c.token_ids[:k] == req.token_ids and c.logprobs[:k] == req.logprobs  # the prefix is kept as is
        assert len(c.token_ids) <= 20 and c.finish_reason in ("stop", "length")
        expected = _recompute(policy, req.prompt_ids, c.token_ids, temperature, top_p)
        assert max(abs(a - b) for a, b in zip(c.logprobs, expected, strict=True)) < 1e-4
        assert c.token_versions == [3] * k + [4] * (len(c.token_ids) - k)
        assert c.policy_version == 3


def test_should_stop_aborts_the_rest_and_keeps_their_tokens(long_tail: Policy) -> None:
    engine = TransformersEngine(long_tail, batch_size=4)  # 3 chunks: the last ones may never start
    prompt = long_tail.encode(long_tail.format_prompt("What is 2 + 3?"))
    reqs = [RolloutRequest(prompt, 40) for _ in range(12)]
    calls = []

    def stop(finished) -> bool:
        calls.append(sum(finished))
        return sum(finished) >= 2

    outs = engine.generate_requests(reqs, seed=1, should_stop=stop)
    assert len(outs) == 12 and calls and calls[-1] >= 2
    done = [c for c in outs if c.finish_reason != "abort"]
    aborted = [c for c in outs if c.finish_reason == "abort"]
    assert len(done) >= 2 and aborted
    assert all(len(c.token_ids) == len(c.logprobs) < 40 for c in aborted)
    assert any(not c.token_ids for c in outs[8:])  # a chunk that never started comes back empty
    eos = long_tail.tokenizer.eos_token_id
    assert all(eos not in c.token_ids for c in aborted)


def _groups(policy: Policy, n_groups: int, g: int, max_new: int, start: int = 0) -> list[PendingGroup]:
    out = []
    for i in range(start, start + n_groups):
        ids = policy.encode(policy.format_prompt(f"What is {i} + {i}?"))
        out.append(PendingGroup(f"k{i}", {"i": i}, ids, max_new, [None] * g, started_step=i))
    return out


def test_no_partial_rollout_is_lost_across_rounds_and_json(long_tail: Policy) -> None:
    engine = TransformersEngine(long_tail)
    buffer = AprilBuffer()
    target, g, max_new = 2, 4, 40
    seen: dict[str, list[list[int]]] = {}  # key -> token ids of each slot as last seen
    completed: list[str] = []
    next_key = 0
    stopped_any = False
    offpolicy = 0
    for step in range(8):
        want = groups_in_flight(target, 2.0)
        carried = buffer.groups[:want]
        fresh = _groups(long_tail, want - len(carried), g, max_new, next_key)
        next_key += len(fresh)
        complete, incomplete, stats = run_round(engine, carried + fresh, target, temperature=1.0, top_p=1.0, seed=step)
        stopped_any |= stats.stopped_early
        offpolicy += stats.offpolicy_tokens
        assert len(complete) >= target or not incomplete
        assert {x.key for x in complete} | {x.key for x in incomplete} == {x.key for x in carried + fresh}
        for grp in complete + incomplete:  # every slot extends what it had: nothing is ever dropped
            now = [[] if c is None else c.token_ids for c in grp.completions]
            for before, after in zip(seen.get(grp.key, [[]] * g), now, strict=True):
                assert after[: len(before)] == before
            seen[grp.key] = now
        for grp in complete:
            assert all(c.finish_reason in ("stop", "length") for c in grp.completions)
            completed.append(grp.key)
        buffer.groups = incomplete + buffer.groups[want:]
        restored = AprilBuffer()  # a restart between any two steps reads back the same buffer
        restored.load_state_dict(json.loads(json.dumps(buffer.state_dict())))
        assert restored.state_dict() == buffer.state_dict()
        buffer = restored
        engine.set_policy_version(step + 1)
    assert stopped_any, "the long-tail model should have produced partial rollouts"
    assert offpolicy > 0  # continued groups carry tokens of older policy versions
    assert len(completed) == len(set(completed))  # each group is handed to the learner once
    assert set(completed) | buffer.keys() == set(seen)  # every group started is either trained on or buffered


# ---------------------------------------------------------------------------------------- the runtime


def _cfg(cache: Path, **features):
    from node.config import NodeConfig
    from protocol.config import validate_config
    from sim.config import deep_merge

    base = {
        "model": {"name": str(tiny.ensure_built(cache, tiny.SMALL_RECIPE)), "device": "cpu"},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 24},
        "sapo": {"local_groups": 2},
        "tasks": {"pool_size": 6},
        "checkpoint": {"every": 1},
    }
    return validate_config(NodeConfig, deep_merge(base, features))


async def _run(cfg, run_dir: Path, steps: int, *, model=None):
    from node.runtime import Node, build_parts

    torch.manual_seed(0)
    parts = build_parts(cfg)
    if model is not None:
        parts.policy = replace(parts.policy, model=model(parts.policy))
        parts.engine.policy = parts.policy
    node = await Node.create(cfg, run_dir, parts=parts, live=False)
    rows = []
    try:
        for _ in range(steps):
            rows.append(await node.step_once())
    finally:
        await node.close()
    return node, rows


def _hazard(policy: Policy):
    spec = importlib.util.spec_from_file_location("b2_april", ROOT / "benchmarks" / "systems" / "b2_april.py")
    b2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(b2)
    return b2.stop_hazard_model(policy.model, list(policy.eos_token_ids), 1 / 8)


def test_runtime_with_april_keeps_its_buffer_across_a_restart(cache: Path, tmp_path: Path) -> None:
    cfg = _cfg(cache, april={"enabled": True, "oversample": 3.0})
    node, rows = asyncio.run(_run(cfg, tmp_path, 3, model=_hazard))
    assert all("april_buffer_groups" in r and r["plan_groups"] >= 2 for r in rows)
    assert all(0.0 <= r["april_offpolicy_token_share"] <= 1.0 for r in rows)
    saved = node.planner.state_dict()
    assert saved["april"]["groups"], "expected partial groups in the buffer after 3 steps"
    from node.learn.checkpoint import load_latest

    assert load_latest(tmp_path / "checkpoints").extra["rollout_plan"] == json.loads(json.dumps(saved))
    # restart: the buffer comes back, and the next step continues those groups first
    node2, rows2 = asyncio.run(_run(cfg, tmp_path, 1, model=_hazard))
    assert node2.step == 4
    before = saved["april"]["groups"]
    assert rows2[0]["april_continued_groups"] == min(len(before), 6)
    # every buffered group is either still buffered (with at least its old tokens) or was completed in step 4
    trained = [json.dumps(json.loads(line)["task"], sort_keys=True) for line in _rollout_lines(tmp_path, 4)]
    after = [g.to_dict() for g in node2.planner.buffer.groups]
    for g in before:
        still = [a for a in after if a["key"] == g["key"] and a["started_step"] == g["started_step"]]
        if still:
            for old, new in zip(g["completions"], still[0]["completions"], strict=True):
                assert old is None or new["token_ids"][: len(old["token_ids"])] == old["token_ids"]
        else:
            assert json.dumps(g["payload"], sort_keys=True) in trained


def _rollout_lines(run_dir: Path, step: int) -> list[str]:
    lines = (run_dir / "rollouts.jsonl").read_text().splitlines()
    return [ln for ln in lines if json.loads(ln)["step"] == step]


def test_runtime_with_vade_and_dart_and_entropy_selection(cache: Path, tmp_path: Path) -> None:
    cfg = _cfg(
        cache,
        vade={"enabled": True, "candidates": 2.0},
        dart={"enabled": True},
        learner={"entropy_top_frac": 0.5},
    )
    node, rows = asyncio.run(_run(cfg, tmp_path, 3))
    assert node.planner.posteriors is not None and rows[-1]["vade_tracked"] >= 2
    assert all(2 <= r["plan_rollouts_mean"] <= 4 for r in rows)
    trained = [r for r in rows if "entropy_kept_frac" in r]
    assert all(0.4 <= r["entropy_kept_frac"] <= 0.75 for r in trained)
    node2, _ = asyncio.run(_run(cfg, tmp_path, 1))
    assert node2.planner.posteriors.state_dict()["posteriors"][: len(rows)] != []
    assert {k for k, _ in node.planner.posteriors.tracked()} <= {k for k, _ in node2.planner.posteriors.tracked()}


def test_features_off_plan_uniformly_with_no_plan_metrics(cache: Path, tmp_path: Path) -> None:
    node, rows = asyncio.run(_run(_cfg(cache), tmp_path, 1))
    assert isinstance(node.planner, UniformPlanner) and "plan_groups" not in rows[0]
    # every metrics line carries the node's resident memory between steps (node.heap; the soak judges it) on Linux
    assert (0 < rows[0].get("rss_anon_mb", 0) < rows[0].get("rss_mb", 0)) is (sys.platform == "linux")
