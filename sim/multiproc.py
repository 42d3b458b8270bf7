"""N real ``swarm-node join`` processes over hivemind on 127.0.0.1, for one (configuration, seed).

The first node is started alone; the simulator reads its stdout until the line ``listening on <multiaddr>``
with a full ``/ip4/127.0.0.1/tcp/PORT/p2p/ID`` address, then starts the others with ``--peers`` that address.
Each node gets its own run directory (``OUT/<config>/seed<k>/node<i>``: config, identity, metrics.jsonl,
stdout.log) and ``--max-steps``. Processes are tracked by pid and ended by pid: SIGTERM (the node checkpoints and
leaves), then SIGKILL of its process group (hivemind's p2p daemon included) if it does not exit in time.

A run directory left by an interrupted run resumes: every node continues from its latest checkpoint, and a node
whose checkpoint already reached ``steps`` is not started again (``swarm-node join`` would exit at once, printing
no address); the first node still to run is the bootstrap node then.

Knows nothing about what the nodes compute; the report reads their metrics files like any other run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from protocol.errors import SwarmError
from sim.config import SimConfig

logger = logging.getLogger(__name__)

#: The line ``swarm-node join`` prints for each address it listens on.
LISTEN_RE = re.compile(r"listening on (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)")
#: The line ``swarm-node join --linger`` prints when it has finished training and stays in the swarm.
LINGER_LINE = "staying in the swarm"


class MultiprocessError(SwarmError):
    """A node process failed to start, print its address, or finish in time."""


@dataclass
class NodeProcess:
    """One ``swarm-node join`` child: its process, run directory, and the addresses it printed."""

    index: int
    proc: subprocess.Popen
    run_dir: Path
    addresses: list[str] = field(default_factory=list)
    address_seen: threading.Event = field(default_factory=threading.Event)
    lingering: threading.Event = field(default_factory=threading.Event)  # done training, staying up (--linger)
    _reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start_reader(self) -> None:
        """Copy the child's stdout into ``stdout.log`` (so the pipe never fills) and watch for its address."""

        def pump() -> None:
            assert self.proc.stdout is not None
            with (self.run_dir / "stdout.log").open("w", encoding="utf-8") as log:
                for line in self.proc.stdout:
                    log.write(line)
                    log.flush()
                    m = LISTEN_RE.search(line)
                    if m:
                        self.addresses.append(m.group(1))
                        self.address_seen.set()
                    elif line.startswith(LINGER_LINE):
                        self.lingering.set()

        self._reader = threading.Thread(target=pump, name=f"node{self.index}-stdout", daemon=True)
        self._reader.start()

    def stop(self, grace_s: float = 15.0) -> int | None:
        """End the child by pid: SIGTERM, wait ``grace_s``, then SIGKILL its process group. Returns its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("node %d (pid %d) ignored SIGTERM; killing it", self.index, self.pid)
                self.proc.kill()
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # its own children (hivemind's p2pd) live in its process group
        if self._reader is not None:
            self._reader.join(5)
        return self.proc.returncode


def node_command(config_file: Path, run_dir: Path, steps: int, peers: list[str], extra: list[str]) -> list[str]:
    """The ``swarm-node join`` command line of one node (run with this interpreter)."""
    cmd = [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(run_dir), "--max-steps", str(steps)]
    cmd += ["--config", str(config_file), "--host", "127.0.0.1", "--port", "0"]
    for p in peers:
        cmd += ["--peers", p]
    return cmd + list(extra)


def _start(index: int, cmd: list[str], run_dir: Path, env: dict[str, str]) -> NodeProcess:
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, so stop() can end its children by pgid
    )
    node = NodeProcess(index, proc, run_dir)
    node.start_reader()
    logger.info("started node %d (pid %d)", index, proc.pid)
    return node


def _steps_done(node_dirs: list[Path]) -> int:
    """The slowest node's step count (lines of its metrics.jsonl), for a progress display."""
    counts = []
    for d in node_dirs:
        try:
            counts.append((d / "metrics.jsonl").read_bytes().count(b"\n"))
        except OSError:
            counts.append(0)
    return min(counts) if counts else 0


