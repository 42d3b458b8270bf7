"""Real hivemind peers in network namespaces (``sim.netlab``): behind NAT routers, and across a cut link.

Needs root, iproute2 and nftables (the README's test command installs the tools; CI runs as root). A missing
precondition fails with the lab's one-line message, never a skip. Each test builds its own lab and tears it down.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from sim.netlab.lab import Lab
from sim.netlab.topology import parse

pytestmark = [pytest.mark.network, pytest.mark.timeout(150)]

PORT = 31337


class LabPeer:
    """One ``tests.integration.hivemind_peer`` inside a lab host; its stdout lines, received records, metrics."""

    def __init__(self, lab: Lab, host: str, tmp: Path, *args: str):
        self.host, self.out = host, tmp / f"{host}.jsonl"
        self.log = (tmp / f"{host}.log").open("w")
        cmd = [sys.executable, "-m", "tests.integration.hivemind_peer", "--host", "0.0.0.0", "--port", str(PORT)]
        cmd += ["--tag", f"{host}:", "--out", str(self.out), *args]
        self.proc = lab.popen(host, cmd, stdout=subprocess_pipe(), stderr=self.log, text=True)

    def addr(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("ADDR"):
                return line.split()[1]
            if not line and self.proc.poll() is not None:
                break
        raise AssertionError(f"{self.host} printed no ADDR: {self.tail()}")

    def heads(self) -> set[str]:
        """The tags (publishing host names) of the records this peer received."""
        if not self.out.exists():
            return set()
        lines = [json.loads(x) for x in self.out.read_text().splitlines() if x.strip()]
        return {rec["head"].split(":", 1)[0] for rec in lines}

    def stats(self) -> dict:
        path = Path(f"{self.out}.metrics.json")
        return json.loads(path.read_text())["dht_stats"] if path.exists() else {}

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-2000:]


def subprocess_pipe() -> int:
    import subprocess

    return subprocess.PIPE


def wait_until(cond, timeout: float, what: str, peers: list[LabPeer]) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    state = {p.host: (sorted(p.heads()), p.stats().get("client_mode"), p.stats().get("reachable")) for p in peers}
    raise AssertionError(f"timed out waiting for {what}: {state}; {peers[-1].host} log: {peers[-1].tail()}")


def test_nat_peers_switch_to_client_mode_and_reach_each_other(tmp_path):
    """Two peers, each behind its own symmetric NAT, and one public peer; nobody is told who is behind NAT. The
    NATed peers learn it by dial-back and run as DHT clients, the public one serves; each NATed peer receives the
    other's records (through the public DHT server); ``swarm-node doctor`` in a NATed host says it is behind NAT."""
    with Lab(parse("public=1 homes=1,1 nat=symmetric")) as lab:
        args = ["--mode", "auto", "--records", "3", "--publish-interval", "3", "--poll-s", "1", "--duration", "100"]
        pub = LabPeer(lab, "pub0", tmp_path, *args)
        boot = pub.addr()
        assert boot.startswith(f"/ip4/{lab.hosts['pub0'].addr}/tcp/{PORT}/p2p/")
        homes = [LabPeer(lab, h, tmp_path, *args, "--bootstrap", boot) for h in ("home0-0", "home1-0")]
        for h in homes:
            h.addr()
        doctor = lab.popen(
            "home0-0",
            [sys.executable, "-m", "node.cli.app", "doctor", "--host", "0.0.0.0", "--peers", boot],
            stdout=subprocess_pipe(),
            stderr=subprocess_pipe(),
            text=True,
        )
        peers = [pub, *homes]
        wait_until(
            lambda: "home1-0" in homes[0].heads() and "home0-0" in homes[1].heads(),
            90,
            "the NATed peers to receive each other's records",
            peers,
        )
        wait_until(lambda: all(p.stats().get("reachable", -1) >= 0 for p in peers), 30, "reachability", peers)
        assert [h.stats()["client_mode"] for h in homes] == [1.0, 1.0]
        assert [h.stats()["reachable"] for h in homes] == [0.0, 0.0]
        assert pub.stats()["client_mode"] == 0.0 and pub.stats()["reachable"] == 1.0
        # The public peer polls on its own clock: the homes seeing each other does not mean it has polled both yet.
        wait_until(lambda: {"home0-0", "home1-0"} <= pub.heads(), 30, "the public peer to receive both", peers)
        for h in homes:
            assert "peers cannot dial this node" in h.tail()
        out, err = doctor.communicate(timeout=60)
        behind = [line for line in out.splitlines() if "could not dial this node back" in line]
        assert doctor.returncode == 0 and behind and behind[0].startswith("warn"), out + err[-2000:]


