"""The libp2p transport's edge validator: what every record must pass before it is stored or forwarded.

Size cap, decode (schema, canonical form, Ed25519 signature), swarm, window horizon (``max_future_windows``
ahead, ``expiration_windows`` behind). With the caller's stateless hook (``RecordValidator.verdict``) installed,
the hook decodes and verifies (and the receiving channel reuses that decode); without one, this module decodes
itself. Only the libp2p-specific check (the expiration horizon) is this module's own. A record that passes is
stored; a refusal is counted by reason and never raises. Knows nothing about replay or
quotas (the channel's validator does those) nor about how the bytes arrived (gossip, announce-then-fetch, sync).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from protocol.codec import RecordDecodeError, RecordSignatureError
from protocol.records import decode_record, window_of
from protocol.transport.base import RecordCheck
from protocol.transport.config import ProtocolConfig
from protocol.transport.libp2p.store import Counters, RecordStore, digest_of
from protocol.types import Envelope

logger = logging.getLogger(__name__)


class EdgeValidator:
    """Validates records for one swarm and stores those that pass in ``store``; counts into ``counters``."""

    def __init__(
        self,
        *,
        swarm: str,
        protocol: ProtocolConfig,
        expiration_windows: int,
        hook: RecordCheck | None,
        store: RecordStore,
        counters: Counters,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.swarm = swarm
        self.protocol = protocol
        self.expiration_windows = expiration_windows
        self.hook = hook
        self.store = store
        self.counters = counters
        self.clock = clock

    def now_window(self) -> int:
        return window_of(self.clock(), self.protocol.window_seconds)

    def admit(self, data: bytes, digest: bytes | None = None) -> str | None:
        """Validate a record and store it; None if it is (now) stored, else the rejection reason (counted)."""
        if self.store.has(digest if digest is not None else digest_of(data)):
            return None
        start = time.perf_counter()
        try:
            reason = self._check(data)
        finally:
            self.counters.add_edge_seconds(time.perf_counter() - start)
        if reason is not None:
            self.counters.reject(reason)
            logger.debug("edge validation refused a record (%s), %d bytes", reason, len(data))
        return reason

    def _check(self, data: bytes) -> str | None:
        if len(data) > self.protocol.max_record_bytes:
            return "oversize"
        try:
            got = self.hook(data) if self.hook is not None else decode_record(data, self.protocol.max_record_bytes)
        except (RecordDecodeError, RecordSignatureError) as e:
            return e.reason
        except Exception:  # the receive path never raises
            logger.debug("unexpected decode failure", exc_info=True)
            return "malformed"
        if not isinstance(got, Envelope):  # a reason, or a hook that broke its contract
            return got if isinstance(got, str) else "invalid_record"
        env = got
        if env.swarm != self.swarm:
            return "wrong_swarm"
        now = self.now_window()
        if env.window > now + self.protocol.max_future_windows:
            return "future"
        if env.window < now - self.expiration_windows:
            return "stale"
        evicted = self.store.add(env.window, digest_of(data), data)
        if evicted:
            self.counters.drop("store_evicted", evicted)
        self.counters.stat("accepted")
        return None
