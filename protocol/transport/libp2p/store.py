"""Validated records of the libp2p transport by window and digest, and the transport's counters.

Thread safe (the trio thread writes, the asyncio side reads). Bounded: at most ``max_per_window`` records per
window (oldest evicted first, evictions are the caller's to count) and nothing older than ``expiration_windows``
windows behind the current one after a :meth:`RecordStore.prune`. Knows nothing about what a record means.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any


def digest_of(data: bytes) -> bytes:
    """The content digest used by announcements and the sync protocol: SHA-256 (32 bytes)."""
    return hashlib.sha256(data).digest()


class RecordStore:
    """Validated records by window and digest, thread safe, bounded per window, forgotten after a horizon."""

    def __init__(self, expiration_windows: int, max_per_window: int) -> None:
        self.expiration_windows = expiration_windows
        self.max_per_window = max_per_window
        self._windows: dict[int, OrderedDict[bytes, bytes]] = {}
        self._where: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def has(self, digest: bytes) -> bool:
        with self._lock:
            return digest in self._where

    def get(self, digest: bytes) -> bytes | None:
        with self._lock:
            w = self._where.get(digest)
            return None if w is None else self._windows[w].get(digest)

    def add(self, window: int, digest: bytes, data: bytes) -> int:
        """Store a record; returns how many older records of that window were evicted to make room."""
        evicted = 0
        with self._lock:
            if digest in self._where:
                return 0
            records = self._windows.setdefault(window, OrderedDict())
            while len(records) >= self.max_per_window:
                old, _ = records.popitem(last=False)
                del self._where[old]
                evicted += 1
            records[digest] = data
            self._where[digest] = window
        return evicted

    def records(self, windows: Sequence[int]) -> list[bytes]:
        with self._lock:
            return [data for w in dict.fromkeys(windows) for data in self._windows.get(w, {}).values()]

    def inventory(self, windows: Sequence[int], limit: int) -> list[tuple[int, bytes]]:
        with self._lock:
            out = [(w, d) for w in dict.fromkeys(windows) for d in self._windows.get(w, {})]
        return out[:limit]

    def prune(self, now_window: int) -> None:
        horizon = now_window - self.expiration_windows
        with self._lock:
            for w in [w for w in self._windows if w < horizon]:
                for d in self._windows.pop(w):
                    del self._where[d]


class Counters:
    """Thread-safe counters: edge rejections and drops by reason, named stats, seconds spent validating."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rejected: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.edge_seconds = 0.0

    def reject(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.rejected[reason] += n

    def drop(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.drops[reason] += n

    def stat(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    def add_edge_seconds(self, seconds: float) -> None:
        with self._lock:
            self.edge_seconds += seconds

    def rejections(self) -> dict[str, int]:
        with self._lock:
            return dict(self.rejected)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                **dict(self.stats),
                "edge_seconds": self.edge_seconds,
                "rejected": dict(self.rejected),
                "rejected_total": sum(self.rejected.values()),
                "drops": dict(self.drops),
                "drops_total": sum(self.drops.values()),
            }
