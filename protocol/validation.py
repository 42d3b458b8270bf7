"""The receive path's checks on raw record bytes, in order, each rejection counted by reason.

Order: size cap (before any decoding), decode + envelope schema, signature, swarm id, time window (far
future / stale), replay of (sender, seq), per-sender quota per window. :meth:`RecordValidator.check` never
raises, whatever the input: bad peer data is dropped, counted and logged at debug level.

Decoded once per process: the stateless part (size, decode, schema, signature, swarm) is remembered by the
record's digest (:meth:`RecordValidator.verdict`), so the transport's edge check (a DHT store guard, the libp2p
edge validator, installed as the transport's ``RecordCheck``) and the channel's receive check (:meth:`check`)
share one decode and one signature verification of each record; the window is re-checked at each use.

Pure and synchronous: the only inputs are the bytes and the injected clock. Knows nothing about transports,
about what payloads mean (trust, re-scoring and sampling belong to ``swarm/``), or about our own identity.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from protocol.codec import DECODE_REASONS, SIGNATURE_REASONS, RecordDecodeError, RecordSignatureError
from protocol.records import decode_record, window_of
from protocol.types import Envelope

if TYPE_CHECKING:
    from protocol.transport.config import ProtocolConfig

logger = logging.getLogger(__name__)

#: Record bytes whose verdicts are remembered (LRU): a transport's edge check and the channel see a record within one
#: poll, so a few dozen records' worth of decoded envelopes is all the sharing needs.
VERDICT_CACHE_BYTES = 32 * 2**20
#: Verdicts remembered at most, whatever their size: a decoded record's Python objects (its groups, completions,
#: task refs) cost ~2.9 KB for the soak's small records (tracemalloc), so the byte cap alone let 65,536 of them stay.
VERDICT_CACHE_ENTRIES = 4096

#: Every reason :meth:`RecordValidator.check` may count, in check order.
REJECT_REASONS = (*DECODE_REASONS, *SIGNATURE_REASONS, "wrong_swarm", "future", "stale", "replay", "quota")


def _offset_clock(offset: float) -> Callable[[], float]:
    """The system clock plus ``offset`` seconds."""
    return lambda: time.time() + offset


class RecordValidator:
    """Stateful receive-path checks for one swarm; memory is bounded by the acceptance horizon and a cap."""

    def __init__(
        self,
        swarm_id: str,
        window_seconds: float,
        max_bytes: int,
        max_future_windows: int,
        max_past_windows: int,
        quota_per_window: int,
        clock: Callable[[], float] = time.time,
        replay_capacity: int = 200_000,
    ) -> None:
        if window_seconds <= 0 or max_bytes <= 0 or quota_per_window < 1 or replay_capacity < 1:
            raise ValueError("window_seconds, max_bytes, quota_per_window and replay_capacity must be positive")
        if max_future_windows < 0 or max_past_windows < 0:
            raise ValueError("max_future_windows and max_past_windows must be >= 0")
        self.swarm_id = swarm_id
        self.window_seconds = window_seconds
        self.max_bytes = max_bytes
        self.max_future_windows = max_future_windows
        self.max_past_windows = max_past_windows
        self.quota_per_window = quota_per_window
        self.replay_capacity = replay_capacity
        self.clock = clock
        self.accepted = 0
        self.rejected: dict[str, int] = dict.fromkeys(REJECT_REASONS, 0)
        # record window -> {(sender, seq)}; windows leave once they fall behind the acceptance horizon.
        self._seen: dict[int, set[tuple[str, int]]] = {}
        self._n_seen = 0
        # record window -> sender -> records accepted; pruned together with _seen.
        self._counts: dict[int, dict[str, int]] = {}
        # record digest -> (envelope or rejection reason, detail, size): the stateless verdict, shared by the
        # transport's edge check (another thread, for a DHT) and the receive check.
        self._verdicts: OrderedDict[bytes, tuple[Envelope | str, str, int]] = OrderedDict()
        self._verdict_bytes = 0
        # record window -> digests of the envelopes remembered from it: a verdict leaves once its record's window
        # falls behind the acceptance horizon (it could only be refused as stale then); refusals keep no window.
        self._verdict_windows: dict[int, set[bytes]] = {}
        self._verdict_lock = threading.Lock()

    @classmethod
    def from_config(
        cls, swarm_id: str, config: ProtocolConfig, clock: Callable[[], float] = time.time
    ) -> RecordValidator:
        """A validator with the limits of a :class:`~protocol.transport.config.ProtocolConfig`; the system clock
        is shifted by ``config.clock_offset_s`` (a deliberately skewed test peer)."""
        offset = getattr(config, "clock_offset_s", 0.0)
        if offset and clock is time.time:
            clock = _offset_clock(offset)
        return cls(
            swarm_id,
            window_seconds=config.window_seconds,
            max_bytes=config.max_record_bytes,
            max_future_windows=config.max_future_windows,
            max_past_windows=config.max_past_windows,
            quota_per_window=config.quota_per_window,
            clock=clock,
            replay_capacity=config.replay_capacity,
        )

    def current_window(self) -> int:
        """The window our clock is in now."""
        return window_of(self.clock(), self.window_seconds)

    # -- checks ------------------------------------------------------------------------------------------

    def _reject(self, reason: str, detail: str = "") -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        logger.debug("rejected record: %s %s", reason, detail)

    def _decoded(self, data: bytes, digest: bytes | None, now_window: int) -> tuple[Envelope | str, str]:
        """Decode, schema, signature and swarm, once per record digest: ``(envelope, "")`` or ``(reason, detail)``.
        An envelope whose window is already behind the acceptance horizon is not remembered."""
        key = digest if digest is not None else hashlib.sha256(data).digest()
        horizon = now_window - self.max_past_windows
        with self._verdict_lock:
            self._forget_verdicts_before(horizon)
            hit = self._verdicts.get(key)
            if hit is not None:
                self._verdicts.move_to_end(key)
                return hit[0], hit[1]
        verdict: Envelope | str
        try:
            verdict, detail = decode_record(data, self.max_bytes), ""
        except (RecordDecodeError, RecordSignatureError) as e:
            verdict, detail = e.reason, str(e)
        if isinstance(verdict, Envelope) and verdict.swarm != self.swarm_id:
            detail = verdict.swarm[:64]
            verdict = "wrong_swarm"
        size = len(data) if isinstance(verdict, Envelope) else 0  # a refusal keeps no bytes alive
        if isinstance(verdict, Envelope) and verdict.window < horizon:
            return verdict, detail  # stale: refused by the window check, nothing to share
        with self._verdict_lock:
            if key not in self._verdicts:
                self._verdicts[key] = (verdict, detail, size)
                self._verdict_bytes += size
                if isinstance(verdict, Envelope):
                    self._verdict_windows.setdefault(verdict.window, set()).add(key)
                while self._verdict_bytes > VERDICT_CACHE_BYTES or len(self._verdicts) > VERDICT_CACHE_ENTRIES:
                    self._forget_verdict(*self._verdicts.popitem(last=False))
        return verdict, detail

    def _forget_verdict(self, key: bytes, entry: tuple[Envelope | str, str, int]) -> None:
        """Account for a verdict that left the cache (called with the lock held)."""
        self._verdict_bytes -= entry[2]
        if isinstance(entry[0], Envelope):
            keys = self._verdict_windows.get(entry[0].window)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._verdict_windows[entry[0].window]

    def _forget_verdicts_before(self, horizon: int) -> None:
        """Drop the verdicts of records whose window is behind ``horizon`` (called with the lock held)."""
        for window in [w for w in self._verdict_windows if w < horizon]:
            for key in self._verdict_windows.pop(window):
                entry = self._verdicts.pop(key, None)
                if entry is not None:
                    self._verdict_bytes -= entry[2]

    def _stateless(self, data: Any, now_window: int, digest: bytes | None = None) -> tuple[Envelope | None, str, str]:
        """Size, decode, signature, swarm and window checks: (envelope, "", "") or (None, reason, detail)."""
        try:
            size = len(data)
        except TypeError:
            return None, "malformed", f"not bytes: {type(data).__name__}"
        if size > self.max_bytes:
            return None, "oversize", f"{size} bytes"
        if isinstance(data, bytearray | memoryview):
            data = bytes(data)
        elif not isinstance(data, bytes):
            return None, "malformed", f"not bytes: {type(data).__name__}"
        env, detail = self._decoded(data, digest, now_window)
        if isinstance(env, str):
            return None, env, detail
        if env.window > now_window + self.max_future_windows:
            return None, "future", f"window {env.window} > {now_window}"
        if env.window < now_window - self.max_past_windows:
            return None, "stale", f"window {env.window} < {now_window}"
        return env, "", ""

    def check(self, data: bytes, digest: bytes | None = None) -> Envelope | None:
        """The envelope if ``data`` passes every check (and is then remembered for replay and quota), else None.

        ``digest``: SHA-256 of ``data`` if the caller has it (the channel dedups by it), to skip hashing again."""
        try:
            now_window = self.current_window()
            self._prune(now_window)
            env, reason, detail = self._stateless(data, now_window, digest)
            if env is None:
                self._reject(reason, detail)
                return None
            key = (env.sender, env.seq)
            if any(key in seen for seen in self._seen.values()):
                self._reject("replay", f"{env.sender[:8]} seq {env.seq}")
                return None
            counts = self._counts.setdefault(env.window, {})
            if counts.get(env.sender, 0) >= self.quota_per_window:
                self._reject("quota", f"{env.sender[:8]} window {env.window}")
                return None
            counts[env.sender] = counts.get(env.sender, 0) + 1
            self._remember(env.window, key)
            self.accepted += 1
            return env
        except Exception as e:  # the receive path never raises: whatever slipped through is bad input
            self._reject("malformed", f"unexpected {e.__class__.__name__}: {e}")
            logger.debug("unexpected error while validating a record", exc_info=True)
            return None

    def verdict(self, data: bytes) -> Envelope | str:
        """Stateless subset of :meth:`check` (size, decode, signature, swarm, window) for a transport's edge check:
        the verified envelope, or the reason to refuse. Counts nothing and never raises; replay and quota are not
        checked (they need receive-side state). The decode is shared with :meth:`check` (module docstring)."""
        try:
            env, reason, _ = self._stateless(data, self.current_window())
        except Exception:  # the edge never raises: whatever slipped through is bad input
            logger.debug("unexpected error in the edge check", exc_info=True)
            return "malformed"
        return env if env is not None else reason

    def is_storable(self, data: bytes) -> bool:
        """Whether :meth:`verdict` accepts ``data``."""
        return isinstance(self.verdict(data), Envelope)

    # -- bounded memory ---------------------------------------------------------------------------------

    def _remember(self, window: int, key: tuple[str, int]) -> None:
        self._seen.setdefault(window, set()).add(key)
        self._n_seen += 1
        while self._n_seen > self.replay_capacity:
            # Over the cap only under a sybil flood: forget the oldest window whole (its records may then be
            # replayed until they go stale, which costs the attacker another flood to achieve).
            self._drop_window(min(self._seen))

    def _drop_window(self, window: int) -> None:
        self._n_seen -= len(self._seen.pop(window, ()))
        self._counts.pop(window, None)

    def _prune(self, now_window: int) -> None:
        horizon = now_window - self.max_past_windows
        for w in [w for w in self._seen if w < horizon]:
            self._drop_window(w)

    def metrics(self) -> dict[str, Any]:
        """Accepted count, rejections by reason, and how many (sender, seq) pairs are remembered."""
        return {
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "rejected_total": sum(self.rejected.values()),
            "tracked": self._n_seen,
        }
