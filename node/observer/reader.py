"""The observer's network half: a child process that reads a swarm's records and streams their raw bytes.

Why a separate process: hivemind's top-level package imports torch (``python -X importtime -c "import
hivemind.dht.node"``: 2.1 s, 1.1 s of it torch; even importing ``hivemind.dht.node`` without running
``hivemind/__init__`` still loads torch through ``hivemind.utils``), and the observer must not load torch. So
this process owns the transport (any of the project's transports, built from the node config's ``transport``
section exactly as a node builds it, with the same store-time hook) and writes what ``fetch_recent`` returns to
stdout, one frame per record, **as raw bytes**: it decodes nothing for the parent, never pickles, and the
parent validates every record itself with the node's validator. It publishes nothing.

Frames on stdout: one tag byte, a 4-byte big-endian length, then the body.

* ``R`` -- one record's bytes, each distinct record once (deduplicated by SHA-256);
* ``S`` -- JSON (UTF-8) transport counters: ``{"dht_peers": int, "rejections": {reason: int}, "addresses":
  [str], "polls": int, "fetch_errors": int}``, after every poll.

The parent sends one JSON line on stdin (``{"swarm": str, "protocol": {...}, "transport": {...}, "poll_s":
float}``) and keeps stdin open; this process exits when stdin closes (the parent went away) or on SIGTERM,
closing the transport (and its p2pd). Knows nothing about what records mean.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import signal
import struct
import sys
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

HEADER = struct.Struct(">cI")
TAG_RECORD, TAG_STATS = b"R", b"S"


def write_frame(out: Any, tag: bytes, body: bytes) -> None:
    out.write(HEADER.pack(tag, len(body)) + body)
    out.flush()


async def _run(spec: dict[str, Any], stop: asyncio.Event) -> None:
    from node.config import NodeConfig
    from protocol.transport.factory import create_transport
    from protocol.validation import RecordValidator
    from swarm.evals import EVAL  # noqa: F401  (the transport's store-time guard must know every kind a node
    from swarm.scores import SCORES  # noqa: F401  knows, or it refuses those records on lookups)

    cfg = NodeConfig.model_validate(
        {"swarm_id": spec["swarm"], "protocol": spec["protocol"], "transport": spec["transport"]}
    )
    validator = RecordValidator.from_config(cfg.swarm_id, cfg.protocol)
    transport = await create_transport(
        cfg.transport, swarm=cfg.swarm_id, peer_id="observer", validate=validator.verdict, protocol=cfg.protocol
    )
    out = sys.stdout.buffer
    seen: dict[bytes, int] = {}
    polls = errors = 0
    poll_s = float(spec.get("poll_s", 1.0))
    ahead = min(1, cfg.protocol.max_future_windows)
    try:
        write_frame(out, TAG_STATS, json.dumps({"addresses": transport.addresses()}).encode())
        while not stop.is_set():
            now_w = validator.current_window()
            windows = list(range(now_w - cfg.protocol.fetch_past_windows, now_w + ahead + 1))
            polls += 1
            try:
                blobs = await asyncio.wait_for(transport.fetch_recent(windows), cfg.protocol.timeout_s)
            except Exception as e:  # the network comes and goes; the observer keeps showing what it has
                errors += 1
                logger.debug("fetch failed: %r", e)
                blobs = []
            for data in blobs:
                if not isinstance(data, bytes | bytearray):
                    continue
                digest = hashlib.sha256(data).digest()
                if digest in seen:
                    continue
                seen[digest] = now_w
                write_frame(out, TAG_RECORD, bytes(data))
            for d in [d for d, w in seen.items() if w < now_w - cfg.protocol.max_past_windows - 2]:
                del seen[d]
            try:
                n_peers = len(await asyncio.wait_for(transport.peers(), 10))
            except Exception:
                n_peers = None
            rejections = transport.rejections() if hasattr(transport, "rejections") else {}
            stats = {"dht_peers": n_peers, "rejections": rejections, "polls": polls, "fetch_errors": errors}
            write_frame(out, TAG_STATS, json.dumps(stats).encode())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(transport.close(), 30)


def main() -> int:
    logging.basicConfig(level="WARNING", stream=sys.stderr, format="%(asctime)s %(levelname)s reader: %(message)s")
    spec = json.loads(sys.stdin.readline())
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def watch_stdin() -> None:  # the parent closing our stdin (or dying) ends this process
        with contextlib.suppress(Exception):
            while sys.stdin.buffer.read(1):
                pass
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    try:
        loop.run_until_complete(_run(spec, stop))
    except BrokenPipeError:
        return 0
    except Exception as e:
        sys.stderr.write(f"error: observer reader failed after {time.monotonic() - started:.0f}s: {e}\n")
        return 1
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
