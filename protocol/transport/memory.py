"""In-process transport: a :class:`MemoryNetwork` shared by many :class:`MemoryTransport` peers, with fault hooks.

The network behaves like a DHT seen from its readers: a record is stored once under ``(window, sender)``
and every online, connected reader can fetch it until it falls out of the retention horizon. Faults are
decided per (record, reader) by hashing ``(seed, record id, reader)``, so a run is deterministic given the
seed whatever order peers poll in:

* latency and jitter: a record becomes visible to a reader ``latency_s + U(0, jitter_s)`` after it was
  published, measured on the network's injectable clock;
* loss: a reader never sees the record; duplication: a reader gets it twice per fetch;
* partitions: peers in different groups cannot see each other's records (until :meth:`MemoryNetwork.heal`);
* churn: :meth:`MemoryNetwork.leave` / :meth:`MemoryNetwork.join` take a peer offline and back; records it
  published stay stored (as in a DHT), an offline peer's publish and fetch raise :class:`TransportError`.

Knows nothing about record contents; the optional store-time check is applied on the reader's side.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from protocol.errors import TransportError
from protocol.transport.base import RecordCheck, Transport
from protocol.transport.config import MemoryTransportConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Entry:
    rid: int
    window: int
    sender: str  # the subkey the publisher chose (may be forged; the record itself says who signed it)
    publisher: str  # the transport peer that stored it (partitions are about who can reach whom)
    data: bytes
    published_at: float


class MemoryNetwork:
    """The shared medium of many :class:`MemoryTransport` peers; mutate fault attributes at any time."""

    def __init__(
        self,
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
        latency_s: float = 0.0,
        jitter_s: float = 0.0,
        loss: float = 0.0,
        duplicate: float = 0.0,
        retention_windows: int = 8,
    ) -> None:
        self.seed = seed
        self.clock = clock
        self.latency_s = latency_s
        self.jitter_s = jitter_s
        self.loss = loss
        self.duplicate = duplicate
        self.retention_windows = retention_windows
        self._windows: dict[int, list[_Entry]] = {}
        self._newest_window: int | None = None
        self._next_rid = 0
        self._online: set[str] = set()
        self._known: set[str] = set()
        self._group_of: dict[str, int] = {}
        self.stats = {"published": 0, "fetches": 0, "delivered": 0, "lost": 0, "duplicated": 0, "delayed": 0}

    @classmethod
    def from_config(cls, config: MemoryTransportConfig, clock: Callable[[], float] = time.time) -> MemoryNetwork:
        """A network with the faults of a :class:`MemoryTransportConfig`."""
        return cls(
            seed=config.seed,
            clock=clock,
            latency_s=config.latency_s,
            jitter_s=config.jitter_s,
            loss=config.loss,
            duplicate=config.duplicate,
            retention_windows=config.retention_windows,
        )

    # -- membership and partitions ---------------------------------------------------------------------

    def join(self, peer_id: str) -> None:
        """Bring ``peer_id`` online (first join, or rejoin after :meth:`leave`)."""
        if peer_id in self._online:
            raise ValueError(f"peer {peer_id!r} is already online")
        self._online.add(peer_id)
        self._known.add(peer_id)

    def leave(self, peer_id: str) -> None:
        """Take ``peer_id`` offline; its stored records stay until they expire."""
        self._online.discard(peer_id)

    def is_online(self, peer_id: str) -> bool:
        return peer_id in self._online

    def online_peers(self) -> list[str]:
        """All online peers, sorted."""
        return sorted(self._online)

    def partition(self, *groups: Iterable[str]) -> None:
        """Split the network: peers in different groups cannot see each other; unlisted peers form one more group."""
        self._group_of = {}
        for i, group in enumerate(groups):
            for peer in group:
                if peer in self._group_of:
                    raise ValueError(f"peer {peer!r} is in two partition groups")
                self._group_of[peer] = i

    def heal(self) -> None:
        """Remove every partition."""
        self._group_of = {}

    def can_reach(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` are on the same side of the current partition."""
        return self._group_of.get(a, -1) == self._group_of.get(b, -1)

    # -- storage ---------------------------------------------------------------------------------------

    def _store(self, publisher: str, window: int, sender: str, data: bytes) -> None:
        entry = _Entry(self._next_rid, window, sender, publisher, bytes(data), self.clock())
        self._next_rid += 1
        self._windows.setdefault(window, []).append(entry)
        self.stats["published"] += 1
        if self._newest_window is None or window > self._newest_window:
            self._newest_window = window
            horizon = window - self.retention_windows
            for w in [w for w in self._windows if w < horizon]:
                del self._windows[w]

    def _uniform(self, rid: int, reader: str, what: bytes) -> float:
        h = hashlib.blake2b(f"{self.seed}|{rid}|{reader}|".encode() + what, digest_size=8).digest()
        return int.from_bytes(h, "big") / 2.0**64

    def _fetch(self, reader: str, windows: Sequence[int], keep: Callable[[_Entry], bool] | None) -> list[bytes]:
        self.stats["fetches"] += 1
        now = self.clock()
        faulty = self.latency_s > 0 or self.jitter_s > 0 or self.loss > 0 or self.duplicate > 0
        out: list[bytes] = []
        for w in dict.fromkeys(windows):
            for e in self._windows.get(w, ()):
                if e.publisher != reader and not self.can_reach(reader, e.publisher):
                    continue
                copies = 1
                if faulty and e.publisher != reader:
                    delay = self.latency_s + self.jitter_s * self._uniform(e.rid, reader, b"jitter")
                    if now < e.published_at + delay:
                        self.stats["delayed"] += 1
                        continue
                    if self.loss > 0 and self._uniform(e.rid, reader, b"loss") < self.loss:
                        self.stats["lost"] += 1
                        continue
                    if self.duplicate > 0 and self._uniform(e.rid, reader, b"dup") < self.duplicate:
                        self.stats["duplicated"] += 1
                        copies = 2
                if keep is not None and not keep(e):
                    continue
                out.extend([e.data] * copies)
        self.stats["delivered"] += len(out)
        return out


