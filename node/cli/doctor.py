"""``swarm-node doctor``: can this machine take part in a swarm? Each finding is one line with its remedy.

Checks, in order: the configured rollout engine imports (``rollout.engine: vllm``: vLLM and the torchvision trap);
the listening port can be bound; hivemind's p2pd daemon starts (the most frequent failure
people report); which addresses it listens on and whether any is public (only private or loopback addresses
means peers elsewhere cannot dial in: a guess); each ``--peers`` address answers, and whether that peer can dial
this host back (the real NAT test: ``protocol/transport/hivemind/reach.py``).
Exit status 0 when nothing failed, 1 otherwise (a NATed host is a warning: client mode works there).

Knows nothing about models or training; it starts the real transport, exactly as ``swarm-node join`` does, and
imports the engine exactly as a node does.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

from protocol.errors import SwarmError

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass
class Finding:
    """One check's verdict: ``ok``, ``warn`` or ``FAIL``, what was found, and what to do about it."""

    status: str
    what: str
    remedy: str = ""

    def line(self) -> str:
        return f"{self.status:4} {self.what}" + (f" -> {self.remedy}" if self.remedy else "")


def check_port(host: str, port: int) -> Finding:
    """Bind ``host:port`` for TCP like p2pd will (port 0: any free port, always fine)."""
    if port == 0:
        return Finding(OK, f"port: any free port on {host} (pass --port to check a fixed one)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            return Finding(
                FAIL,
                f"port {port} on {host} cannot be bound ({e.strerror or e})",
                f"stop what uses it (e.g. `ss -ltnp | grep :{port}`) or pick another --port",
            )
    return Finding(OK, f"port {port} on {host} is free")


def check_engine(engine: str, mode: str = "in_process", url: str = "") -> Finding:
    """The rollout engine a node with this config would use can start: ``transformers`` always can; ``vllm``
    in process needs a working vLLM install (imported here, as a node does); ``vllm`` as a server needs it to
    answer at ``url``."""
    if engine != "vllm":
        return Finding(OK, f"rollout engine: {engine} (no extra install)")
    if mode == "server":
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url.rstrip("/") + "/", timeout=5):
                pass
        except urllib.error.HTTPError:  # it answered (404 for GET /): it is up
            pass
        except (urllib.error.URLError, OSError) as e:
            return Finding(
                FAIL,
                f"rollout engine: vLLM server at {url} does not answer ({getattr(e, 'reason', e)})",
                "start it first: python -m node.rollout.engine_vllm serve --model MODEL_DIR --port PORT",
            )
        return Finding(OK, f"rollout engine: vLLM server at {url} answers")
    from node.rollout.engine_vllm import VllmInstallError, check_install

    try:
        version = check_install()
    except VllmInstallError as e:
        return Finding(FAIL, f"rollout engine: {e}")
    return Finding(OK, f"rollout engine: vLLM {version} imports (in the node's process)")


def classify_addresses(maddrs: list[str]) -> Finding:
    """Whether any listening address is public; only private/loopback ones look like a host behind NAT."""
    ips = []
    for m in maddrs:
        parts = m.split("/")
        if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
            try:
                ips.append(ipaddress.ip_address(parts[2]))
            except ValueError:
                continue
    if any(ip.is_global for ip in ips):
        return Finding(OK, "a public address is among the listening addresses: peers can dial in")
    kind = "loopback only" if ips and all(ip.is_loopback for ip in ips) else "private or loopback only"
    return Finding(
        WARN,
        f"no public address ({kind}): peers on other networks cannot dial this node (behind NAT?)",
        "a guess from addresses: pass --peers to ask a peer to dial back; join with --peers finds out by itself "
        "and runs as a DHT client when nobody can dial it (transport.client_mode=true forces that); to serve, "
        "forward the port and set transport.announce_maddrs=[/ip4/PUBLIC_IP/tcp/PORT]; --host 0.0.0.0 to listen "
        "on every interface",
    )


