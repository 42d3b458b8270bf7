"""Network namespace plumbing: the preconditions check, ``ip``/``nft``/``tc`` commands run inside one namespace,
entering a namespace from Python (``setns``), and removing the namespaces a crashed earlier lab left behind.

Every name this module creates starts with :data:`PREFIX` and the creating process's pid, so a later lab can tell
its own leftovers (their creator is dead) from another live lab's namespaces. It never touches the machine's own
(root) namespace: interfaces are created inside the test's namespaces (``ip -n NS link add ... peer ... netns``).

Knows nothing about topologies or swarms.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess

from protocol.errors import SwarmError

#: Prefix of every namespace a lab creates: ``rlsw<pid>-<name>``.
PREFIX = "rlsw"
#: Debian packages that provide the tools, for the precondition message.
TOOLS = {"ip": "iproute2", "tc": "iproute2", "nft": "nftables"}
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"


class NetlabError(SwarmError):
    """The lab cannot be built (a precondition is missing) or a command inside it failed."""


def check_preconditions() -> None:
    """Raise one clear :class:`NetlabError` when the lab cannot run here: not root, a tool missing, no TUN device."""
    problems = []
    if os.geteuid() != 0:
        problems.append("it must run as root (network namespaces, veth links, nftables)")
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        problems.append(f"missing tools: apt-get install -y {' '.join(missing)}")
    if not os.path.exists("/dev/net/tun"):
        problems.append("/dev/net/tun is missing (the delaying links are TAP devices)")
    if problems:
        raise NetlabError("network lab unavailable: " + "; ".join(problems))


def ns_name(owner_pid: int, name: str) -> str:
    return f"{PREFIX}{owner_pid}-{name}"


def run(args: list[str], ns: str | None = None, *, check: bool = True, input: str | None = None) -> str:
    """Run a command (inside namespace ``ns`` when given); its stdout. A failure raises with its stderr."""
    cmd = ["ip", "netns", "exec", ns, *args] if ns else args
    res = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=30)
    if check and res.returncode != 0:
        raise NetlabError(f"`{' '.join(cmd)}` failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout


def ip(ns: str, *args: str, check: bool = True) -> str:
    """``ip -n NS ARGS``."""
    return run(["ip", "-n", ns, *args], check=check)


def nft(ns: str, script: str) -> None:
    """Load an nftables script into namespace ``ns``."""
    run(["nft", "-f", "-"], ns, input=script)


def add_ns(name: str) -> None:
    run(["ip", "netns", "add", name])
    ip(name, "link", "set", "lo", "up")


def del_ns(name: str) -> None:
    """Kill every process still inside namespace ``name`` (all started by the lab: nobody else enters it), then
    remove it (its interfaces go with it)."""
    for pid in pids_in(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    run(["ip", "netns", "del", name], check=False)


def pids_in(name: str) -> list[int]:
    out = run(["ip", "netns", "pids", name], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def list_ns() -> list[str]:
    out = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Remove the namespaces of labs whose creating process is dead (a run killed before its teardown)."""
    gone = []
    for name in list_ns():
        m = re.fullmatch(rf"{PREFIX}(\d+)-.+", name)
        if m and not _alive(int(m.group(1))):
            del_ns(name)
            gone.append(name)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def enter(name: str) -> None:
    """Move the calling thread (the whole process, if it has one thread) into network namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetlabError(f"setns({name}) failed: {os.strerror(err)}")
    finally:
        os.close(fd)