class MemoryTransport(Transport):
    """One peer on a :class:`MemoryNetwork`; joins it on construction, leaves it on :meth:`close`."""

    def __init__(self, network: MemoryNetwork, peer_id: str, *, validate: RecordCheck | None = None) -> None:
        self.network = network
        self.peer_id = peer_id
        self._closed = False
        self._verdicts: dict[int, bool] = {}  # record id -> store-time verdict (the check is stateless)
        self.refused = 0
        self.set_record_validator(validate)
        network.join(peer_id)

    def _check_usable(self) -> None:
        if self._closed:
            raise TransportError(f"memory transport {self.peer_id} is closed")
        if not self.network.is_online(self.peer_id):
            raise TransportError(f"memory peer {self.peer_id} is offline")

    def _keep(self, e: _Entry) -> bool:
        check = self._record_validator
        if check is None:
            return True
        ok = self._verdicts.get(e.rid)
        if ok is None:
            try:
                ok = bool(check(e.data))
            except Exception:
                ok = False
            if len(self._verdicts) > 100_000:
                self._verdicts.clear()
            self._verdicts[e.rid] = ok
            if not ok:
                self.refused += 1
        return ok

    async def publish(self, data: bytes, *, window: int, sender: str) -> None:
        self._check_usable()
        self.network._store(self.peer_id, window, sender, data)
        await asyncio.sleep(0)  # a network call yields to the loop; keeps schedules realistic

    async def fetch_recent(self, windows: Sequence[int]) -> list[bytes]:
        self._check_usable()
        await asyncio.sleep(0)
        return self.network._fetch(self.peer_id, windows, self._keep if self._record_validator else None)

    async def peers(self) -> list[str]:
        self._check_usable()
        return [p for p in self.network.online_peers() if p != self.peer_id and self.network.can_reach(self.peer_id, p)]

    def addresses(self) -> list[str]:
        return [f"memory://{self.peer_id}"]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.network.leave(self.peer_id)

    def __repr__(self) -> str:
        return f"MemoryTransport({self.peer_id!r})"
