"""Real peers in separate processes over the hivemind transport on 127.0.0.1 (``tests.integration.hivemind_peer``).

Processes are tracked by pid and ended by pid (terminate, then kill), their p2pd children included.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from protocol.identity import Identity
from protocol.transport.netkey import NetworkKey
from tests.integration.procs import HivemindPeerProc

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.network]


class Peer(HivemindPeerProc):
    """One ``hivemind_peer`` process writing what it received to ``<tmp>/<name>.jsonl``."""

    def __init__(self, name: str, tmp: Path, *args: str) -> None:
        self.name = name
        self.out = tmp / f"{name}.jsonl"
        log = tmp / f"{name}.log"
        if log.exists():  # a peer that rejoins under the same name keeps its first run's log
            log.rename(tmp / f"{name}.{len(list(tmp.glob(f'{name}.*.log')))}.log")
        super().__init__(["--out", str(self.out), *args], log)

    @property
    def addr(self) -> str:
        return self.wait_line("ADDR").split()[1]

    @property
    def peer_id(self) -> str:
        return self.wait_line("ADDR").split()[2]

    def records(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def metrics(self) -> dict:
        path = Path(f"{self.out}.metrics.json")
        return json.loads(path.read_text()) if path.exists() else {}


@pytest.fixture
def start_peer(tmp_path):
    peers: list[Peer] = []

    def start(name: str, *args: str) -> Peer:
        p = Peer(name, tmp_path, *args)
        peers.append(p)
        return p

    yield start
    for p in peers:
        p.stop()


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def seen_from(peer: Peer, sender: str) -> set[int]:
    return {r["seq"] for r in peer.records() if r["sender"] == sender}


@pytest.mark.timeout(120)
def test_three_peers_exchange_200kb_records(start_peer):
    args = ("--records", "2", "--record-kb", "200", "--publish-interval", "0.5")
    a = start_peer("a", *args)
    b = start_peer("b", *args, "--bootstrap", a.addr)
    c = start_peer("c", *args, "--bootstrap", a.addr, "--client-mode")  # behind NAT: dials out only
    peers = [a, b, c]
    for p in peers:
        others = [q for q in peers if q is not p]
        wait_until(lambda p=p, others=others: all(len(seen_from(p, q.peer_id)) == 2 for q in others), 60, p.name)
    for p in peers:
        assert all(r["size"] > 200_000 for r in p.records())
        assert p.metrics()["channel"]["rejected_total"] == 0
    for p in peers:
        p.stop()
        assert p.proc.returncode is not None
        assert p.left_children == [], "p2pd outlived its peer"


@pytest.mark.timeout(300)
def test_peer_that_leaves_and_rejoins_catches_up(start_peer, tmp_path):
    # 60 s windows keep every record of this test inside the rejoining peer's fetch horizon however slow
    # the machine is; what is tested is that records published while c was away reach it after it rejoins.
    win = ["--window-seconds", "60"]
    # 12 records over ~44 s: some surely go out while c is away however slow c is to start, and at most 16
    # (the default per-sender quota) fall in one 60 s window.
    n = 12
    a = start_peer("a", "--records", str(n), "--publish-interval", "4", *win)
    key = str(tmp_path / "c.key")
    c = start_peer("c1", "--records", "1", "--bootstrap", a.addr, "--key", key, *win)
    wait_until(lambda: len(seen_from(c, a.peer_id)) >= 1, 60, "c to see a's first record")
    c.stop()
    published_when_c_left = a.metrics().get("published", 0)
    wait_until(lambda: a.metrics().get("published", 0) > published_when_c_left, 60, "a to publish while c is away")
    c2 = start_peer("c2", "--records", "1", "--bootstrap", a.addr, "--key", key, *win)
    wait_until(lambda: a.metrics().get("published", 0) == n, 120, "a to publish all its records")
    wait_until(lambda: len(seen_from(c2, a.peer_id)) == n, 60, "rejoined c to catch up on all of a's records")
    # The rejoined node has the same identity: it receives a's records again but never its own.
    assert c2.peer_id == c.peer_id
    assert not seen_from(c2, c2.peer_id)


@pytest.mark.timeout(120)
def test_hostile_peer_is_refused_and_counted(start_peer):
    a = start_peer("a", "--records", "3", "--publish-interval", "1")
    b = start_peer("b", "--records", "3", "--publish-interval", "1", "--bootstrap", a.addr)
    b.wait_line("ADDR")
    h = start_peer("h", "--hostile", "--bootstrap", a.addr)
    h.wait_line("HOSTILE DONE", 60)
    wait_until(lambda: len(seen_from(a, b.peer_id)) == 3 and len(seen_from(b, a.peer_id)) == 3, 60, "honest peers")
    # Give the honest peers a few polls over the hostile entries.
    time.sleep(2)
    refused: dict[str, int] = {}
    replays = 0
    for p in (a, b):
        m = p.metrics()
        for reason, n in m["dht_rejections"].items():
            refused[reason] = refused.get(reason, 0) + n
        replays += m["channel"]["rejected"]["replay"]
        # Whatever the hostile peer sent, the honest ones only ever delivered its one authentic record (seq 1).
        assert seen_from(p, h.peer_id) <= {1}
        assert p.proc.poll() is None, f"{p.name} died"
    for reason in ("bad_signature", "malformed", "wrong_swarm", "oversize", "key_mismatch"):
        assert refused.get(reason, 0) > 0, (reason, refused)
    assert refused.get("index_malformed", 0) > 0 and refused.get("index_bad_signature", 0) > 0, refused
    assert replays >= 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(300)
def test_a_restarted_bootstrap_peer_keeps_its_multiaddr_and_its_peers_reach_it_again(start_peer, tmp_path):
    """SPEC 1: the identity key is p2pd's key, so a bootstrap node restarted with its key file and port has the same
    multiaddr, and a peer that only knows the old address (its ``--bootstrap``) gets the restarted node's records."""
    key, port = str(tmp_path / "boot.key"), str(free_port())
    win = ["--window-seconds", "60"]
    a = start_peer("a1", "--key", key, "--port", port, "--records", "1", *win)
    addr = a.addr
    assert addr == f"/ip4/127.0.0.1/tcp/{port}/p2p/{NetworkKey.of(Identity.load(key)).peer_id}"
    b = start_peer("b", "--bootstrap", addr, "--records", "1", *win)
    wait_until(lambda: bool(seen_from(b, a.peer_id)), 60, "b to see the bootstrap peer's first record")
    a.stop()
    assert not any(r["head"].startswith("restarted") for r in b.records())
    a2 = start_peer("a2", "--key", key, "--port", port, "--tag", "restarted", "--records", "3", *win)
    assert a2.addr == addr and a2.peer_id == a.peer_id
    # b dials the address it was given again once its routing table is empty (every 10 s): only a node that still
    # answers to that /p2p/ id can take the call.
    wait_until(
        lambda: any(r["sender"] == a.peer_id and r["head"].startswith("restarted") for r in b.records()),
        120,
        "b to receive a record the restarted bootstrap peer published",
    )
