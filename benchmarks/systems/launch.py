"""How a B1 gossip benchmark starts its peers, and what memory each takes (``gossip.run_swarm`` coordinates them).

Imports neither hivemind nor libp2p (they cannot share a process), so either script can use it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.systems.harness import ROOT


def _own_kb(pid: int, path: str, key: str) -> int:
    """``key`` (a ``kB`` line of ``/proc/PID/<path>``) of one process; 0 where it cannot be read."""
    try:
        lines = Path(f"/proc/{pid}/{path}").read_text().splitlines()
    except OSError:
        return 0
    return sum(int(line.split()[1]) for line in lines if line.startswith(key + ":"))


def _tree_kb(pid: int, path: str, key: str) -> int:
    """The sum of ``key`` (a ``kB`` line of ``/proc/PID/<path>``) over a process and all its descendants."""
    total = _own_kb(pid, path, key)
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += _tree_kb(int(child), path, key)
    except (OSError, ValueError):
        pass
    return total


def rss_tree_bytes(pid: int | None = None) -> int:
    """Resident memory of a process and all its descendants (a hivemind peer is the Python process plus its p2pd
    daemon), from ``/proc`` (Linux); 0 where it cannot be read. Pages shared between peers (library code) count
    in every peer's RSS."""
    return _tree_kb(os.getpid() if pid is None else pid, "status", "VmRSS") * 1024


def pss_tree_bytes(pid: int | None = None) -> int:
    """Proportional set size of a process and its descendants: each page shared by k processes counts 1/k, so the
    sum over all peers is the memory the swarm really takes; 0 where it cannot be read."""
    return _tree_kb(os.getpid() if pid is None else pid, "smaps_rollup", "Pss") * 1024


# -- launchers ----------------------------------------------------------------------------------------------
#
# ``exec`` (default): each peer is ``python SCRIPT --worker ARGS``, a fresh interpreter that imports its transport
# itself. A hivemind peer's Python process then holds ~184 MB of private memory from ``import hivemind`` (which
# imports torch), so 64 peers do not fit in this machine's 23.5 GiB. ``fork``: one zygote process imports the
# worker's modules once and forks each peer from itself, so those pages stay shared copy-on-write between peers
# (hivemind's own DHT benchmark gets the same sharing: its DHT nodes are processes forked from one parent). Each
# peer is still its own process with its own transport, event loop and daemon; only the launch differs.


class Forked:
    """A peer forked by the zygote: the part of :class:`subprocess.Popen` that :func:`run_swarm` uses. The zygote is
    its parent and hands over a pidfd it opened before it could reap the peer, so the pidfd names this peer even if
    it already exited (``returncode`` is not known: 0 once it exited)."""

    def __init__(self, pid: int, pidfd: int, stdin: int, stdout: int):
        self.pid = pid
        self._pidfd = pidfd
        self.stdin = os.fdopen(stdin, "w")
        self.stdout = os.fdopen(stdout, "r")
        self.returncode: int | None = None

    def _exited(self, timeout: float | None) -> bool:
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return bool(poller.poll(None if timeout is None else int(timeout * 1000)))

    def poll(self) -> int | None:
        if self.returncode is None and self._exited(0):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._exited(timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        self.returncode = 0
        return 0

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        for f in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                f.close()
        os.close(self._pidfd)


class Zygote:
    """``python SCRIPT --zygote FD``: imports the worker's modules, then forks one peer per :meth:`spawn`. Requests
    travel over a SOCK_SEQPACKET socket pair, with the peer's stdin, stdout and log passed as file descriptors, and
    the answer (the peer's pid) with a pidfd of the peer."""

    def __init__(self, script: str, log: Path, *, start_timeout_s: float = 120.0):
        self.log = log
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, script, "--zygote", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        theirs.close()
        self.sock.settimeout(start_timeout_s)
        try:
            ready = self.sock.recv(64)
        except TimeoutError:
            ready = b""
        self.sock.settimeout(None)
        if ready != b"READY":
            self.close()
            raise RuntimeError(f"the zygote did not start; see {log}")

    def spawn(self, wargs: dict, log) -> Forked:
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            socket.send_fds(self.sock, [json.dumps(wargs).encode()], [in_r, out_w, log.fileno()])
            msg, fds, _, _ = socket.recv_fds(self.sock, 64, 1)
            if not msg or len(fds) != 1:
                raise RuntimeError(f"the zygote died; see {self.log}")
        except BaseException:
            os.close(in_w)
            os.close(out_r)
            raise
        finally:
            os.close(in_r)
            os.close(out_w)
        return Forked(int(msg), fds[0], in_w, out_r)

    def pss_bytes(self) -> int:
        """The zygote's own PSS (its share of the pages it shares with the peers; not its children's), 0 once it is
        gone."""
        if self.proc.poll() is not None:
            return 0
        return _own_kb(self.proc.pid, "smaps_rollup", "Pss") * 1024

    def close(self) -> None:
        self.sock.close()  # the zygote waits for its peers, then exits
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def serve_zygote(fd: int, preload: Sequence[str], run_worker: Callable[[dict], None]) -> None:
    """The zygote's side: import ``preload``, then fork a peer running ``run_worker(wargs)`` per request until the
    coordinator closes the socket; then wait for the peers."""
    for name in preload:
        importlib.import_module(name)
    gc.freeze()  # keep the collector from touching (and so copying) the imported objects in every peer
    sock = socket.socket(fileno=fd)
    sock.send(b"READY")
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        if not msg:
            break
        pid = os.fork()
        if pid == 0:
            _become_peer(sock, json.loads(msg), fds, run_worker)
        for f in fds:
            os.close(f)
        pidfd = os.pidfd_open(pid)  # before any wait of ours can reap it: the pidfd names this peer
        try:
            socket.send_fds(sock, [str(pid).encode()], [pidfd])
        finally:
            os.close(pidfd)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
    with contextlib.suppress(ChildProcessError):
        while True:
            os.wait()


def _become_peer(sock: socket.socket, wargs: dict, fds: list[int], run_worker: Callable[[dict], None]) -> None:
    """In the forked child: never returns to the zygote's loop, whatever fails."""
    code = 1
    try:
        sock.close()
        for target, f in enumerate(fds):  # stdin, stdout, stderr (the peer's log)
            os.dup2(f, target)
            os.close(f)
        # fresh text streams over the new descriptors (the zygote's stdin may hold buffered bytes)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        run_worker(wargs)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def launch_note(opts: argparse.Namespace) -> str:
    """The report's sentence on how the peers were started."""
    if opts.launch == "fork":
        return (
            " Peers launched with `--launch fork`: forked from one zygote process that imported the transport once "
            "(PSS per peer includes a 1/N share of the zygote's own PSS)."
        )
    return " Peers launched with `--launch exec`: a fresh interpreter each."


def worker_main(opts: argparse.Namespace, preload: Sequence[str], run_worker: Callable[[dict], None]) -> bool:
    """A script's ``--worker`` / ``--zygote`` modes; False when ``opts`` asks for neither (the coordinator)."""
    if opts.worker:
        run_worker(json.loads(opts.worker))
        return True
    if opts.zygote is not None:
        serve_zygote(opts.zygote, preload, run_worker)
        return True
    return False
