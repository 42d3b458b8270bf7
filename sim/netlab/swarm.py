"""Peers in a lab: one process per host (a bare transport peer, ``tests.integration.hivemind_peer``, or a real
``swarm-node join``), and what they delivered to each other.

A transport peer prints ``ADDR <multiaddr> <peer id>`` and ``PUBLISHED <seq> <time>`` lines and writes one JSON line
per record it receives (sender, seq, receive time ``t``); :func:`delivery` turns those into the share of
(record, reader) pairs delivered and the per-pair delay. All hosts share the machine's clock.

Knows nothing about topologies beyond host names.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sim.netlab.lab import Lab, lab_env

PORT = 31337


@dataclass
class Peer:
    """A transport peer in one host: its process, output files, address, and what it published."""

    host: str
    proc: subprocess.Popen
    out: Path
    log: Path
    addr: str = ""
    peer_id: str = ""
    published: dict[int, float] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    _ready: threading.Event = field(default_factory=threading.Event)

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            parts = line.split()
            if parts[:1] == ["ADDR"] and len(parts) >= 3:
                self.addr, self.peer_id = parts[1], parts[2]
                self._ready.set()
            elif parts[:1] == ["PUBLISHED"] and len(parts) >= 3:
                self.published[int(parts[1])] = float(parts[2])
        self._ready.set()

    def wait_addr(self, timeout: float = 90) -> str:
        self._ready.wait(timeout)
        if not self.addr:
            raise RuntimeError(f"peer in {self.host} printed no address; see {self.log}")
        return self.addr

    def received(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(x) for x in self.out.read_text().splitlines() if x.strip()]

    def stats(self) -> dict:
        path = Path(f"{self.out}.metrics.json")
        try:
            return json.loads(path.read_text())["dht_stats"]
        except (OSError, ValueError, KeyError):
            return {}


def start_peer(lab: Lab, host: str, workdir: Path, args: list[str]) -> Peer:
    """Start a transport peer in ``host`` listening on every interface at :data:`PORT`."""
    out, log = workdir / f"{host}.jsonl", workdir / f"{host}.log"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "tests.integration.hivemind_peer", "--host", "0.0.0.0", "--port", str(PORT)]
    cmd += ["--tag", f"{host}:", "--out", str(out), *args]
    proc = lab.popen(host, cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    peer = Peer(host, proc, out, log)
    threading.Thread(target=peer.pump, name=f"{host}-stdout", daemon=True).start()
    return peer


def delivery(peers: list[Peer], since: float = 0.0, until: float = float("inf")) -> dict:
    """Share of (record, reader) pairs delivered among ``peers`` for records published in ``[since, until)``, and
    the delay from publishing to receiving (p50, p95, s) over the delivered pairs."""
    by_id = {p.peer_id: p for p in peers if p.peer_id}
    got: dict[tuple[str, str, int], float] = {}
    for reader in peers:
        for rec in reader.received():
            if rec["sender"] in by_id:
                got.setdefault((reader.host, by_id[rec["sender"]].host, rec["seq"]), rec["t"])
    pairs = delivered = 0
    delays = []
    for pub in peers:
        for seq, t in pub.published.items():
            if not since <= t < until:
                continue
            for reader in peers:
                if reader is pub:
                    continue
                pairs += 1
                r = got.get((reader.host, pub.host, seq))
                if r is not None:
                    delivered += 1
                    delays.append(max(0.0, r - t))
    delays.sort()
    return {
        "pairs": pairs,
        "delivered": delivered,
        "share": delivered / pairs if pairs else float("nan"),
        "p50_s": statistics.median(delays) if delays else float("nan"),
        "p95_s": delays[int(0.95 * (len(delays) - 1))] if delays else float("nan"),
    }


def wait_published(peers: list[Peer], records: int, timeout: float) -> None:
    """Until every peer has published ``records`` records (or exited), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(p.published) >= records or p.proc.poll() is not None for p in peers):
            return
        time.sleep(0.5)


#: ``swarm-node join`` options for small steps on shared cores (the built-in tiny model, one torch thread).
SMALL_JOIN = [
    "--config", "tiny",
    "--set", "rollout.prompts_per_step=4",
    "--set", "rollout.group_size=4",
    "--set", "sapo.local_groups=2",
    "--set", "sapo.external_groups=2",
    "--set", "runtime.poll_interval_s=1",
    "--set", "eval.items_per_family=4",
    "--set", "model.threads=1",
]  # fmt: skip


@dataclass
class Joined:
    """A real ``swarm-node join`` in one host: its process, run directory and the address it printed."""

    host: str
    proc: subprocess.Popen
    run_dir: Path
    addr: str = ""
    lines: list[str] = field(default_factory=list)
    _ready: threading.Event = field(default_factory=threading.Event)

    def pump(self) -> None:
        assert self.proc.stdout is not None
        with (self.run_dir / "stdout.log").open("a") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                self.lines.append(line.rstrip())
                if line.startswith("listening on /ip4/") and not line.startswith("listening on /ip4/127."):
                    self.addr = line.split()[-1]
                    self._ready.set()
        self._ready.set()

    def wait_addr(self, timeout: float = 180) -> str:
        self._ready.wait(timeout)
        if not self.addr:
            raise RuntimeError(f"node in {self.host} printed no address; see {self.run_dir / 'stdout.log'}")
        return self.addr

    def metrics(self) -> list[dict]:
        try:
            text = (self.run_dir / "metrics.jsonl").read_text()
        except OSError:
            return []
        return [json.loads(x) for x in text.splitlines() if x.strip()]


def start_join(lab: Lab, host: str, run_dir: Path, steps: int, peers: list[str], extra: tuple[str, ...] = ()) -> Joined:
    """Start ``swarm-node join`` in ``host`` on 0.0.0.0:PORT with :data:`SMALL_JOIN` settings (no client-mode flag:
    the node finds out itself)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(run_dir), "--max-steps", str(steps)]
    cmd += ["--host", "0.0.0.0", "--port", str(PORT), *SMALL_JOIN, *extra]
    for p in peers:
        cmd += ["--peers", p]
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = lab.popen(host, cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(env))
    node = Joined(host, proc, run_dir)
    threading.Thread(target=node.pump, name=f"{host}-join", daemon=True).start()
    return node


def _env(extra: dict[str, str]) -> dict[str, str]:
    return {**lab_env(), **extra}
