"""The bridge between the node's asyncio loop and py-libp2p's trio: one trio program on a private daemon thread.

The libp2p host, pubsub and background tasks live in ``trio.run`` on that thread. The asyncio side never touches
trio objects: :meth:`TrioBridge.call` hands a coroutine function to the thread (``TrioToken.run_sync_soon`` then
``nursery.start_soon``) and awaits a ``concurrent.futures.Future`` wrapped for asyncio. Every call has a timeout
inside trio (``trio.fail_after``) and a safety-net timeout outside in case the thread itself is stuck. This is
the work a ``trio-asyncio`` loop would do, without making the node's event loop a trio-asyncio loop.

Knows nothing about libp2p: it runs whatever trio program the transport gives it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from protocol.errors import TransportError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class TrioBridge:
    """A trio program on a daemon thread, and timed calls into its nursery from asyncio."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None

    def start(self, main: Callable[[], Awaitable[None]], on_exit: Callable[[BaseException | None], None]) -> None:
        """Run ``main`` in ``trio.run`` on a new daemon thread; ``on_exit(error)`` runs on that thread at its end."""

        def thread_main() -> None:
            error: BaseException | None = None
            try:
                trio.run(self._run, main)
            except BaseException as e:
                error = e
                logger.warning("libp2p thread ended with %s: %s", e.__class__.__name__, e, exc_info=True)
            finally:
                self._nursery = None
                on_exit(error)

        self._thread = threading.Thread(target=thread_main, name=self.name, daemon=True)
        self._thread.start()

    async def _run(self, main: Callable[[], Awaitable[None]]) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        await main()

    # -- inside the trio thread ------------------------------------------------------------------------------------

    def serve(self, nursery: trio.Nursery | None) -> None:
        """Accept calls into ``nursery`` from now on (``None``: refuse them again)."""
        self._nursery = nursery

    async def wait_stop_requested(self) -> None:
        assert self._stop is not None
        await self._stop.wait()

    # -- from asyncio ----------------------------------------------------------------------------------------------

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float) -> T:
        """Run ``fn(*args)`` in the trio thread's nursery; ``TimeoutError`` past ``timeout``; errors other than
        :class:`TransportError` come back as one."""
        token, nursery = self._token, self._nursery
        if token is None or nursery is None:
            raise TransportError("libp2p transport is not running")
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def spawn() -> None:
            nursery.start_soon(_run_call, fut, fn, args, timeout)

        try:
            token.run_sync_soon(spawn)
        except trio.RunFinishedError as e:
            raise TransportError("libp2p transport has stopped") from e
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout + 5.0)
        except TimeoutError:
            fut.cancel()
            raise

    def request_stop(self) -> None:
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._stop.set)

    async def join(self, timeout: float) -> bool:
        """Wait (without blocking the loop) for the thread to end; False if it is still alive after ``timeout``."""
        thread = self._thread
        deadline = time.monotonic() + timeout
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return thread is None or not thread.is_alive()


async def _run_call(
    fut: concurrent.futures.Future[Any], fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], timeout: float
) -> None:
    if not fut.set_running_or_notify_cancel():
        return
    try:
        with trio.fail_after(timeout):
            result = await fn(*args)
    except trio.TooSlowError:
        fut.set_exception(TimeoutError(f"libp2p call {fn.__name__} timed out after {timeout} s"))
    except trio.Cancelled:
        fut.set_exception(TransportError("libp2p transport closed during the call"))
        raise
    except TransportError as e:
        fut.set_exception(e)
    except Exception as e:
        fut.set_exception(TransportError(f"libp2p {fn.__name__} failed: {e.__class__.__name__}: {e}"))
    else:
        fut.set_result(result)
