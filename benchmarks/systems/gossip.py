"""Shared by the two B1 gossip benchmarks (``b1_gossip.py`` over hivemind, ``b1_gossip_libp2p.py`` over libp2p).

The synthetic records, the coordinator that starts one worker process per peer, the per-run statistics, the
sweep over swarm sizes and repeats, the Markdown table and the command line. Each script keeps its own workers.

Imports neither hivemind nor libp2p (they cannot share a process: duplicate protobuf symbols), so either script
can use it; the workers import their transport inside their own process.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SWARM = "b1"
COMPLETIONS = 64
WORDS = ("the", "answer", "is", "so", "we", "add", "then", "sum", "carry", "step", "check", "result", "of", "and")
MEDIAN_KEYS = (
    "pairs_delivered",
    "p50_s",
    "p95_s",
    "records_per_s",
    "record_kb",
    "bytes_per_completion",
    "codec_share",
    "encode_share",
    "check_share",
    "guard_share",
    "codec_cpu_share",
    "encode_cpu_share",
    "check_cpu_share",
    "guard_cpu_share",
    "pair_p50_s",
    "pair_p95_s",
    "rss_mb_median",
    "rss_mb_max",
    "pss_mb_median",
    "poll_mean_s",
    "publish_mean_s",
)


# -- records ------------------------------------------------------------------------------------------------


def make_batch(record_kb: float, step: int, rng: random.Random):
    """A RolloutBatch with one group of 64 completions whose encoded size is about ``record_kb`` KB."""
    from protocol.types import Completion, Group, RolloutBatch, TaskRef

    chars = max(16, int(record_kb * 1024 / COMPLETIONS) - 40)
    comps = []
    for i in range(COMPLETIONS):
        text = " ".join(rng.choice(WORDS) for _ in range(chars // 4 + 1))[:chars]
        comps.append(
            Completion(
                text=text,
                n_tokens=chars // 4,
                finish_reason="stop" if i % 7 else "length",
                policy_version=step,
                logprob_mean=-rng.random(),
                reward_hint=float(i % 2),
            )
        )
    task = TaskRef("chain_sum", {"min_terms": 2, "max_terms": 4}, seed=step, index=rng.randrange(10_000))
    return RolloutBatch(
        model="builtin:tiny", policy_version=step, tokenizer="tok-b1", groups=(Group(task, tuple(comps)),)
    )


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


# -- coordinator ----------------------------------------------------------------------------------------------


def _stop(proc: subprocess.Popen | Forked) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if isinstance(proc, Forked):
        proc.close()


def run_swarm(
    script: str, mode: str, peers: int, opts: argparse.Namespace, workdir: Path, *, mesh_wait_s: float = 0.0
) -> list[dict]:
    """Start ``peers`` worker processes (``script --worker ARGS``, or forked by a zygote with ``--launch fork``),
    let them publish and poll; their result files.

    ``mesh_wait_s``: pause between the last READY and GO (a gossip mesh needs a few heartbeats to form)."""
    procs: list[subprocess.Popen | Forked] = []
    outs: list[Path] = []
    logs = []
    boot = None
    zygote = Zygote(script, workdir / f"{mode}_{peers}_zygote.log") if opts.launch == "fork" else None
    zygote_pss = 0
    try:
        for i in range(peers):
            out = workdir / f"{mode}_{peers}_{i}.json"
            out.unlink(missing_ok=True)
            outs.append(out)
            wargs = {
                "mode": mode,
                "index": i,
                "peers": peers,
                "bootstrap": boot,
                "steps": opts.steps,
                "interval": opts.interval,
                "record_kb": opts.record_kb,
                "poll_s": opts.poll_s,
                "settle_s": opts.settle_s,
                "window_seconds": opts.window_seconds,
                "leave_after": getattr(opts, "boot_leaves_after", 0),
                "discovery": getattr(opts, "discovery", None),
                "inline_max_bytes": getattr(opts, "inline_max_bytes", None),
                "poll_senders": getattr(opts, "poll_senders", None),
                "poll_records": getattr(opts, "poll_records", None),
                "lookup_beam": getattr(opts, "lookup_beam", None),
                "outfile": str(out),
            }
            log = (workdir / f"{mode}_{peers}_{i}.log").open("w")
            logs.append(log)
            proc: subprocess.Popen | Forked
            if zygote is not None:
                proc = zygote.spawn(wargs, log)
            else:
                proc = subprocess.Popen(
                    [sys.executable, script, "--worker", json.dumps(wargs)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    cwd=ROOT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            procs.append(proc)
            if i == 0:
                line = proc.stdout.readline()
                if not line.startswith("READY"):
                    raise RuntimeError(f"peer 0 did not start; see {log.name}")
                boot = line.split()[1]
        for i, proc in enumerate(procs[1:], 1):
            line = proc.stdout.readline()
            if not line.startswith("READY"):
                raise RuntimeError(f"peer {i} did not start; see {logs[i].name}")
        if mesh_wait_s:
            time.sleep(mesh_wait_s)
        t0 = time.time() + 1.0
        for proc in procs:
            proc.stdin.write(f"GO {t0}\n")
            proc.stdin.flush()
        limit = opts.steps * opts.interval + opts.settle_s + 60
        while zygote is not None and time.time() < t0 + limit and all(p.poll() is None for p in procs):
            # the zygote's share of the pages it shares with the peers, measured (like theirs) while they all run
            zygote_pss = zygote.pss_bytes()
            time.sleep(1.0)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(1.0, t0 + limit - time.time()))
    finally:
        for proc in procs:
            _stop(proc)
        for log in logs:
            log.close()
        if zygote is not None:
            zygote.close()
    results = [json.loads(o.read_text()) for o in outs if o.exists()]
    for r in results:
        r["zygote_pss_bytes"] = zygote_pss
    return results


def sweep(
    opts: argparse.Namespace, run_one: Callable[[str, int, argparse.Namespace, Path], dict], *, tmp_prefix: str
) -> list[tuple[int, dict[str, list[dict]]]]:
    """For each swarm size in ``opts.peers``: ``opts.repeats`` runs of every mode (order alternating per repeat),
    each ``run_one(mode, peers, run_opts, workdir)``; the runs by mode."""
    out = []
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as tmp:
        for peers in [int(p) for p in opts.peers.split(",")]:
            interval = opts.interval or 5.0 + peers / 2
            per_mode: dict[str, list[dict]] = {m: [] for m in opts.modes.split(",")}
            for rep in range(opts.repeats):
                modes = list(per_mode) if rep % 2 == 0 else list(reversed(per_mode))
                for mode in modes:
                    run_opts = argparse.Namespace(**{**vars(opts), "interval": interval})
                    res = run_one(mode, peers, run_opts, Path(tmp))
                    print(json.dumps(res), file=sys.stderr, flush=True)
                    per_mode[mode].append(res)
            out.append((peers, per_mode))
    return out


# -- command line ---------------------------------------------------------------------------------------------


def parser(doc: str, *, poll_s: float, modes: str) -> argparse.ArgumentParser:
    """The options both scripts take; ``poll_s`` and ``modes`` are their defaults."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--zygote", type=int, help=argparse.SUPPRESS)
    ap.add_argument(
        "--launch",
        choices=["exec", "fork"],
        default="exec",
        help="exec: each peer a fresh interpreter (default); fork: peers forked from one process that imported "
        "the transport once, sharing those pages (lets 64 hivemind peers fit in memory)",
    )
    ap.add_argument("--peers", default="8,32", help="comma-separated swarm sizes (default 8,32)")
    ap.add_argument("--steps", type=int, default=3, help="records each peer publishes")
    ap.add_argument("--interval", type=float, default=0.0, help="seconds between steps (default: 5 + peers/2)")
    ap.add_argument("--record-kb", type=float, default=150.0, help="approximate record size in KB")
    ap.add_argument("--poll-s", type=float, default=poll_s, help="seconds between polls of a peer")
    ap.add_argument("--settle-s", type=float, default=45.0, help="seconds to keep polling after the last step")
    ap.add_argument("--window-seconds", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=modes)
    ap.add_argument("--quick", action="store_true", help="3 peers, 2 small records each, one repeat")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return ap


def apply_quick(opts: argparse.Namespace) -> None:
    """``--quick``: 3 peers, 2 records of ~50 KB each, one repeat (what the tests run)."""
    if opts.quick:
        opts.peers, opts.steps, opts.record_kb, opts.repeats, opts.settle_s = "3", 2, 50.0, 1, 20.0
        opts.interval = opts.interval or 2.0
