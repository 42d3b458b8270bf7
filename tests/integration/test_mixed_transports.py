"""One swarm across both transports, real processes: two ``swarm-node join --transport hivemind`` nodes (go-libp2p's
GossipSub inside p2pd, records also in the DHT) and two ``--transport libp2p`` nodes (py-libp2p GossipSub) on
127.0.0.1, each training on the groups of all three others (``protocol/SPEC.md`` 7.6).

The libp2p nodes join through hivemind nodes (one through the first, one through the second, which itself joined
through the first), so records cross py-libp2p -> go-libp2p -> py-libp2p and back, and a libp2p node that starts last
catches up over the sync protocol served by a hivemind node.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from node.telemetry.metrics import read_jsonl
from protocol.identity import Identity
from tests.integration.procs import FAST_JOIN, ChildProc, HivemindPeerProc

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


#: Both peer kinds' test swarm (``tests.libp2p_isolated.peer_lp2p`` has it fixed) and how long a publisher waits before
#: the other joins: longer than GossipSub keeps a message for gossip (its mcache: a few 1 s heartbeats), so only the
#: sync protocol can bring the records published before the join.
SWARM = "lp2p-test"
JOIN_AFTER_S = 8.0


def _wait(cond, timeout: float, what: str, *procs: ChildProc) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            assert p.proc.poll() is None or cond(), f"pid {p.pid} exited: {p.tail()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {[p.tail(1500) for p in procs]}"
        time.sleep(0.3)


@pytest.mark.timeout(180)
def test_a_late_joiner_of_either_transport_catches_up_from_a_node_of_the_other(tmp_path):
    """SPEC 7.6: records published before a node joined reach it over the sync protocol, whichever transport the node
    it bootstraps from runs: a libp2p peer from a hivemind peer (which serves sync through p2pd), and a hivemind peer
    from a libp2p peer (which has no DHT to read)."""
    lp2p = [sys.executable, "-m", "tests.libp2p_isolated.peer_lp2p"]
    hm_args = ["--swarm", SWARM, "--poll-s", "0.3", "--duration", "120"]
    # a hivemind publisher, then a libp2p latecomer
    hm = HivemindPeerProc(
        [*hm_args, "--records", "2", "--tag", "H|", "--out", str(tmp_path / "h.jsonl")], tmp_path / "h.log"
    )
    procs: list[ChildProc] = [hm]
    try:
        h_addr, h_sender = hm.wait_line("ADDR", 90).split()[1:3]
        hm.wait_for("^PUBLISHED", 60)
        time.sleep(JOIN_AFTER_S)
        late_lp = ChildProc(
            [*lp2p, "--out", str(tmp_path / "l.json"), "--bootstrap", h_addr, "--records", "2", "--every", "1",
             "--expect", "2", "--exit-when-done", "--linger", "2", "--duration", "60"],
            tmp_path / "l.log",
        )  # fmt: skip
        procs.append(late_lp)
        assert late_lp.wait(timeout=90) == 0, late_lp.tail()
        summary = json.loads((tmp_path / "l.json").read_text())
        assert h_sender in summary["senders"] and summary["stats"]["synced"] >= 1, summary
        assert summary["stats"]["rejected_total"] == 0, summary["stats"]

        # a libp2p publisher, then a hivemind latecomer
        lp = ChildProc(
            [*lp2p, "--out", str(tmp_path / "l2.json"), "--records", "2", "--every", "0.5", "--warmup", "0.5",
             "--duration", "60", "--tag", "L"],
            tmp_path / "l2.log",
        )  # fmt: skip
        procs.append(lp)
        l_addr = lp.wait_for(r"listening on (\S+)", 60).group(1)
        l_sender = lp.wait_for(r"sender (\S+)", 30).group(1)
        time.sleep(2.0 + JOIN_AFTER_S)  # its warm-up and two records, then longer than GossipSub remembers them
        out = tmp_path / "h2.jsonl"
        late_hm = HivemindPeerProc(
            [*hm_args, "--records", "0", "--bootstrap", l_addr, "--out", str(out)], tmp_path / "h2.log"
        )
        procs.append(late_hm)

        def from_lp() -> int:
            lines = out.read_text().splitlines() if out.exists() else []
            return sum(1 for x in lines if json.loads(x)["sender"] == l_sender)

        _wait(lambda: from_lp() >= 2, 90, "the hivemind latecomer to get the libp2p peer's two records", late_hm, lp)
        metrics = json.loads(Path(f"{out}.metrics.json").read_text())
        assert metrics["dht_stats"]["gossip_synced"] >= 2, metrics["dht_stats"]
    finally:
        for p in procs:
            p.stop()
