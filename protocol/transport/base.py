"""The :class:`Transport` interface: move opaque record bytes between peers, keyed by time window and sender.

A transport stores what ``publish`` is given under ``(window, sender)`` and returns, from ``fetch_recent``,
raw bytes stored for the requested windows by any peer -- our own records and ones we already fetched
included; dedup, validation and ordering happen above (``protocol.channel``). Delivery is best effort:
records may arrive late, twice, or never.

Sharded transports (memory, hivemind: ``protocol.layout``) find records through the sender's signed index
entry, which the publisher passes as ``publish(..., index=entry)`` (a record published without one is stored
but not listed), and each ``fetch_recent`` reads a bounded random sample of the swarm: at most
``poll_records`` new records, those of the senders in ``prefer`` first. Push transports (libp2p) ignore both.

Contract (checked by ``tests/contract/transport_contract.py`` for every implementation):

* ``publish(data, window=w, sender=s, index=entry)`` returns once the record is handed to the network; soon
  after, every connected peer's ``fetch_recent([w])`` includes ``data`` (in a swarm of at most
  ``poll_senders`` senders; beyond that, a sample). A transport keeps at least the latest record per
  ``(window, sender)``; it may keep more (memory and hivemind keep every listed record).
* ``fetch_recent`` returns only records stored under the requested windows, as ``bytes``, in any order.
* Records may expire a few windows after their window ends.
* ``peers()`` lists transport-level ids of reachable peers (not necessarily record sender ids).
* ``addresses()`` lists strings another peer can bootstrap from (multiaddrs, or pseudo-addresses).
* After ``close()`` (idempotent), ``publish`` and ``fetch_recent`` raise :class:`TransportError`.
* Failures raise :class:`TransportError` (or time out); callers wrap every call in a timeout.

Store-time validation hook: a transport that can refuse records on behalf of others (a DHT storing values
for its neighbours) accepts a :data:`RecordCheck` (``RecordValidator.verdict``: the verified envelope, or the
reason to refuse), at construction or through :meth:`Transport.set_record_validator`, and drops records it
refuses. It must be stateless; it is a first line of defence, never a replacement for the receive-path checks.
A transport that needs a record's fields for its own checks (the key it is stored under, the window it expires
with) reads them from the envelope the hook returns instead of decoding the record again; the receiving
channel's validator shares that decode too.

Knows nothing about record contents, signatures, or clocks (the hook brings the decoded envelope).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Collection, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocol.types import Envelope

logger = logging.getLogger(__name__)

RecordCheck = Callable[[bytes], "Envelope | str"]
"""A stateless store-time check: the verified envelope keeps the record, a reason (str) drops it."""


class Transport(abc.ABC):
    """Publish and fetch opaque signed records under time-window keys with the sender as subkey."""

    _record_validator: RecordCheck | None = None

    @abc.abstractmethod
    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        """Store ``data`` under ``(window, sender)`` so peers fetching ``window`` will get it; ``index`` is the
        sender's signed index entry listing it (``protocol.layout.IndexWriter``)."""

    @abc.abstractmethod
    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        """Raw record bytes stored under any of ``windows`` by any peer (own and already-seen ones included);
        ``prefer`` names senders (most wanted first) whose new records a sampling transport fetches first."""

    @abc.abstractmethod
    async def peers(self) -> list[str]:
        """Transport-level ids of the peers currently reachable."""

    @abc.abstractmethod
    def addresses(self) -> list[str]:
        """Addresses others can bootstrap from (multiaddrs, or pseudo-addresses such as ``memory://<id>``)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Leave the network and release resources; idempotent."""

    def set_record_validator(self, validate: RecordCheck | None) -> None:
        """Install (or remove, with None) the store-time check; call before the first publish/fetch.

        The default keeps it in ``self._record_validator``; implementations that cannot change it after
        start override this and raise :class:`TransportError`.
        """
        self._record_validator = validate

    @property
    def record_validator(self) -> RecordCheck | None:
        """The installed store-time check, or None."""
        return self._record_validator

    def rejections(self) -> dict[str, int]:
        """Entries this transport refused at store time (or in a peer's response), by reason."""
        return {}

    def evictions(self) -> dict[str, int]:
        """Entries this transport's storage held and dropped to make room (a full shard key, SPEC 7.4), by reason;
        what it refused outright is in :meth:`rejections`."""
        return {}

    def stats(self) -> dict[str, float]:
        """Cost counters (index and record reads, bytes); keys vary by transport."""
        return {}

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
