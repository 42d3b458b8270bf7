"""``swarm-node watch`` behind the argument parser: a read-only observer of a swarm with a local web page.

Two processes, so that the observer never imports torch (hivemind's package imports it, see
``node.observer.reader``):

* the **reader** child (``python -m node.observer.reader``) joins the swarm with the node config's transport
  (hivemind in client mode by default), publishes nothing, and streams the raw bytes of every record it fetches;
* this process (no torch, no hivemind, no model) validates each record with the node's own
  :class:`~protocol.validation.RecordValidator`, re-scores completions with the node's verifiers
  (:class:`node.observer.state.SwarmObserver`) and serves the page and ``/api/state`` (``node.observer.http``).

A record reaches the page only after validation. If the reader dies the page keeps showing what it has and a
new reader is started. SIGINT/SIGTERM stop both processes. Knows nothing about training.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from node.config import NodeConfig
from node.observer.http import ObserverServer
from node.observer.reader import HEADER, TAG_RECORD, TAG_STATS
from node.observer.state import SwarmObserver
from protocol.validation import RecordValidator

logger = logging.getLogger(__name__)

#: Largest frame accepted from the reader (a record above max_record_bytes still arrives, to be counted oversize).
MAX_FRAME_BYTES = 16 << 20


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class ReaderProcess:
    """The reader child: started, read frame by frame, restarted when it dies, ended by pid."""

    def __init__(self, spec: dict[str, Any], observer: SwarmObserver):
        self.spec = spec
        self.observer = observer
        self.proc: asyncio.subprocess.Process | None = None
        self.addresses: list[str] = []
        self.ready = asyncio.Event()
        self.restarts = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "node.observer.reader",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write((json.dumps(self.spec) + "\n").encode())
            await self.proc.stdin.drain()
            try:
                await self._read(self.proc.stdout)
            finally:
                await self.stop()
            if stop.is_set():
                break
            self.restarts += 1
            _say("observer reader exited; restarting it in 5 s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5)

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        while True:
            try:
                head = await stdout.readexactly(HEADER.size)
                tag, size = HEADER.unpack(head)
                if size > MAX_FRAME_BYTES:
                    logger.warning("observer reader sent a %d-byte frame; restarting it", size)
                    return
                body = await stdout.readexactly(size)
            except asyncio.IncompleteReadError:
                return
            if tag == TAG_RECORD:
                await asyncio.to_thread(self.observer.feed, body)
            elif tag == TAG_STATS:
                try:
                    stats = json.loads(body)
                except ValueError:
                    continue
                if not isinstance(stats, dict):
                    continue
                if "addresses" in stats:
                    self.addresses = [str(a) for a in stats.get("addresses") or []]
                    self.ready.set()
                if "dht_peers" in stats:
                    self.observer.set_transport_stats(stats)

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(Exception):
            if proc.stdin is not None:
                proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def _ticker(observer: SwarmObserver, every_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        observer.tick()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def _watch(cfg: NodeConfig, host: str, port: int) -> int:
    validator = RecordValidator.from_config(cfg.swarm_id, cfg.protocol)
    observer = SwarmObserver(validator)
    spec = {
        "swarm": cfg.swarm_id,
        "protocol": cfg.protocol.model_dump(mode="json"),
        "transport": cfg.transport.model_dump(mode="json"),
        "poll_s": 1.0,
    }
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = await ObserverServer.start(observer.state, host, port)
    reader = ReaderProcess(spec, observer)
    tasks = [
        asyncio.create_task(reader.run(stop), name="observer-reader"),
        asyncio.create_task(_ticker(observer, observer.limits.bucket_s, stop), name="observer-ticker"),
    ]
    try:
        _say(f"observing swarm {cfg.swarm_id!r} (read-only; records are validated and re-scored here)")
        _say(f"serving on http://{host}:{server.port}/ (JSON: /api/state)")
        await stop.wait()
        _say("stopping the observer")
        return 0
    finally:
        await reader.stop()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        await server.close()


def run_watch(
    *,
    config_path: Path | None,
    overrides: list[str],
    peers: list[str],
    host: str,
    port: int,
) -> int:
    """Resolve the swarm settings (the node config's ``swarm_id``, ``protocol`` and ``transport``), then observe."""
    from protocol.config import load_config

    sets = list(overrides)
    if peers:
        sets.append("transport.initial_peers=[" + ", ".join(f'"{p}"' for p in peers) + "]")
    cfg = load_config(NodeConfig, config_path, sets)
    if cfg.transport.type == "hivemind" and not any(o.startswith("transport.client_mode") for o in overrides):
        # An observer serves nobody: a DHT client joins from behind NAT and costs the swarm nothing.
        cfg = cfg.model_copy(update={"transport": cfg.transport.model_copy(update={"client_mode": True})})
    return asyncio.run(_watch(cfg, host, port))
