"""Signed peer advertisements and the bounded table of peers a node knows, for peer exchange over the sync protocol.

An advertisement says "host PEER listens at ADDRS and speaks protocol VERSION in SWARM, as of TIME", signed with
that host's libp2p Ed25519 key (the key its peer id is derived from, so the id alone verifies it). Because it is
self-signed, an advertisement relayed by a third peer cannot be altered or forged: a lying relay can only withhold
advertisements or pass along those of its own sybil identities (see ``protocol/SPEC.md`` 7.3 and 11). Every
address must end in ``/p2p/PEER``, so dialling it authenticates the host it names.

Wire form: the canonical MessagePack map ``{body: bin, sig: bin(64)}``; ``body`` is the canonical map
``{addrs: [str], peer: bin, swarm: str, time: int, version: str}`` and ``sig`` signs
``"rl-swarm/peer-ad/v1" || 0x00 || body``. At most :data:`MAX_AD_BYTES`.

Knows nothing about how advertisements travel or when to dial.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import msgpack
from libp2p.peer.id import ID

from protocol.version import format_version, parse_version

AD_DOMAIN = b"rl-swarm/peer-ad/v1\x00"
MAX_AD_BYTES = 2048
MAX_AD_ADDRS = 8
MAX_ADDR_CHARS = 200
#: Seconds an advertisement may be ahead of our clock (clock skew).
MAX_AD_FUTURE_S = 60


@dataclass(frozen=True)
class PeerAd:
    """A verified advertisement."""

    peer: str  # base58 libp2p peer id
    addrs: tuple[str, ...]
    version: tuple[int, int]
    time: int
    raw: bytes


class AdError(ValueError):
    """An advertisement is malformed, mis-signed, of another swarm, or stale; ``reason`` names which."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _packb(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def make_ad(
    key_pair: Any, peer: ID, *, swarm: str, addrs: Collection[str], version: tuple[int, int], now: float
) -> bytes:
    """Sign an advertisement of ``peer`` (whose key pair is ``key_pair``) listening at ``addrs``."""
    suffix = f"/p2p/{peer.to_base58()}"
    full = [a if a.endswith(suffix) else a + suffix for a in addrs][:MAX_AD_ADDRS]
    body = _packb(
        {"addrs": full, "peer": peer.to_bytes(), "swarm": swarm, "time": int(now), "version": format_version(version)}
    )
    return _packb({"body": body, "sig": key_pair.private_key.sign(AD_DOMAIN + body)})


def verify_ad(raw: bytes, *, swarm: str, now: float, ttl_s: float) -> PeerAd:
    """Decode and verify an advertisement; :class:`AdError` with a reason if it must be ignored.

    The version is returned as claimed, compatible or not: deciding what to do with another major is the caller's.
    """
    if not isinstance(raw, bytes) or len(raw) > MAX_AD_BYTES:
        raise AdError("ad_malformed", "not bytes or too long")
    try:
        outer = msgpack.unpackb(raw, raw=False, max_bin_len=MAX_AD_BYTES, max_str_len=64, max_map_len=2)
        body, sig = outer["body"], outer["sig"]
        m = msgpack.unpackb(
            body, raw=False, max_bin_len=64, max_str_len=MAX_ADDR_CHARS, max_array_len=MAX_AD_ADDRS, max_map_len=16
        )
        peer_bytes, addrs, ad_swarm, t, version = m["peer"], m["addrs"], m["swarm"], m["time"], m["version"]
        if not (isinstance(body, bytes) and isinstance(sig, bytes) and len(sig) == 64 and isinstance(t, int)):
            raise ValueError("field types")
        if not (isinstance(peer_bytes, bytes) and isinstance(ad_swarm, str) and isinstance(version, str)):
            raise ValueError("field types")
        if not (isinstance(addrs, list) and all(isinstance(a, str) for a in addrs)):
            raise ValueError("addrs")
        ver = parse_version(version)
        peer = ID(peer_bytes)
        key = peer.extract_public_key()
    except AdError:
        raise
    except Exception as e:
        raise AdError("ad_malformed", f"{e.__class__.__name__}: {e}") from None
    if key is None or not key.verify(AD_DOMAIN + body, sig):
        raise AdError("ad_bad_signature")
    if ad_swarm != swarm:
        raise AdError("ad_wrong_swarm")
    if t > now + MAX_AD_FUTURE_S or t < now - ttl_s:
        raise AdError("ad_stale")
    b58 = peer.to_base58()
    if not addrs or not all(a.startswith("/") and a.endswith(f"/p2p/{b58}") and a.count("/p2p/") == 1 for a in addrs):
        raise AdError("ad_malformed", "addresses must end in /p2p/<its peer id>")
    return PeerAd(peer=b58, addrs=tuple(addrs), version=ver, time=t, raw=raw)


class PeerTable:
    """Fresh advertisements of compatible peers we know, newest per peer, at most ``capacity`` (oldest out first).

    Not thread safe: the transport's trio thread owns it.
    """

    def __init__(self, capacity: int, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.clock = clock
        self._ads: OrderedDict[str, PeerAd] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ads)

    def __contains__(self, peer: str) -> bool:
        return peer in self._ads

    def add(self, ad: PeerAd) -> bool:
        """Keep ``ad`` if it is newer than what we hold for its peer; True if it was new or newer."""
        old = self._ads.get(ad.peer)
        if old is not None and old.time >= ad.time:
            return False
        self._ads.pop(ad.peer, None)
        self._ads[ad.peer] = ad
        while len(self._ads) > self.capacity:
            self._ads.popitem(last=False)
        return True

    def forget(self, peer: str) -> None:
        self._ads.pop(peer, None)

    def prune(self) -> None:
        horizon = self.clock() - self.ttl_s
        for peer in [p for p, ad in self._ads.items() if ad.time < horizon]:
            del self._ads[peer]

    def sample(self, k: int, exclude: Collection[str] = (), rng: random.Random | None = None) -> list[PeerAd]:
        """Up to ``k`` fresh advertisements chosen uniformly at random, none of a peer in ``exclude``."""
        self.prune()
        pool = [ad for p, ad in self._ads.items() if p not in exclude]
        return (rng or random).sample(pool, min(k, len(pool)))
