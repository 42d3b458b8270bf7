"""A mixed swarm across the network lab's NAT routers (``sim.netlab``): a public hivemind peer, a libp2p peer behind one
symmetric NAT and a hivemind peer behind another (SPEC 7.6). Nobody is told who is behind NAT; the NATed peers dial
out to the public one, whose p2pd relays the topic between them, so each NATed peer receives the other's records
although neither can dial the other and they run different transports.

Needs root, iproute2 and nftables, like ``test_netlab.py`` (a missing precondition fails with the lab's message).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.netlab.lab import Lab
from sim.netlab.topology import parse
from tests.integration.test_netlab import PORT, LabPeer

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]


class LabLibp2pPeer:
    """One ``tests.libp2p_isolated.peer_lp2p`` inside a lab host (it imports libp2p, never hivemind)."""

    def __init__(self, lab: Lab, host: str, tmp: Path, *args: str):
        self.host, self.out = host, tmp / f"{host}.json"
        self.log = (tmp / f"{host}.log").open("w")
        cmd = [sys.executable, "-m", "tests.libp2p_isolated.peer_lp2p", "--host", "0.0.0.0", "--port", str(PORT)]
        cmd += ["--tag", host, "--out", str(self.out), *args]
        self.proc = lab.popen(host, cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)

    def summary(self, timeout: float) -> dict:
        self.proc.wait(timeout=timeout)
        assert self.out.exists(), Path(self.log.name).read_text()[-2000:]
        return json.loads(self.out.read_text())


def _tags(peer: LabPeer) -> set[str]:
    """The tags (publishing host names, before ``|``) of the records a hivemind lab peer received."""
    if not peer.out.exists():
        return set()
    lines = [json.loads(x) for x in peer.out.read_text().splitlines() if x.strip()]
    return {rec["head"].split("|", 1)[0] for rec in lines}


def test_a_libp2p_peer_and_a_hivemind_peer_behind_nat_receive_each_others_records(tmp_path):
    with Lab(parse("public=1 homes=1,1 nat=symmetric")) as lab:
        common = ["--swarm", "lp2p-test", "--mode", "auto", "--records", "3", "--publish-interval", "3"]
        common += ["--poll-s", "1", "--duration", "120"]
        pub = LabPeer(lab, "pub0", tmp_path, *common, "--tag", "pub0|")
        boot = pub.addr()
        hm = LabPeer(lab, "home1-0", tmp_path, *common, "--tag", "home1-0|", "--bootstrap", boot)
        hm.addr()
        lp = LabLibp2pPeer(
            lab, "home0-0", tmp_path, "--bootstrap", boot, "--records", "3", "--every", "3", "--duration", "100",
            "--expect", "3", "--expect-tag", "home1-0", "--exit-when-done", "--linger", "10",
        )  # fmt: skip
        deadline = time.monotonic() + 110
        while "home0-0" not in _tags(hm) and time.monotonic() < deadline:
            time.sleep(0.5)
        got = lp.summary(timeout=max(1.0, deadline - time.monotonic()) + 20)
        assert "home0-0" in _tags(hm), (_tags(hm), hm.tail())
        assert "home0-0" in _tags(pub)
        assert {"pub0", "home1-0"} <= set(got["tags"]), got
        assert got["stats"]["rejected_total"] == 0, got["stats"]
