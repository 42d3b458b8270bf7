"""The node's default credit, peer-trace, in real ``swarm-node join`` processes over a real hivemind DHT on 127.0.0.1:
two laboratory nodes (the default profile) pass each other their verified working through the trace step."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from node.telemetry.metrics import read_jsonl

pytestmark = [pytest.mark.network]

#: The default profile (``lab``: peer-trace, its config names no credit), at a test's size.
LAB_FAST = [
    "--config", "lab",
    "--set", "rollout.prompts_per_step=4",
    "--set", "sapo.local_groups=4",
    "--set", "runtime.poll_interval_s=0.5",
    "--set", "eval.items_per_family=4",
    "--set", "eval.samples=2",
]  # fmt: skip


def _rows(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


@pytest.mark.timeout(600)
def test_two_default_nodes_take_each_others_verified_working_to_the_trace_step_only(node_procs, tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = node_procs("a", "join", "--run-dir", str(a_dir), *LAB_FAST)
    b = node_procs("b", "join", "--peers", a.multiaddr(), "--run-dir", str(b_dir), "--max-steps", "30", *LAB_FAST)
    assert b.wait(timeout=480) == 0, b.tail()
    deadline = time.monotonic() + 120
    while sum(r.get("trace_groups", 0) for r in _rows(a_dir)) == 0 and time.monotonic() < deadline:
        assert a.proc.poll() is None, a.tail()
        time.sleep(0.5)
    a.signal(signal.SIGTERM)
    assert a.wait(timeout=120) == 0, a.tail()
    for run_dir in (a_dir, b_dir):
        rows = _rows(run_dir)
        took = [r for r in rows if r.get("trace_groups", 0) > 0]
        assert took, f"{run_dir.name} never took a peer's verified working"
        assert all(r["external_groups"] == 0 for r in rows)  # no RL slot for a peer: its working goes to the trace step
        assert all(r["trace_groups"] <= 8 for r in took)  # at most half the 16 trace groups from its one peer
        assert any(r.get("trace_rows", 0) > 0 for r in rows), "the trace step never trained on a verified trace"
        assert rows[-1]["rejected"] == 0, rows[-1]["rejected_by_reason"]
