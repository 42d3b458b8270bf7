"""The node's MNPO phase with the real tiny model: schedules, TD without a network, HT over the in-process swarm."""

import asyncio

import pytest

from protocol.config import validate_config

BASE = {
    "model": {"device": "cpu"},
    "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16},
    "sapo": {"local_groups": 2},
    "mnpo": {"eta": 0.5, "prompts_per_window": 2, "responses_per_prompt": 3, "pairs_per_step": 8},
    "eval": {"items_per_family": 4},  # the in-process simulator evaluates every node at the start and the end
}


def node_cfg(**mnpo):
    from node.config import NodeConfig
    from sim.config import deep_merge

    return validate_config(NodeConfig, deep_merge(BASE, {"mnpo": mnpo}))


async def _steps(cfg, run_dir, n):
    import torch

    from node.runtime import Node

    torch.manual_seed(0)
    node = await Node.create(cfg, run_dir, live=False)
    rows = []
    try:
        for _ in range(n):
            rows.append(await node.step_once())
    finally:
        await node.close()
    return rows


def test_alternate_schedule_and_td_history_without_a_network(tmp_path):
    rows = asyncio.run(_steps(node_cfg(schedule="alternate", opponents="history"), tmp_path, 4))
    # step 0 and 2: GRPO (no MNPO metrics); steps 1 and 3: MNPO
    assert [("mnpo_pairs" in r) for r in rows] == [False, True, False, True]
    versions = [r["policy_version"] for r in rows]
    assert versions == sorted(versions) and versions[-1] >= 2
    for r in rows:
        if r.get("mnpo_pairs"):
            assert r["mnpo_peer_opponents"] == 0 and r["mnpo_self_opponents"] >= 1  # own history only
            assert r["reward_mean"] == r["mnpo_reward_mean"] and r["mnpo_loss"] >= 0


def test_side_by_side_runs_both_updates(tmp_path):
    """Both updates need signal: groups with mixed rewards (GRPO) and responses the oracle can rank (MNPO). A family
    the model answers right about two times in three, with 4 x 4 completions a step, gives both on any build (the
    default mix on 2 x 2 completions gave the rebuilt model no informative group in two steps)."""
    from sim.config import deep_merge

    letters = {"name": "letter_counting", "config": {"min_words": 1, "max_words": 3}}
    cfg = node_cfg(schedule="side_by_side", opponents="none", loss="dpo", responses_per_prompt=4)
    cfg = validate_config(
        type(cfg),
        deep_merge(
            cfg.model_dump(), {"rollout": {"prompts_per_step": 4, "group_size": 4}, "tasks": {"families": [letters]}}
        ),
    )
    rows = asyncio.run(_steps(cfg, tmp_path, 2))
    for r in rows:
        assert "mnpo_pairs" in r and "mnpo_counts" in r
    assert any(r["local_groups"] > 0 for r in rows) and any(r["mnpo_pairs"] > 0 for r in rows)
    # the verifier knows exactness: every update says how much of its pull the right-over-wrong pairs carried
    assert all(0.0 <= r["mnpo_decisive_pull"] <= 1.0 for r in rows if r["mnpo_pairs"] > 0)  # DPO pulls one way
    assert rows[-1]["policy_version"] >= 2


@pytest.mark.parametrize("opponents", ["peers"])
def test_ht_mnpo_in_process_uses_peers_cross_scores(tmp_path, opponents):
    from sim.config import SimConfig
    from sim.inprocess import run_seed

    sim = SimConfig.model_validate(
        {
            "name": "m",
            "nodes": 3,
            "steps": 4,
            "node": {
                **BASE,
                "swarm_id": "sim-mnpo-t",
                "mnpo": {**BASE["mnpo"], "schedule": "only", "opponents": opponents, "window_span": 4},
            },
            "configurations": [{"name": "ht"}],
        }
    )
    res = asyncio.run(run_seed(sim, "ht", 0, tmp_path))
    final = res.final
    assert all(r["rejected"] == 0 for r in final), [r["rejected_by_reason"] for r in final]
    assert all(r["mnpo_score_peers"] == 2 for r in final)  # every other node's scores record arrived and validated
    assert all(r["mnpo_counts"].get("peer_added", 0) > 0 for r in final)  # peers' responses to the window prompts
    import json

    rows = [
        json.loads(line) for d in (tmp_path / "ht" / "seed0").glob("node*") for line in (d / "metrics.jsonl").open()
    ]
    assert max(r.get("mnpo_peer_opponents", 0) for r in rows) > 0, "no pair ever had a peer as opponent"
    assert max(r.get("mnpo_opponent_peers", 0) for r in rows) >= 1
