"""Build a :class:`~sim.netlab.topology.Topology` out of network namespaces, run processes inside it, break its links,
and tear it all down (also when the run fails or is interrupted).

Layout (every name prefixed ``rlsw<pid>-``):

* ``hub``: the public segment, a bridge with no address of its own;
* ``pub<i>``: a public host, address ``10.200.0.<10+i>/24`` on its uplink ``up0``;
* ``r<k>``: home router k, WAN ``10.200.0.<100+k>`` on the public segment, LAN bridge ``10.201.<k>.1/24``, nftables
  masquerade out of the WAN (``fully-random`` for symmetric NAT) and a forward policy that lets only replies in;
* ``home<k>-<j>``: a host behind router k, ``10.201.<k>.<10+j>/24``, default route via the router.

An uplink without delay is a veth pair; one with delay or jitter is two TAP devices joined by a
:mod:`sim.netlab.wire` process. Loss is an nftables ``numgen random`` drop on the host's side of the link, both
directions; a rate limit is ``tc tbf`` on its egress. No namespace gets an address outside 10.200/16 and 10.201/16
nor a route to the machine's real interfaces: traffic cannot leave the lab.

Knows nothing about swarms: it runs any command in a host (:meth:`Lab.popen`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sim.netlab import ns as nsmod
from sim.netlab.ns import NetlabError, add_ns, del_ns, ip, nft
from sim.netlab.topology import LinkSpec, Topology

logger = logging.getLogger(__name__)

PUBLIC_NET = "10.200.0"
HOME_NET = "10.201"
UPLINK = "up0"


@dataclass
class Host:
    """One host of the lab: its name, namespace, address and whether it sits behind a NAT router."""

    name: str
    ns: str
    addr: str
    natted: bool
    router: str | None = None  # the router's namespace (NATed hosts)


class Lab:
    """A built topology; use as a context manager (``with Lab(topo) as lab: ...``) so it is always torn down."""

    def __init__(self, topo: Topology, *, owner_pid: int | None = None):
        self.topo = topo
        self.owner = owner_pid if owner_pid is not None else os.getpid()
        self.namespaces: list[str] = []
        self.hosts: dict[str, Host] = {}
        self.routers: list[str] = []
        self._wires: dict[str, subprocess.Popen] = {}  # link name -> wire process
        self._procs: list[subprocess.Popen] = []
        self._closed = False

    # -- building -------------------------------------------------------------------------------------------------

    def __enter__(self) -> Lab:
        self.build()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _ns(self, name: str) -> str:
        return nsmod.ns_name(self.owner, name)

    def build(self) -> None:
        nsmod.check_preconditions()
        stale = nsmod.remove_stale()
        if stale:
            logger.warning("removed %d namespace(s) a crashed earlier lab left: %s", len(stale), ", ".join(stale))
        atexit.register(self.teardown)
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise

    def _new_ns(self, name: str) -> str:
        full = self._ns(name)
        add_ns(full)
        self.namespaces.append(full)
        return full

    def _build(self) -> None:
        topo = self.topo
        hub = self._new_ns("hub")
        ip(hub, "link", "add", "br0", "type", "bridge")
        ip(hub, "link", "set", "br0", "up")
        for i in range(topo.public):
            name = f"pub{i}"
            host_ns = self._new_ns(name)
            addr = f"{PUBLIC_NET}.{10 + i}"
            self._link(host_ns, UPLINK, hub, f"p{i}", "br0", topo.link)
            ip(host_ns, "addr", "add", f"{addr}/24", "dev", UPLINK)
            self.hosts[name] = Host(name, host_ns, addr, natted=False)
        for k, count in enumerate(topo.homes):
            router = self._new_ns(f"r{k}")
            self.routers.append(router)
            wan_addr = f"{PUBLIC_NET}.{100 + k}"
            self._link(router, "wan", hub, f"r{k}", "br0", topo.wan)
            ip(router, "addr", "add", f"{wan_addr}/24", "dev", "wan")
            ip(router, "link", "add", "lan", "type", "bridge")
            ip(router, "addr", "add", f"{HOME_NET}.{k}.1/24", "dev", "lan")
            ip(router, "link", "set", "lan", "up")
            nsmod.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], router)
            random_ports = " fully-random" if topo.nat == "symmetric" else ""
            nft(
                router,
                f"""
