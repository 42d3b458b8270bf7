"""A mixed swarm across the network lab's NAT routers (``sim.netlab``): a public hivemind peer, a libp2p peer behind one
symmetric NAT and a hivemind peer behind another (SPEC 7.6). Nobody is told who is behind NAT; the NATed peers dial
out to the public one, whose p2pd relays the topic between them, so each NATed peer receives the other's records
although neither can dial the other and they run different transports.

Needs root, iproute2 and nftables, like ``test_netlab.py`` (a missing precondition fails with the lab's message).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from node.telemetry.metrics import read_jsonl
from protocol.identity import Identity
from sim.netlab.lab import Lab
from sim.netlab.topology import parse
from tests.integration.procs import FAST_JOIN
from tests.integration.test_netlab import PORT, LabPeer

pytestmark = [pytest.mark.network]


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


@pytest.mark.timeout(180)
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


LISTENING = re.compile(r"listening on (/ip4/10\.\S+/p2p/\S+)")


def _trained_from(run_dir: Path) -> Counter:
    total: Counter = Counter()
    for row in read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []:
        total.update(row.get("external_by_sender") or {})
    return total


@pytest.mark.timeout(600)
def test_two_plus_two_swarm_nodes_train_on_each_other_with_one_behind_a_nat_router(tmp_path):
    """``test_mixed_transports``' 2 + 2 real ``swarm-node join`` processes in the lab: three public hosts and one
    hivemind node behind a NAT router (it dials out, runs as a DHT client and meets the libp2p nodes only through
    the public hivemind node's GossipSub); each node trains on the groups of all three others."""
    plan = {
        "h1": ("pub0", "hivemind"),
        "l1": ("pub1", "libp2p"),
        "h2": ("home0-0", "hivemind"),
        "l2": ("pub2", "libp2p"),
    }
    dirs = {n: tmp_path / n for n in plan}
    with Lab(parse("public=3 homes=1 nat=symmetric")) as lab:
        procs: dict[str, subprocess.Popen] = {}
        lines: dict[str, list[str]] = {}

        def join(name: str, *peers: str) -> str:
            host, transport = plan[name]
            cmd = [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(dirs[name]), "--transport", transport]
            cmd += ["--host", "0.0.0.0", "--port", str(PORT), *peers, "--config", "tiny", *FAST_JOIN]
            cmd += ["--set", "model.threads=1"]
            if transport == "libp2p":  # py-libp2p announces the listen address, 0.0.0.0 here: say where it is
                cmd += ["--set", f"transport.announce_maddrs=[/ip4/{lab.hosts[host].addr}/tcp/{PORT}]"]
            log = (tmp_path / f"{name}.log").open("w")
            p = procs[name] = lab.popen(host, cmd, stdout=subprocess.PIPE, stderr=log, text=True)
            got = lines[name] = []

            def read() -> None:
                for line in p.stdout or []:
                    got.append(line)

            threading.Thread(target=read, daemon=True).start()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and p.poll() is None:
                for line in list(got):
                    if m := LISTENING.search(line):
                        return m.group(1)
                time.sleep(0.2)
            raise AssertionError(f"{name} printed no address: {got} {(tmp_path / f'{name}.log').read_text()[-2000:]}")

        try:
            h1 = join("h1")
            join("l1", "--peers", h1)
            join("h2", "--peers", h1)
            join("l2", "--peers", h1)
            deadline = time.monotonic() + 420
            ids: dict[str, str] = {}
            while True:
                if not ids and all((d / "identity.key").exists() for d in dirs.values()):
                    ids = {n: Identity.load(d / "identity.key").peer_id for n, d in dirs.items()}
                trained = {n: _trained_from(d) for n, d in dirs.items()}
                missing = {n: [o for o in plan if o != n and not (ids and trained[n][ids[o]])] for n in plan}
                if ids and not any(missing.values()):
                    break
                for n, p in procs.items():
                    assert p.poll() is None, f"{n} exited: {(tmp_path / f'{n}.log').read_text()[-2000:]}"
                assert time.monotonic() < deadline, f"not every node trained on all three others: missing {missing}"
                time.sleep(3)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs.values():
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
        for n, d in dirs.items():
            rows = read_jsonl(d / "metrics.jsonl")
            assert rows[-1]["rejected"] == 0, (n, rows[-1]["rejected_by_reason"])