async def _start(host: str, port: int, peers: list[str], timeout_s: float):  # type: ignore[no-untyped-def]
    from protocol.transport.config import HivemindTransportConfig
    from protocol.transport.factory import create_transport

    cfg = HivemindTransportConfig(
        host=host, port=port, initial_peers=peers, startup_timeout_s=timeout_s, request_timeout_s=min(10.0, timeout_s)
    )
    return await create_transport(cfg, swarm="rl-swarm-doctor", peer_id="doctor")


async def run_checks(
    host: str,
    port: int,
    peers: list[str],
    say: Callable[[str], None],
    timeout_s: float = 30.0,
    engine: Finding | None = None,
) -> list[Finding]:
    """Run every check, printing each finding as it comes; returns them all. ``engine``: the engine check's
    finding, run first by the caller (it imports torch and vLLM, outside the event loop)."""
    from node.cli.preflight import check_peers

    findings: list[Finding] = []

    def note(f: Finding) -> None:
        findings.append(f)
        say(f.line())

    if engine is not None:
        note(engine)
    note(check_port(host, port))
    if findings[-1].status == FAIL:
        return findings
    try:
        transport = await _start(host, port, [], timeout_s)
    except (SwarmError, OSError) as e:
        note(
            Finding(
                FAIL,
                f"hivemind's p2pd daemon did not start ({e})",
                "check that /tmp is writable and not full, then reinstall: pip install --force-reinstall "
                "hivemind==1.1.12 (its wheel ships the p2pd binary)",
            )
        )
        return findings
    try:
        addrs = transport.addresses()
        note(Finding(OK, "p2pd started; listening on " + ", ".join(addrs)))
        if not peers:  # with peers, the dial-back probe below tells instead of guessing from addresses
            note(classify_addresses(addrs))
    finally:
        await transport.close()
    for peer in peers:
        try:
            check_peers([peer], "hivemind")
        except SwarmError as e:
            note(Finding(FAIL, str(e), "copy the peer's whole 'listening on' line"))
            continue
        remedy = (
            "check that the peer runs, that its address is current (a restarted node gets a new "
            "/p2p/ id) and that no firewall blocks its port"
        )
        try:
            probe = await _start(host, port, [peer], timeout_s)
        except (SwarmError, OSError) as e:
            note(Finding(FAIL, f"peer {peer} did not answer ({str(e).splitlines()[0][:160]})", remedy))
            continue
        try:
            if not await probe.peers():
                note(Finding(FAIL, f"peer {peer} did not answer (no DHT ping reply)", remedy))
                continue
            note(Finding(OK, f"peer {peer} answered"))
            note(reachability_finding(peer, await probe.check_reachability()))
        finally:
            await probe.close()
    return findings


def reachability_finding(peer: str, verdict: str) -> Finding:
    """What a dial-back probe (``protocol/transport/hivemind/reach.py``) through ``peer`` says about this host."""
    if verdict == "reachable":
        return Finding(OK, f"peer {peer} dialed this node back: reachable; join serves the DHT")
    if verdict == "unreachable":
        return Finding(
            WARN,
            f"peer {peer} could not dial this node back: behind NAT or a firewall; join runs as a DHT client "
            "by itself (client_mode: auto) and still reads and writes records",
            "to serve the DHT, forward the port and set transport.announce_maddrs=[/ip4/PUBLIC_IP/tcp/PORT]",
        )
    return Finding(WARN, f"peer {peer} did not answer the dial-back probe (an older node?): reachability unknown")


def doctor(
    host: str, port: int, peers: list[str], say: Callable[[str], None], engine: tuple[str, str, str] | None = None
) -> int:
    """Run the checks (``engine``: the configured ``(rollout.engine, vllm.mode, vllm.url)``); 0 when none failed,
    else 1."""
    findings = asyncio.run(run_checks(host, port, peers, say, engine=check_engine(*engine) if engine else None))
    failed = [f for f in findings if f.status == FAIL]
    say("healthy" if not failed else f"{len(failed)} problem(s) found")
    return 1 if failed else 0
