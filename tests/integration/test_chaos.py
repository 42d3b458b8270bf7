"""Chaos with real ``swarm-node join`` processes over real hivemind DHTs on 127.0.0.1.

* p2pd killed (SIGKILL, by its pid as a child of the node) under a running node: the node restarts its DHT on
  the same port and key, keeps training, and records flow both ways again;
* a partition that heals: a peer and its p2pd are SIGSTOPped for a while, then SIGCONTed: the other node trains
  on alone, and the peer's records arrive again afterwards;
* peers with skewed clocks (``protocol.clock_offset_s``): a peer two minutes ahead is refused and counted; a peer
  twenty seconds behind is inside the acceptance window and trained on.

The full-disk checkpoint case is in ``test_chaos_disk.py`` (it mounts a tmpfs, so it needs root) and, with an
injected ENOSPC, in ``tests/unit/node/test_checkpoint.py``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from node.telemetry.metrics import read_jsonl
from tests.integration.procs import FAST_JOIN

pytestmark = [pytest.mark.network]

JOIN = [*FAST_JOIN, "--set", "model.threads=1", "--set", "eval.every_steps=null", "--set", "eval.at_start=false"]


def _rows(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


def _last(run_dir: Path, key: str, default=0):
    rows = _rows(run_dir)
    return rows[-1].get(key, default) if rows else default


def _wait(cond, procs, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        for p in procs:
            assert p.proc.poll() is None, f"a node exited early while waiting for {what}: {p.tail()}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: " + " ||| ".join(p.tail(1500) for p in procs))


def _p2pd(proc) -> list[int]:
    out = []
    for pid in proc.descendants():
        try:
            if psutil.Process(pid).name().startswith("p2pd"):
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _two_nodes(node_procs, tmp_path):
    """Node a, and node b bootstrapped from it, both listening; their run dirs."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = node_procs("a", "join", "--run-dir", str(a_dir), *JOIN)
    b = node_procs("b", "join", "--peers", a.multiaddr(), "--run-dir", str(b_dir), *JOIN)
    b.multiaddr()
    return a, b, a_dir, b_dir


@pytest.mark.timeout(420)
def test_p2pd_killed_under_a_running_node_is_restarted_and_the_peer_reconnects(node_procs, tmp_path):
    a, b, a_dir, b_dir = _two_nodes(node_procs, tmp_path)
    both = [a, b]
    _wait(lambda: _last(a_dir, "accepted_groups") > 0 and _last(b_dir, "accepted_groups") > 0, both, 240,
          "both nodes to accept each other's groups")  # fmt: skip

    daemons = _p2pd(a)
    assert len(daemons) == 1, f"expected one p2pd child of node a, found {daemons}"
    a_accepted, b_accepted = _last(a_dir, "accepted_groups"), _last(b_dir, "accepted_groups")
    a_steps = len(_rows(a_dir))
    os.kill(daemons[0], signal.SIGKILL)

    _wait(lambda: "DHT restarted" in a.tail(10**6), both, 120, "node a to restart its DHT")
    _wait(lambda: _last(a_dir, "transport_restarts") >= 1, both, 60, "the restart to show in metrics.jsonl")
    new = _p2pd(a)
    assert len(new) == 1 and new[0] != daemons[0], (daemons, new)
    # Training never stopped, and records flow both ways again after the restart.
    _wait(lambda: _last(a_dir, "accepted_groups") > a_accepted + 2, both, 180, "a to accept b's groups again")
    _wait(lambda: _last(b_dir, "accepted_groups") > b_accepted + 2, both, 180, "b to accept a's groups again")
    assert len(_rows(a_dir)) > a_steps
    log = a.tail(10**6)
    assert "exited (code -9); restarting the DHT on port" in log, log
    assert "Traceback" not in log, log
    a.signal(signal.SIGTERM)
    b.signal(signal.SIGTERM)
    assert a.wait(timeout=120) == 0, a.tail()
    assert b.wait(timeout=120) == 0, b.tail()
    rows = _rows(a_dir)
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))


