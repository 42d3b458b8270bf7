"""Fault-injecting transport wrappers for tests and the simulator; each wraps any Transport and they compose.

``Drop(Duplicate(Tamper(MemoryTransport(...))))`` is a valid transport. Wrappers around a node's own
transport model the network mistreating it (drop, delay, duplicate, tamper) or the node being an adversary
(replay, flood, forge). Randomness comes from a seeded ``random.Random`` per wrapper, so runs are
reproducible given the seeds and the order of calls.

Knows nothing about validation: it produces the bad traffic that ``protocol.validation`` must reject. Only
:class:`Forge` and :class:`Replay` look inside records, through ``protocol.records``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal

from protocol.codec import strict_unpackb
from protocol.identity import Identity, peer_id_from_public
from protocol.layout import IndexWriter
from protocol.records import decode_record, record_digest, sign_body
from protocol.transport.base import RecordCheck, Transport

logger = logging.getLogger(__name__)


class TransportWrapper(Transport):
    """Delegates everything to ``inner``; subclasses override what they distort."""

    #: Lists the extra or rewritten records a hostile wrapper publishes in its own signed index entry (a sharded
    #: transport keeps only listed records; an attacker can list anything under its own identity, never under
    #: somebody else's). Set it with :meth:`list_as`.
    lister: IndexWriter | None = None

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    def list_as(self, writer: IndexWriter) -> TransportWrapper:
        """List what this wrapper injects in ``writer``'s index entries (and its inner wrappers' too); pass the
        attacker's channel's own writer (``Channel.index_writer``) so one entry lists everything it published."""
        self.lister = writer
        if isinstance(self.inner, TransportWrapper):
            self.inner.list_as(writer)
        return self

    async def _inject(self, data: bytes, *, window: int, sender: str, replaces: bytes | None = None) -> None:
        """Publish bytes this wrapper made up or rewrote (``replaces``: the record it rewrote, which the channel
        listed but will never be stored): listed under the attacker's identity if it has one."""
        if self.lister is not None:
            if replaces is not None:
                self.lister.discard(replaces, window)
            index = self.lister.add(data, window)
            await self.inner.publish(data, window=window, sender=self.lister.identity.peer_id, index=index)
        else:
            await self.inner.publish(data, window=window, sender=sender)

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        await self.inner.publish(data, window=window, sender=sender, index=index)

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        return await self.inner.fetch_recent(windows, prefer=prefer)

    def rejections(self) -> dict[str, int]:
        return self.inner.rejections()

    def stats(self) -> dict[str, float]:
        return self.inner.stats()

    async def peers(self) -> list[str]:
        return await self.inner.peers()

    def addresses(self) -> list[str]:
        return self.inner.addresses()

    async def close(self) -> None:
        await self.inner.close()

    def set_record_validator(self, validate: RecordCheck | None) -> None:
        self.inner.set_record_validator(validate)

    @property
    def record_validator(self) -> RecordCheck | None:
        return self.inner.record_validator


class Drop(TransportWrapper):
    """Silently drop outgoing records with probability ``publish`` and fetched ones with probability ``fetch``."""

    def __init__(self, inner: Transport, *, publish: float = 0.0, fetch: float = 0.0, seed: int = 0) -> None:
        super().__init__(inner)
        self.p_publish, self.p_fetch = publish, fetch
        self.rng = random.Random(seed)
        self.dropped = 0

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        if self.rng.random() < self.p_publish:
            self.dropped += 1
            return
        await self.inner.publish(data, window=window, sender=sender, index=index)

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        out = []
        for data in await self.inner.fetch_recent(windows, prefer=prefer):
            if self.rng.random() < self.p_fetch:
                self.dropped += 1
            else:
                out.append(data)
        return out


class Delay(TransportWrapper):
    """Slow publishes down by ``publish_s`` (real sleep) and hide fetched records until ``fetch_s`` after this
    wrapper first saw them (measured on ``clock``, so tests can drive it)."""

    def __init__(
        self,
        inner: Transport,
        *,
        publish_s: float = 0.0,
        fetch_s: float = 0.0,
        clock: Callable[[], float] = time.time,
        max_tracked: int = 100_000,
    ) -> None:
        super().__init__(inner)
        self.publish_s, self.fetch_s, self.clock = publish_s, fetch_s, clock
        self.max_tracked = max_tracked
        self._first_seen: dict[bytes, float] = {}

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        if self.publish_s > 0:
            await asyncio.sleep(self.publish_s)
        await self.inner.publish(data, window=window, sender=sender, index=index)

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        now = self.clock()
        out = []
        for data in await self.inner.fetch_recent(windows, prefer=prefer):
            first = self._first_seen.setdefault(record_digest(data), now)
            if now >= first + self.fetch_s:
                out.append(data)
        if len(self._first_seen) > self.max_tracked:
            self._first_seen.clear()
        return out


class Duplicate(TransportWrapper):
    """Publish each record twice with probability ``publish``; return fetched records twice with ``fetch``."""

    def __init__(self, inner: Transport, *, publish: float = 0.0, fetch: float = 1.0, seed: int = 0) -> None:
        super().__init__(inner)
        self.p_publish, self.p_fetch = publish, fetch
        self.rng = random.Random(seed)

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        await self.inner.publish(data, window=window, sender=sender, index=index)
        if self.rng.random() < self.p_publish:
            await self.inner.publish(data, window=window, sender=sender, index=index)

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        out = []
        for data in await self.inner.fetch_recent(windows, prefer=prefer):
            out.append(data)
            if self.rng.random() < self.p_fetch:
                out.append(data)
        return out


def flip_bits(data: bytes, rng: random.Random, flips: int = 1) -> bytes:
    """``data`` with ``flips`` random bits inverted (at least one byte changes for non-empty data)."""
    buf = bytearray(data)
    for _ in range(flips if buf else 0):
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf)


