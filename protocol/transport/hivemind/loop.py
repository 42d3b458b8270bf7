"""Plumbing under the hivemind transport: the private event loop and two fixes to hivemind's p2p layer.

* :class:`LoopThread` -- a private asyncio loop in a daemon thread where hivemind's tasks live; callers await
  through futures with a timeout;
* :func:`lazy_peer_id_text` -- hivemind's ``PeerID`` base58-encodes on first use instead of on construction;
* a log filter for p2pd's harmless report of a closed control socket at shutdown.

Knows nothing about records, keys or the swarm.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import base58
from hivemind.p2p import PeerID

logger = logging.getLogger(__name__)

T = TypeVar("T")


def port_of(addresses: list[str]) -> int:
    """The TCP port of the first ``/ip4/.../tcp/PORT/...`` address (0 when there is none)."""
    for addr in addresses:
        parts = addr.split("/")
        if "tcp" in parts and parts.index("tcp") + 1 < len(parts) and parts[parts.index("tcp") + 1].isdigit():
            return int(parts[parts.index("tcp") + 1])
    return 0


class _QuietDaemonShutdown(logging.Filter):
    """Drops p2pd's report that its control socket closed: a daemon that got the terminal's Ctrl-C says so at
    ERROR level although nothing is wrong (the node is shutting down with it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "use of closed network connection" not in record.getMessage()


logging.getLogger("hivemind.p2p.p2p_daemon").addFilter(_QuietDaemonShutdown())


@functools.lru_cache(maxsize=4096)
def _base58(peer_id: bytes) -> str:
    return base58.b58encode(peer_id).decode()


def lazy_peer_id_text() -> None:
    """hivemind's ``PeerID`` base58-encodes its bytes when it is built (pure Python, ~9 us), and a DHT lookup builds
    one for every peer named in every response, most of which are only ever hashed and compared as bytes: about
    10% of a loaded peer's busy samples at 32 peers (B1, session 24). Encode on first use instead, cached by bytes.
    Same values, same behaviour; ``tests/unit/protocol/test_hivemind_patches.py`` checks both."""
    if isinstance(PeerID.__dict__.get("_b58_str"), functools.cached_property):
        return

    def __init__(self: PeerID, peer_id_bytes: bytes) -> None:
        self._bytes = peer_id_bytes

    text = functools.cached_property(lambda self: _base58(self._bytes))
    text.__set_name__(PeerID, "_b58_str")
    PeerID._b58_str = text
    PeerID.__init__ = __init__


lazy_peer_id_text()


class LoopThread:
    """A private asyncio loop in a daemon thread: hivemind's tasks live there, callers await through futures."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._on_exception)
        #: Set on close: hivemind's fire-and-forget tasks then fail on the dying daemon's sockets; not news.
        self.closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # Let cancelled tasks unwind before the loop closes.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    def _on_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if self.closing:
            logger.debug("hivemind task failed during shutdown: %s", context.get("exception") or context["message"])
        else:
            loop.default_exception_handler(context)

    async def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the private loop; raise ``TimeoutError`` (after cancelling it there) past ``timeout``."""

        async def bounded() -> T:
            return await asyncio.wait_for(coro, timeout)

        fut = asyncio.run_coroutine_threadsafe(bounded(), self.loop)
        try:
            # The outer bound is a safety net in case the private loop itself is stuck.
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout + 5.0)
        except (TimeoutError, asyncio.CancelledError):
            fut.cancel()
            raise

    def stop(self, join_timeout: float = 10.0) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(join_timeout)