def finished(node_dir: Path, steps: int) -> bool:
    """Whether a node's run already reached ``steps``: its latest intact checkpoint is at ``steps`` or beyond (the
    rule by which a resumed ``swarm-node join --max-steps steps`` has nothing to do)."""
    from node.learn import load_latest

    ckpt = load_latest(node_dir / "checkpoints") if (node_dir / "checkpoints").is_dir() else None
    return ckpt is not None and ckpt.step >= steps


def run_seed_multiprocess(
    sim: SimConfig, variant: str, seed: int, out: str | Path, on_step: Callable[[int], None] | None = None
) -> Path:
    """Run ``sim.nodes`` processes of configuration ``variant`` with ``seed`` to ``sim.steps`` steps each (those
    not already there: a resumed run starts only its unfinished nodes).

    ``on_step(k)`` is called about once a second with the slowest node's step count (progress display)."""
    run_dir = Path(out) / variant / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    mp = sim.multiprocess
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(sim.torch_threads), "PYTHONUNBUFFERED": "1"}
    todo = [i for i in range(sim.nodes) if not finished(run_dir / f"node{i}", sim.steps)]
    done = [i for i in range(sim.nodes) if i not in todo]
    if done:
        logger.info("%s seed %d: nodes %s already reached step %d; not started again", variant, seed, done, sim.steps)
    procs: list[NodeProcess] = []
    try:
        for i in todo:
            node_dir = run_dir / f"node{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            mapping = sim.node_mapping(variant, i, seed)
            mapping.setdefault("model", {}).setdefault("threads", sim.torch_threads)
            # --peers/--host/--port become transport.* overrides, which need the union's tag to validate
            mapping.setdefault("transport", {}).setdefault("type", "hivemind")
            cfg_file = node_dir / "input.yaml"
            cfg_file.write_text(yaml.safe_dump(mapping, sort_keys=False))
            first = not procs  # the bootstrap node: the others join through it
            peers = procs[0].addresses[:1] if procs else []
            extra = [*mp.extra_args, *(["--linger", str(mp.linger_s)] if first and mp.linger_s else [])]
            procs.append(_start(i, node_command(cfg_file, node_dir, sim.steps, peers, extra), node_dir, env))
            if first:
                deadline = time.monotonic() + mp.startup_timeout_s
                while not procs[0].address_seen.wait(0.2):
                    if procs[0].proc.poll() is not None:
                        raise MultiprocessError(
                            f"node {i} exited with code {procs[0].proc.returncode} before printing its address; "
                            f"see {node_dir / 'stdout.log'}"
                        )
                    if time.monotonic() > deadline:
                        raise MultiprocessError(
                            f"node {i} printed no 'listening on' address in {mp.startup_timeout_s:.0f}s; "
                            f"see {node_dir / 'stdout.log'}"
                        )
                logger.info("bootstrap address %s", procs[0].addresses[0])
            elif mp.stagger_s:
                time.sleep(mp.stagger_s)
        deadline = time.monotonic() + mp.run_timeout_s
        # A lingering bootstrap node is waited for last and let go as soon as every other node has finished and it
        # has finished training (SIGTERM ends its linger; it exits 0).
        for p in procs[1:] + procs[:1] if mp.linger_s else procs:
            if p is procs[0] and mp.linger_s:
                while p.proc.poll() is None and not p.lingering.wait(0.5) and time.monotonic() < deadline:
                    pass
                if p.proc.poll() is None and p.lingering.is_set():
                    p.proc.terminate()
            try:
                while True:
                    left = max(0.0, deadline - time.monotonic())
                    try:
                        p.proc.wait(min(left, 1.0) if on_step is not None else left)
                        break
                    except subprocess.TimeoutExpired:
                        if left <= 1.0 or on_step is None:
                            raise
                        on_step(_steps_done([q.run_dir for q in procs]))
            except subprocess.TimeoutExpired:
                raise MultiprocessError(
                    f"node {p.index} (pid {p.pid}) did not finish {sim.steps} steps in {mp.run_timeout_s:.0f}s"
                ) from None
            if p.proc.returncode != 0:
                raise MultiprocessError(
                    f"node {p.index} exited with code {p.proc.returncode}; see {p.run_dir / 'stdout.log'}"
                )
    finally:
        for p in procs:
            p.stop()
    return run_dir
