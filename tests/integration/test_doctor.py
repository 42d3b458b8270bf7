"""``swarm-node doctor`` for real on 127.0.0.1: p2pd start, port check, NAT advice, a live and a dead peer."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.integration.test_cli_errors import REPO, cli
from tests.integration.test_hivemind_multiprocess import Peer

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]


def test_doctor_healthy_loopback_host_gets_client_mode_advice():
    res = cli("swarm-node", "doctor")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert any(line.startswith("ok   p2pd started; listening on /ip4/127.0.0.1/tcp/") for line in lines), lines
    nat = [line for line in lines if line.startswith("warn no public address")]
    assert nat and "pass --peers to ask a peer to dial back" in nat[0] and "transport.client_mode=true" in nat[0]
    assert lines[-1] == "healthy" and "Traceback" not in res.stderr


def test_doctor_port_in_use_is_one_failure_with_a_remedy():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = cli("swarm-node", "doctor", "--port", str(port))
    assert res.returncode == 1
    fails = [line for line in res.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and f"port {port}" in fails[0] and "-> " in fails[0]


def test_doctor_checks_peers(tmp_path):
    peer = Peer("p", tmp_path, "--records", "0", "--duration", "120")
    try:
        addr = peer.wait_line("ADDR", 90).split()[1]
        live = cli("swarm-node", "doctor", "--peers", addr)
        assert live.returncode == 0, live.stdout + live.stderr
        assert f"ok   peer {addr} answered" in live.stdout
        assert f"ok   peer {addr} dialed this node back: reachable" in live.stdout  # 127.0.0.1 is reachable
        port = addr.split("/")[4]
        dead = addr.replace(f"/tcp/{port}/", "/tcp/1/")  # same peer id, a port nobody listens on
        res = cli("swarm-node", "doctor", "--peers", dead, "--peers", "garbage")
        assert res.returncode == 1
        fails = [line for line in res.stdout.splitlines() if line.startswith("FAIL")]
        assert len(fails) == 2 and "did not answer" in fails[0] and "not a multiaddr" in fails[1]
        assert all("-> " in line for line in fails)
    finally:
        peer.stop()


def test_doctor_help_is_instant():
    res = subprocess.run(
        [sys.executable, "-m", "node.cli.app", "doctor", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert res.returncode == 0 and "--peers" in res.stdout