class Tamper(TransportWrapper):
    """Flip ``flips`` random bits in records with probability ``p``, on the way out and/or on the way in."""

    def __init__(
        self,
        inner: Transport,
        *,
        p: float = 1.0,
        flips: int = 1,
        direction: Literal["publish", "fetch", "both"] = "publish",
        seed: int = 0,
    ) -> None:
        super().__init__(inner)
        self.p, self.flips, self.direction = p, flips, direction
        self.rng = random.Random(seed)
        self.tampered = 0

    def _maybe(self, data: bytes) -> bytes:
        if self.rng.random() < self.p:
            self.tampered += 1
            return flip_bits(data, self.rng, self.flips)
        return data

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        if self.direction in ("publish", "both"):
            changed = self._maybe(data)
            if changed != data:
                await self._inject(changed, window=window, sender=sender, replaces=data)
                return
        await self.inner.publish(data, window=window, sender=sender, index=index)

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        got = await self.inner.fetch_recent(windows, prefer=prefer)
        if self.direction in ("fetch", "both"):
            got = [self._maybe(d) for d in got]
        return got


class Replay(TransportWrapper):
    """An adversary re-publishing old records: with each publish, also re-publish ``copies`` records drawn from
    what it published and fetched before, under the *current* window key and their original sender."""

    def __init__(self, inner: Transport, *, p: float = 1.0, copies: int = 1, history: int = 256, seed: int = 0) -> None:
        super().__init__(inner)
        self.p, self.copies = p, copies
        self.rng = random.Random(seed)
        self._history: deque[tuple[bytes, str]] = deque(maxlen=history)
        self.replayed = 0

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        old = list(self._history)
        await self.inner.publish(data, window=window, sender=sender, index=index)
        if old and self.rng.random() < self.p:
            for _ in range(self.copies):
                stale, who = self.rng.choice(old)
                await self._inject(stale, window=window, sender=who)
                self.replayed += 1
        self._history.append((data, sender))

    async def fetch_recent(self, windows: Sequence[int], *, prefer: Collection[str] = ()) -> list[bytes]:
        got = await self.inner.fetch_recent(windows, prefer=prefer)
        known = {d for d, _ in self._history}
        for data in got:
            if data not in known:
                try:
                    self._history.append((data, decode_record(data).sender))
                    known.add(data)
                except Exception:
                    pass  # not a valid record: nothing worth replaying
        return got


class Flood(TransportWrapper):
    """An adversary flooding the network: with each publish, also publish ``copies`` extra records made by
    ``make(i)`` (default: ``size`` random bytes) under the same window and sender."""

    def __init__(
        self,
        inner: Transport,
        *,
        copies: int = 10,
        make: Callable[[int], bytes] | None = None,
        size: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__(inner)
        self.copies = copies
        self.rng = random.Random(seed)
        self.make = make or (lambda i: self.rng.randbytes(size))
        self.flooded = 0

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        await self.inner.publish(data, window=window, sender=sender, index=index)
        for _ in range(self.copies):
            await self._inject(self.make(self.flooded), window=window, sender=sender)
            self.flooded += 1


ForgeMode = Literal["impersonate", "claim", "reward"]


class Forge(TransportWrapper):
    """An adversary rewriting its outgoing records (which its own channel signed) before they leave.

    * ``impersonate``: claim ``victim``'s public key and peer id, sign with ``forger`` -> ``bad_signature``;
    * ``claim``: keep ``forger``'s public key but name ``victim`` as sender -> ``sender_mismatch``;
    * ``reward``: set every completion's ``reward_hint`` to ``reward`` and re-sign as ``forger`` -> a valid
      record with lying rewards (receivers must re-score; the protocol cannot tell).

    Impersonating records are stored under the victim's sender subkey.
    """

    def __init__(
        self,
        inner: Transport,
        *,
        forger: Identity,
        mode: ForgeMode = "impersonate",
        victim: bytes | None = None,
        reward: float = 1.0,
        p: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(inner)
        if mode in ("impersonate", "claim") and victim is None:
            raise ValueError(f"forge mode {mode!r} needs the victim's public key bytes")
        self.forger, self.mode, self.victim, self.reward, self.p = forger, mode, victim, reward, p
        self.rng = random.Random(seed)
        self.forged = 0

    def forge(self, data: bytes) -> tuple[bytes, str]:
        """The forged record bytes and the sender subkey to store them under."""
        body: dict[str, Any] = strict_unpackb(strict_unpackb(data)["body"])
        if self.mode == "reward":
            for group in body["payload"].get("groups", []):
                for comp in group["completions"]:
                    comp["reward_hint"] = float(self.reward)
            body["public_key"] = self.forger.public_bytes
            body["sender"] = self.forger.peer_id
        else:
            assert self.victim is not None
            body["sender"] = peer_id_from_public(self.victim)
            if self.mode == "impersonate":
                body["public_key"] = bytes(self.victim)
        return sign_body(self.forger, body), body["sender"]

    async def publish(self, data: bytes, *, window: int, sender: str, index: bytes | None = None) -> None:
        if self.rng.random() < self.p:
            try:
                forged, who = self.forge(data)
                self.forged += 1
            except Exception:
                logger.debug("forge: could not rewrite a record; sending it unchanged", exc_info=True)
            else:
                if self.lister is not None and who == self.lister.identity.peer_id:
                    await self._inject(forged, window=window, sender=who, replaces=data)
                else:  # nobody can sign the victim's index entry: the record goes out unlisted
                    await self.inner.publish(forged, window=window, sender=who)
                return
        await self.inner.publish(data, window=window, sender=sender, index=index)
