"""HT-MNPO over real hivemind on 127.0.0.1: ``swarm-node join`` processes train against real peers' cross-scores,
and keep training when one of them leaves mid-run."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from node.telemetry.metrics import read_jsonl

pytestmark = [pytest.mark.network]

MNPO = [
    "--set", "rollout.prompts_per_step=2",
    "--set", "rollout.group_size=2",
    "--set", "rollout.max_new_tokens=16",
    "--set", "sapo.local_groups=2",
    "--set", "runtime.poll_interval_s=0.5",
    "--set", "protocol.quota_per_window=64",
    "--set", "mnpo.schedule=only",
    "--set", "mnpo.opponents=peers",
    "--set", "mnpo.eta=0.5",
    "--set", "mnpo.prompts_per_window=2",
    "--set", "mnpo.responses_per_prompt=3",
    "--set", "mnpo.pairs_per_step=8",
    "--set", "checkpoint.every=1000",
    "--set", "eval.items_per_family=4",
]  # fmt: skip


def _rows(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


def _wait_steps(run_dir: Path, n: int, proc, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(_rows(run_dir)) >= n:
            return
        assert proc.proc.poll() is None, f"node exited early: {proc.tail()}"
        time.sleep(0.5)
    raise AssertionError(f"{run_dir} did not reach {n} steps: {proc.tail()}")


@pytest.mark.timeout(900)
def test_ht_mnpo_uses_real_peers_cross_scores_and_survives_a_peer_leaving(node_procs, tmp_path):
    dirs = {k: tmp_path / k for k in "abc"}
    a = node_procs("a", "join", "--run-dir", str(dirs["a"]), *MNPO)
    maddr = a.multiaddr()
    b = node_procs("b", "join", "--peers", maddr, "--run-dir", str(dirs["b"]), *MNPO)
    c = node_procs("c", "join", "--peers", maddr, "--run-dir", str(dirs["c"]), *MNPO)
    _wait_steps(dirs["c"], 8, c, timeout=480)
    c.stop()  # the peer leaves mid-run (SIGTERM by pid, then kill)
    left_at = {k: len(_rows(dirs[k])) for k in "ab"}
    for k, p in (("a", a), ("b", b)):
        _wait_steps(dirs[k], left_at[k] + 8, p, timeout=300)  # the others keep training without c
    for p in (a, b):
        p.signal(signal.SIGTERM)
    assert b.wait(timeout=120) == 0, b.tail()
    assert a.wait(timeout=120) == 0, a.tail()
    for k in "ab":
        rows = _rows(dirs[k])
        assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
        assert len(rows) > left_at[k], f"{k} stopped training when c left"
        assert rows[-1]["rejected"] == 0, rows[-1]["rejected_by_reason"]
        mnpo = [r for r in rows if r.get("mnpo_pairs")]
        assert mnpo, f"{k} never built an MNPO pair"
        assert max(r["mnpo_peer_opponents"] for r in mnpo) > 0, f"{k} never used a peer's cross-scores"
        assert max(r["mnpo_opponent_peers"] for r in mnpo) >= 1
        assert max(r["mnpo_score_peers"] for r in rows) >= 1
        counts = rows[-1]["mnpo_counts"]
        assert counts.get("scores_kept", 0) > 0
        # Peers' window responses reached the store. The tiny model is peaked (most of a node's own responses repeat
        # each other), so a peer's text is often one the node already holds: stored once, counted "duplicate".
        assert counts.get("peer_added", 0) + counts.get("peer_duplicate", 0) > 0, counts
        assert counts.get("published_scores", 0) > 0
        versions = [r["policy_version"] for r in rows]
        assert versions == sorted(versions) and versions[-1] > versions[0]
    # after c left, the survivors still trained with peer opponents (each other) at some step
    late = [r for k in "ab" for r in _rows(dirs[k])[left_at[k] :] if r.get("mnpo_pairs")]
    assert late and max(r["mnpo_peer_opponents"] for r in late) > 0
