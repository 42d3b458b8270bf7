"""Containment of a task plug-in's code: a per-call time limit, and quarantine after calls that never return.

A plug-in's ``generate`` and ``score`` run on peers' items, that is on input a stranger chose. Whatever they do
there -- raise, loop forever, return junk -- must cost the node one dropped group, not its life. Each guarded call
runs in a daemon thread that the caller waits on for at most ``timeout_s``; a call still running then is abandoned
(Python cannot kill a thread) and the family's count of stuck calls goes up until the call returns. A family with
``max_stuck`` stuck calls is quarantined: further calls fail at once (``plugin_quarantined``) until one of them
returns, so a plug-in that hangs on every item ties up at most ``max_stuck`` threads.

Trusted built-in families (reasoning-gym, the laboratory families) are called directly, without a thread.
Knows nothing about tasks beyond the family name it keys its counts by.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from node.tasks.family import PluginError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class PluginGuard:
    """Runs plug-in calls with a time limit (module docstring); thread-safe."""

    def __init__(self, timeout_s: float, max_stuck: int = 2):
        self.timeout_s = timeout_s
        self.max_stuck = max_stuck
        self._stuck: dict[str, int] = {}
        self._lock = threading.Lock()

    def stuck(self, family: str) -> int:
        """Calls into ``family`` that ran past their limit and have not returned yet."""
        with self._lock:
            return self._stuck.get(family, 0)

    def call(self, family: str, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, or :class:`PluginError` when it raises (``plugin_error``), runs past the time limit
        (``plugin_timeout``) or ``family`` is quarantined (``plugin_quarantined``)."""
        with self._lock:
            if self._stuck.get(family, 0) >= self.max_stuck:
                raise PluginError(
                    f"task plug-in {family!r} is quarantined: {self.max_stuck} of its calls never returned",
                    "plugin_quarantined",
                )
        box: dict[str, Any] = {}
        timed_out = threading.Event()

        def run() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # reported to the caller, never raised in this thread
                box["error"] = e
            finally:
                with self._lock:
                    box["done"] = True
                    if timed_out.is_set():
                        self._stuck[family] -= 1

        thread = threading.Thread(target=run, name=f"plugin:{family[:24]}:{what}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        with self._lock:
            if "done" not in box:
                timed_out.set()
                self._stuck[family] = self._stuck.get(family, 0) + 1
        if timed_out.is_set():
            raise PluginError(
                f"task plug-in {family!r}: {what} ran past its {self.timeout_s:g} s limit", "plugin_timeout"
            )
        if "error" in box:
            e = box["error"]
            if isinstance(e, PluginError):
                raise e
            raise PluginError(f"task plug-in {family!r}: {what} raised {e!r}", "plugin_error") from e
        return box["value"]  # type: ignore[no-any-return]
