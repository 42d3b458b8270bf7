"""One swarm across both transports, real processes: two ``swarm-node join --transport hivemind`` nodes (go-libp2p's
GossipSub inside p2pd, records also in the DHT) and two ``--transport libp2p`` nodes (py-libp2p GossipSub) on
127.0.0.1, each training on the groups of all three others (``protocol/SPEC.md`` 7.6).

The libp2p nodes join through hivemind nodes (one through the first, one through the second, which itself joined
through the first), so records cross py-libp2p -> go-libp2p -> py-libp2p and back, and a libp2p node that starts last
catches up over the sync protocol served by a hivemind node.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from node.telemetry.metrics import read_jsonl
from protocol.identity import Identity
from tests.integration.procs import FAST_JOIN

pytestmark = [pytest.mark.network]

#: One torch thread each: four node processes share the cores.
ARGS = [*FAST_JOIN, "--set", "model.threads=1"]


def _trained_from(run_dir: Path) -> Counter:
    """External groups this node trained on, by sender (summed over its metrics lines)."""
    total: Counter = Counter()
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        total.update(row.get("external_by_sender") or {})
    return total


@pytest.mark.timeout(600)
def test_two_hivemind_and_two_libp2p_nodes_train_on_each_other(node_procs, tmp_path):
    names = ["h1", "l1", "h2", "l2"]
    dirs = {n: tmp_path / n for n in names}

    def join(name: str, transport: str, *peers: str):
        procs[name] = node_procs(name, "join", *peers, "--run-dir", str(dirs[name]), "--transport", transport, *ARGS)
        return procs[name]

    procs: dict = {}
    h1 = join("h1", "hivemind").multiaddr()
    join("l1", "libp2p", "--peers", h1)
    h2 = join("h2", "hivemind", "--peers", h1).multiaddr()
    join("l2", "libp2p", "--peers", h2)
    for p in procs.values():
        p.wait_for("peer id", 300)
    ids = {n: Identity.load(d / "identity.key").peer_id for n, d in dirs.items()}

    deadline = time.monotonic() + 480
    while True:
        trained = {n: _trained_from(d) for n, d in dirs.items()}
        if all(trained[n][ids[o]] > 0 for n in names for o in names if o != n):
            break
        for n, p in procs.items():
            assert p.proc.poll() is None, f"{n} exited early: {p.tail()}"
        missing = {n: [o for o in names if o != n and not trained[n][ids[o]]] for n in names}
        assert time.monotonic() < deadline, f"not every node trained on all three others: missing {missing}"
        time.sleep(3)
    for p in procs.values():
        p.signal(signal.SIGTERM)
    for n, p in procs.items():
        assert p.wait(timeout=120) == 0, f"{n}: {p.tail()}"
    for n, d in dirs.items():
        rows = read_jsonl(d / "metrics.jsonl")
        assert rows[-1]["rejected"] == 0, (n, rows[-1]["rejected_by_reason"])
        assert rows[-1]["policy_version"] >= 1, n
