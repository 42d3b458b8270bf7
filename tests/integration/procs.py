"""Start and stop real ``swarm-node`` processes for tests: tracked by pid, ended by pid, never by name."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

#: ``swarm-node join`` options for small steps, so that processes overlap quickly on 2 cores. The held-out
#: evaluation still runs (and is published) at the start and the end, on 4 items per family instead of 48: the
#: default's ~1,000 completions per evaluation cost every node process seconds of CPU.
FAST_JOIN = [
    "--set", "rollout.prompts_per_step=4",
    "--set", "rollout.group_size=4",
    "--set", "sapo.local_groups=2",
    "--set", "sapo.external_groups=2",
    "--set", "runtime.poll_interval_s=0.5",
    "--set", "eval.items_per_family=4",
]  # fmt: skip

MADDR = re.compile(r"listening on (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\S+)")


ROOT = Path(__file__).resolve().parents[2]


class ChildProc:
    """A child process started from the repository root, its stdout collected line by line by a reader thread and
    its stderr written to ``log_path``; tracked and ended by pid (children included), never by name."""

    def __init__(
        self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None, *, own_group: bool = False
    ) -> None:
        self.log_path = log_path
        self.lines: list[str] = []
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=ROOT,
            # own_group: like a terminal, Ctrl-C can then reach the process and its p2pd together (killpg)
            start_new_session=own_group,
        )
        self.own_group = own_group
        self.pid = self.proc.pid
        self.left_children: list[int] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: re.Pattern[str] | str, timeout: float) -> re.Match[str]:
        pat = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                m = pat.search(line)
                if m:
                    return m
            seen = len(self.lines)
            if self.proc.poll() is not None and seen == len(self.lines):
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pat.pattern!r} from pid {self.pid}; stdout={self.lines[-20:]}, log={self.tail()}")

    def descendants(self) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def tail(self, n: int = 3000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()[-n:] if self.log_path.exists() else ""

    def wait(self, timeout: float) -> int:
        """The exit status, once the process has exited and the reader thread has taken its last stdout line (on a
        loaded machine the thread can lag the exit: a final "stopped at step" line was missed that way)."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=30)
        return code

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process's whole group, as a terminal's Ctrl-C does (needs ``own_group``)."""
        assert self.own_group, "start the process with own_group=True"
        if self.proc.poll() is None:
            os.killpg(self.pid, sig)

    def output(self) -> str:
        """Everything the process printed so far: stdout lines, then its stderr log."""
        return "\n".join(self.lines) + "\n" + self.tail(10**7)

    def stop(self, timeout: float = 20) -> None:
        """Terminate (then kill) this process and any children it left, by pid; ``left_children`` are those
        still alive afterwards (zombies aside)."""
        kids = self.descendants()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for pid in alive(kids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._log.close()
        self.left_children = alive(kids)


#: Commands that read a node config: without ``--config`` they run the default profile (the laboratory node), so a
#: test that gives none runs the fast ``tiny`` profile instead; a test of the default itself passes ``--config lab``.
CONFIGURED = ("join", "watch", "doctor")


class NodeProc(ChildProc):
    """One ``swarm-node`` process (``args`` after the program name, e.g. ``["join", ...]``); ``join``, ``watch`` and
    ``doctor`` get ``--config tiny`` unless ``args`` name a config."""

    def __init__(
        self, args: list[str], log_path: Path, env: dict[str, str] | None = None, *, own_group: bool = False
    ) -> None:
        if args and args[0] in CONFIGURED and "--config" not in args:
            args = [*args, "--config", "tiny"]
        exe = shutil.which("swarm-node", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        cmd = [exe, *args] if exe else [sys.executable, "-m", "node.cli.app", *args]
        super().__init__(cmd, log_path, env, own_group=own_group)

    def multiaddr(self, timeout: float = 120) -> str:
        return self.wait_for(MADDR, timeout).group(1)


class HivemindPeerProc(ChildProc):
    """One ``tests.integration.hivemind_peer`` process (a bare transport peer: honest, hostile or a sybil flood)."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        super().__init__([sys.executable, "-m", "tests.integration.hivemind_peer", *args], log_path, env)

    def wait_line(self, prefix: str, timeout: float = 60) -> str:
        """The first stdout line starting with ``prefix``."""
        return self.wait_for("^" + re.escape(prefix), timeout).string


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out