def _seqs_from(peer: LabPeer, tag: str) -> dict[int, float]:
    """Sequence number -> receive time of the records ``peer`` received from the peer tagged ``tag``."""
    if not peer.out.exists():
        return {}
    lines = [json.loads(x) for x in peer.out.read_text().splitlines() if x.strip()]
    return {rec["seq"]: rec["t"] for rec in lines if rec["head"].startswith(tag + ":")}


def test_cut_link_node_keeps_running_and_is_seen_again(tmp_path):
    """A peer's uplink goes down for 15 s mid-run and comes back: the peer keeps publishing and polling meanwhile
    (its process survives), and the other peer receives its records again once the link is back."""
    with Lab(parse("public=2")) as lab:
        common = ["--mode", "auto", "--publish-interval", "1", "--poll-s", "0.5", "--duration", "100"]
        a = LabPeer(lab, "pub0", tmp_path, *common, "--records", "0")
        boot = a.addr()
        b = LabPeer(lab, "pub1", tmp_path, *common, "--records", "60", "--bootstrap", boot)
        b.addr()
        wait_until(lambda: len(_seqs_from(a, "pub1")) >= 3, 40, "records before the cut", [a, b])
        lab.link_down("pub1")
        cut = time.time()
        time.sleep(15)
        assert b.proc.poll() is None, b.tail()
        before = max(_seqs_from(a, "pub1"))
        lab.link_up("pub1")
        back = time.time()
        wait_until(lambda: max(_seqs_from(a, "pub1")) > before + 2, 45, "records after the link came back", [a, b])
        got = _seqs_from(a, "pub1")
        recovered = min(t for s, t in got.items() if s > before) - back
        assert all(t < cut + 2 for s, t in got.items() if s <= before)  # nothing arrived through a cut link
        assert recovered < 40, recovered
        assert b.proc.poll() is None, b.tail()


@pytest.mark.slow
def test_peer_started_while_its_only_peer_is_down_joins_when_it_comes_up(tmp_path):
    """The field's most reported failure ("DHTNode bootstrap failed: none of the initial_peers responded"): a peer
    whose every --peers address is down starts anyway, says so in one line, keeps publishing alone, and exchanges
    records once the peer's link comes up."""
    with Lab(parse("public=2")) as lab:
        common = ["--mode", "auto", "--publish-interval", "1", "--poll-s", "0.5", "--duration", "100"]
        a = LabPeer(lab, "pub0", tmp_path, *common, "--records", "60")
        boot = a.addr()
        lab.link_down("pub0")
        b = LabPeer(lab, "pub1", tmp_path, *common, "--records", "60", "--bootstrap", boot)
        b.addr()
        time.sleep(20)
        assert b.proc.poll() is None, b.tail()
        alone = [line for line in b.tail().splitlines() if "none of the 1 --peers address(es) answered" in line]
        assert len(alone) == 1, b.tail()
        assert not _seqs_from(b, "pub0")
        lab.link_up("pub0")
        wait_until(
            lambda: _seqs_from(b, "pub0") and _seqs_from(a, "pub1"), 60, "the two peers to exchange records", [a, b]
        )
