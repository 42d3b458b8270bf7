"""Two real ``swarm-node join`` processes of different protocol versions over real hivemind DHTs on 127.0.0.1.

The version a process speaks is set with ``RL_SWARM_PROTOCOL_VERSION`` (SPEC.md 15). Another major: each node
says so once, in one line naming both versions, counts ``incompatible_version`` in ``metrics.jsonl`` and never
trains on the other's groups. Another minor of the same major: they train on each other's groups.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from node.telemetry.metrics import read_jsonl
from protocol.version import ENV_OVERRIDE, PROTOCOL_VERSION, format_version
from tests.integration.procs import FAST_JOIN

pytestmark = [pytest.mark.network, pytest.mark.slow]

MAJOR, MINOR = PROTOCOL_VERSION
LINE = re.compile(r"incompatible protocol version: peer [0-9a-f]+ speaks (\d+\.\d+), this node speaks (\d+\.\d+)")


def _metrics(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []


def _wait_until(cond, procs, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        for p in procs:
            assert p.proc.poll() is None, f"node exited early: {p.tail()}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {[p.tail(1500) for p in procs]}")


def _incompatible(run_dir: Path) -> int:
    rows = _metrics(run_dir)
    return rows[-1]["rejected_by_reason"].get("incompatible_version", 0) if rows else 0


def _start_pair(node_procs, tmp_path: Path, va: str, vb: str):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = node_procs("a", "join", "--run-dir", str(a_dir), *FAST_JOIN, env={ENV_OVERRIDE: va})
    maddr = a.multiaddr()
    b = node_procs("b", "join", "--peers", maddr, "--run-dir", str(b_dir), *FAST_JOIN, env={ENV_OVERRIDE: vb})
    return a, b, a_dir, b_dir


def _stop(*procs) -> None:
    for p in procs:
        p.signal(signal.SIGTERM)
    for p in procs:
        assert p.wait(timeout=120) == 0, p.tail()


@pytest.mark.timeout(600)
def test_nodes_of_different_majors_say_so_once_count_it_and_do_not_train_on_each_other(node_procs, tmp_path):
    ours, theirs = f"{MAJOR}.{MINOR}", f"{MAJOR + 1}.0"
    a, b, a_dir, b_dir = _start_pair(node_procs, tmp_path, ours, theirs)
    # Both must have met the other's index entries (refused by the DHT guard or the reader) for a while.
    dirs = (a_dir, b_dir)
    _wait_until(
        lambda: all(_incompatible(d) > 0 and len(_metrics(d)) >= 12 for d in dirs),
        [a, b],
        420,
        "both nodes to count incompatible_version over 12 steps",
    )
    _stop(a, b)
    for proc, run_dir, mine, other in ((a, a_dir, ours, theirs), (b, b_dir, theirs, ours)):
        lines = [m for m in LINE.finditer(proc.output())]
        assert len(lines) == 1, f"{run_dir.name}: {[m.group(0) for m in lines]}"
        assert lines[0].groups() == (other, mine)
        rows = _metrics(run_dir)
        assert sum(r["external_groups"] for r in rows) == 0, f"{run_dir.name} trained on another major's groups"
        assert rows[-1]["rejected_by_reason"]["incompatible_version"] > 0
        assert rows[-1]["accepted_groups"] == 0


@pytest.mark.timeout(600)
def test_nodes_of_different_minors_train_on_each_others_groups(node_procs, tmp_path):
    older, newer = f"{MAJOR}.{MINOR}", f"{MAJOR}.{MINOR + 1}"
    a, b, a_dir, b_dir = _start_pair(node_procs, tmp_path, older, newer)
    _wait_until(
        lambda: all(sum(r["external_groups"] for r in _metrics(d)) > 0 for d in (a_dir, b_dir)),
        [a, b],
        480,
        "both nodes to train on the other's groups",
    )
    _stop(a, b)
    for proc, run_dir in ((a, a_dir), (b, b_dir)):
        assert not LINE.search(proc.output()), proc.output()[-2000:]
        rows = _metrics(run_dir)
        assert rows[-1]["rejected_by_reason"].get("incompatible_version", 0) == 0
        assert rows[-1]["accepted_groups"] > 0
    assert format_version((MAJOR, MINOR + 1)) == newer