@pytest.mark.timeout(420)
def test_a_partition_that_heals(node_procs, tmp_path):
    a, b, a_dir, b_dir = _two_nodes(node_procs, tmp_path)
    _wait(lambda: _last(a_dir, "accepted_groups") > 0, [a, b], 240, "a to accept b's groups")

    frozen = [b.pid, *b.descendants()]  # the node and its p2pd: nothing of b answers any more
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        steps0 = len(_rows(a_dir))
        time.sleep(25)  # longer than the DHT's request timeout (10 s): a's requests to b time out meanwhile
        accepted_cut = _last(a_dir, "accepted_groups")
        # a keeps training alone while b is unreachable
        _wait(lambda: len(_rows(a_dir)) >= steps0 + 3, [a], 120, "a to keep training during the partition")
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    b_steps = len(_rows(b_dir))
    _wait(lambda: _last(a_dir, "accepted_groups") > accepted_cut + 2, [a, b], 180,
          "b's groups to reach a again after the partition healed")  # fmt: skip
    _wait(lambda: len(_rows(b_dir)) > b_steps + 2, [a, b], 120, "b to train again")
    for p in (a, b):
        p.signal(signal.SIGTERM)
        assert p.wait(timeout=120) == 0, p.tail()
        assert "Traceback" not in p.tail(10**6)


@pytest.mark.timeout(480)
def test_peers_with_skewed_clocks(node_procs, tmp_path):
    """A peer 120 s ahead (8 windows, past ``max_future_windows``=1) is refused and counted; a peer 20 s behind
    (1-2 windows, within ``max_past_windows``=4) is accepted and trained on."""
    a_dir, ahead_dir, behind_dir = tmp_path / "a", tmp_path / "ahead", tmp_path / "behind"
    a = node_procs("a", "join", "--run-dir", str(a_dir), *JOIN)
    maddr = a.multiaddr()
    ahead = node_procs("ahead", "join", "--peers", maddr, "--run-dir", str(ahead_dir), *JOIN,
                       "--set", "protocol.clock_offset_s=120")  # fmt: skip
    behind = node_procs("behind", "join", "--peers", maddr, "--run-dir", str(behind_dir), *JOIN,
                        "--set", "protocol.clock_offset_s=-20")  # fmt: skip
    procs = [a, ahead, behind]
    for p in procs[1:]:
        p.multiaddr()

    def refused() -> int:
        reasons = _last(a_dir, "rejected_by_reason", {})
        return sum(n for k, n in reasons.items() if k.startswith("store_") or k == "future")

    def trained() -> int:  # accepted groups are trained on from the step after the poll that pooled them
        return sum(r["external_groups"] for r in _rows(a_dir))

    _wait(lambda: trained() > 0 and refused() > 0 and len(_rows(ahead_dir)) >= 5, procs, 300,
          "a to train on the behind peer's groups and refuse the ahead peer's records")  # fmt: skip
    rows = _rows(a_dir)
    # Only one sender's records were ever valid at a: the peer behind (the one ahead never passes the checks).
    assert max(r["peers"] for r in rows) == 1, [r["peers"] for r in rows]
    assert sum(r["external_groups"] for r in rows) > 0
    reasons = rows[-1]["rejected_by_reason"]
    assert reasons.get("store_expiration_too_far", 0) + reasons.get("store_future", 0) + reasons.get("future", 0) > 0, (
        reasons
    )
    # the peer ahead published (its own clock says its records are fine) and trained, it just reached nobody
    ahead_rows = _rows(ahead_dir)
    assert ahead_rows[-1]["published"] > 0
    assert sum(r["external_groups"] for r in ahead_rows) == 0
    for p in procs:
        p.signal(signal.SIGTERM)
    for p in procs:
        assert p.wait(timeout=120) == 0, p.tail()