table ip netlab_nat {{
  chain postnat {{ type nat hook postrouting priority srcnat; oifname "wan" masquerade{random_ports}; }}
}}
table inet netlab_fw {{
  chain forwarding {{
    type filter hook forward priority filter; policy accept;
    iifname "wan" ct state established,related accept
    iifname "wan" drop
  }}
}}
""",
            )
            for j in range(count):
                name = f"home{k}-{j}"
                host_ns = self._new_ns(name)
                addr = f"{HOME_NET}.{k}.{10 + j}"
                self._link(host_ns, UPLINK, router, f"h{j}", "lan", topo.link)
                ip(host_ns, "addr", "add", f"{addr}/24", "dev", UPLINK)
                ip(host_ns, "route", "add", "default", "via", f"{HOME_NET}.{k}.1")
                self.hosts[name] = Host(name, host_ns, addr, natted=True, router=router)

    def _link(self, a_ns: str, a_if: str, b_ns: str, b_if: str, bridge: str, spec: LinkSpec) -> None:
        """An uplink from ``a_ns`` (interface ``a_if``) into ``b_ns``'s bridge, with ``spec``'s conditions applied
        on ``a_ns``'s side."""
        if spec.delayed:
            cmd = [sys.executable, "-m", "sim.netlab.wire", a_ns, a_if, b_ns, b_if]
            cmd += ["--delay-ms", str(spec.delay_ms), "--jitter-ms", str(spec.jitter_ms)]
            cmd += ["--seed", str(len(self._wires))]
            wire = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=lab_env()
            )
            self._wires[f"{a_ns}:{a_if}"] = wire
            assert wire.stdout is not None
            line = wire.stdout.readline()
            if line.strip() != "ready":
                err = wire.stderr.read() if wire.stderr else ""
                raise NetlabError(f"delay wire {a_ns}:{a_if} did not start: {err.strip()[-500:]}")
        else:
            ip(a_ns, "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b_ns)
        ip(b_ns, "link", "set", b_if, "master", bridge)
        ip(b_ns, "link", "set", b_if, "up")
        ip(a_ns, "link", "set", a_if, "up")
        if spec.loss_pct > 0:
            per_mille = round(spec.loss_pct * 10)
            nft(
                a_ns,
                f"""
table inet netlab_loss {{
  chain drop_in {{
    type filter hook prerouting priority -300; iifname "{a_if}" numgen random mod 1000 < {per_mille} drop;
  }}
  chain drop_out {{
    type filter hook postrouting priority 300; oifname "{a_if}" numgen random mod 1000 < {per_mille} drop;
  }}
}}
""",
            )
        if spec.rate_kbit:
            burst = max(16, spec.rate_kbit // 8)  # ~1/8 s of traffic, at least 16 kbit
            nsmod.run(
                ["tc", "qdisc", "add", "dev", a_if, "root", "tbf", "rate", f"{spec.rate_kbit}kbit", "burst",
                 f"{burst}kbit", "latency", "400ms"],
                a_ns,
            )  # fmt: skip

    # -- running things -------------------------------------------------------------------------------------------

    def popen(self, host: str, cmd: list[str], **kwargs) -> subprocess.Popen:  # type: ignore[no-untyped-def]
        """Start ``cmd`` inside ``host``'s namespace, in its own process group; ended at teardown if still running."""
        h = self.hosts[host]
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("env", lab_env())
        proc = subprocess.Popen(["ip", "netns", "exec", h.ns, *cmd], **kwargs)
        self._procs.append(proc)
        return proc

    def run_in(self, host: str, cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``cmd`` to completion inside ``host``'s namespace."""
        h = self.hosts[host]
        return subprocess.run(
            ["ip", "netns", "exec", h.ns, *cmd], capture_output=True, text=True, timeout=timeout, env=lab_env()
        )

    # -- faults ---------------------------------------------------------------------------------------------------

    def link_down(self, host: str) -> None:
        """Cut ``host``'s uplink (the interface goes down: its processes keep running, alone)."""
        ip(self.hosts[host].ns, "link", "set", UPLINK, "down")

    def link_up(self, host: str) -> None:
        h = self.hosts[host]
        ip(h.ns, "link", "set", UPLINK, "up")
        if h.natted:  # a downed interface loses its routes
            ip(h.ns, "route", "replace", "default", "via", f"{h.addr.rsplit('.', 1)[0]}.1")

    def remove_host(self, host: str) -> None:
        """The host's namespace disappears with everything in it (processes killed, links gone)."""
        h = self.hosts.pop(host)
        for key in [k for k in self._wires if k.startswith(h.ns + ":")]:
            _stop(self._wires.pop(key))
        del_ns(h.ns)
        self.namespaces.remove(h.ns)

    # -- teardown -------------------------------------------------------------------------------------------------

    def teardown(self) -> None:
        """End every process the lab started (by pid: SIGTERM, then SIGKILL of its group), stop the wires, remove
        every namespace. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.teardown)
        for proc in self._procs:
            _stop(proc)
        for wire in self._wires.values():
            _stop(wire, grace_s=2)
        for name in reversed(self.namespaces):
            del_ns(name)
        self.namespaces.clear()


def _stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its children (p2pd) share its process group


def lab_env() -> dict[str, str]:
    """The environment of processes in the lab: this interpreter's import path first (a worktree's checkout)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}


def wait_tcp(lab: Lab, host: str, addr: str, port: int, timeout: float = 10.0) -> bool:
    """Whether a TCP connection from ``host`` to ``addr:port`` opens within ``timeout`` (a reachability probe)."""
    code = (
        "import socket,sys\n"
        "s=socket.socket();s.settimeout(float(sys.argv[3]))\n"
        "try:\n s.connect((sys.argv[1],int(sys.argv[2])));print('open')\n"
        "except OSError as e:\n print('closed',e)\n"
    )
    t0 = time.monotonic()
    res = lab.run_in(host, [sys.executable, "-c", code, addr, str(port), str(timeout)], timeout=timeout + 10)
    logger.debug("tcp %s -> %s:%d: %s (%.1fs)", host, addr, port, res.stdout.strip(), time.monotonic() - t0)
    return res.stdout.startswith("open")
