"""The swarm's GossipSub topic and sync protocol on the wire, shared by both network transports (SPEC 7.3, 7.6).

A libp2p-transport node (py-libp2p) and a hivemind-transport node (go-libp2p inside p2pd) meet on one topic and one
request/response protocol, so a record crosses from one to the other as the same bytes:

* :func:`gossip_topic` -- ``{prefix}/{swarm}/records/1``;
* message data -- :data:`TAG_RECORD` ``|| record`` or :data:`TAG_ANNOUNCE` ``|| announcement`` (:func:`record_frame`,
  :func:`parse_frame`);
* the sync protocol :data:`SYNC_PROTOCOL`: varint-length-prefixed frames (:func:`frame`, :func:`read_frame`), a
  ``have``/``get``/``peers`` request per stream, answered by :func:`answer` from a record store;
* signed peer advertisements made and checked without libp2p (:func:`make_ad`, :func:`ad_signer_ok`).

Pure: no libp2p, no hivemind, no trio (asyncio streams only in :func:`read_frame`). Knows nothing about what a record
means (the edge validator decides) nor about how a transport dials, subscribes or schedules.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Protocol

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.version import format_version

SYNC_PROTOCOL = "/rl-swarm/sync/1.0.0"
#: Gossip message tags (the first byte of a message's data).
TAG_RECORD = 0x01
TAG_ANNOUNCE = 0x02
#: Records up to this size travel inside the gossip message (the whole pubsub frame must stay below the 1 MiB both
#: py-libp2p and go-libp2p pubsub accept).
INLINE_MAX_BYTES = 900_000
#: Largest sync request accepted (a request names windows, digests or one advertisement only).
MAX_REQUEST_BYTES = 64 * 1024
#: Most digests one ``get`` request may name, and most (window, digest) pairs one ``have`` reply may list.
MAX_GET = 32
MAX_HAVE = 8192
#: Most windows one ``have`` request may name.
MAX_WINDOWS = 64
#: Most advertisements one ``peers`` reply may hold, and the largest advertisement.
MAX_PX = 16
MAX_AD_BYTES = 2048
AD_DOMAIN = b"rl-swarm/peer-ad/v1\x00"
#: The libp2p peer id of an Ed25519 key is this prefix (identity multihash of the protobuf public key) + the key.
ED25519_PEER_ID_PREFIX = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])


def gossip_topic(prefix: str, swarm: str) -> str:
    """The GossipSub topic of a swarm."""
    return f"{prefix}/{swarm}/records/1"


def _packb(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def record_frame(record: bytes, *, digest: bytes, window: int, inline_max: int = INLINE_MAX_BYTES) -> bytes:
    """The gossip message data for ``record``: inline, or an announcement when it is larger than ``inline_max``."""
    if len(record) <= inline_max:
        return bytes([TAG_RECORD]) + record
    return bytes([TAG_ANNOUNCE]) + _packb({"digest": digest, "size": len(record), "window": window})


def parse_frame(data: bytes) -> tuple[int, Any]:
    """``(TAG_RECORD, record bytes)`` or ``(TAG_ANNOUNCE, (digest, size))``; ValueError with a counting reason
    (``malformed``, ``malformed_announce``) otherwise."""
    if not data:
        raise ValueError("malformed")
    tag, body = data[0], bytes(data[1:])
    if tag == TAG_RECORD:
        return tag, body
    if tag != TAG_ANNOUNCE:
        raise ValueError("malformed")
    try:
        ann = msgpack.unpackb(body, raw=False, max_bin_len=64, max_str_len=64, max_array_len=0, max_map_len=8)
        digest, size = ann["digest"], ann["size"]
    except Exception:
        raise ValueError("malformed_announce") from None
    if not (isinstance(digest, bytes) and len(digest) == 32 and isinstance(size, int)):
        raise ValueError("malformed_announce")
    return tag, (digest, size)


def varint(n: int) -> bytes:
    """Unsigned LEB128 (multiformats unsigned-varint)."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def frame(data: bytes) -> bytes:
    """One sync-protocol frame: the varint length, then the bytes."""
    return varint(len(data)) + data


class FrameTooLarge(ValueError):
    """A frame longer than the reader accepts (a peer with a larger ``max_record_bytes`` serving a record)."""


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    """Read one frame of at most ``limit`` bytes from an asyncio stream; :class:`FrameTooLarge` if it is longer."""
    n, shift = 0, 0
    while True:
        b = (await reader.readexactly(1))[0]
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
        if shift > 63:
            raise ValueError("varint too long")
    if n > limit:
        raise FrameTooLarge(f"frame of {n} bytes exceeds {limit}")
    return await reader.readexactly(n) if n else b""


class RecordsHeld(Protocol):
    """What :func:`answer` reads (``protocol.transport.libp2p.store.RecordStore``)."""

    def inventory(self, windows: Sequence[int], limit: int) -> list[tuple[int, bytes]]: ...

    def get(self, digest: bytes) -> bytes | None: ...


def parse_request(raw: bytes) -> dict[str, Any]:
    """Decode a sync request; ValueError if it is no map with an ``op``."""
    req = msgpack.unpackb(raw, raw=False, max_bin_len=MAX_AD_BYTES, max_array_len=MAX_HAVE, max_map_len=4)
    if not isinstance(req, dict) or not isinstance(req.get("op"), str):
        raise ValueError("not a sync request")
    return req


def answer(req: dict[str, Any], store: RecordsHeld, on_peers: Callable[[Any], list[bytes]]) -> list[bytes] | None:
    """The reply frames' payloads for a decoded request (``get``: the records then ``b""``), None for an unknown op."""
    op = req["op"]
    if op == "have":
        windows = [w for w in (req.get("windows") or [])[:MAX_WINDOWS] if isinstance(w, int)]
        return [_packb([[w, d] for w, d in store.inventory(windows, MAX_HAVE)])]
    if op == "get":
        out = []
        for d in (req.get("digests") or [])[:MAX_GET]:
            data = store.get(d) if isinstance(d, bytes) else None
            if data is not None:
                out.append(data)
        return [*out, b""]
    if op == "peers":
        return [_packb(on_peers(req.get("ad"))[:MAX_PX])]
    return None


#: Digests a sync client remembers as too large to fetch (oldest forgotten first).
MAX_TOO_LARGE = 4096


async def get_in_parts(
    get: Callable[[list[bytes]], Awaitable[list[bytes]]],
    digests: list[bytes],
    too_large: OrderedDict[bytes, None],
    on_too_large: Callable[[], None],
    oversize: type[BaseException],
) -> list[bytes]:
    """``get(digests)``, where a batch that holds a record over our cap (a peer with a larger cap holds it; ``get``
    raises ``oversize``) is asked again one record at a time; that record is remembered in ``too_large`` (at most
    :data:`MAX_TOO_LARGE`) and ``on_too_large`` counts it, so one record we cannot take does not fail every later sync
    with that peer (SPEC 7.3). Neither asyncio nor trio: each transport's client passes its own ``get`` (with its
    timeout) and its own oversize error."""
    try:
        return await get(digests)
    except oversize:
        if len(digests) == 1:
            on_too_large()
            too_large[digests[0]] = None
            while len(too_large) > MAX_TOO_LARGE:
                too_large.popitem(last=False)
            return []
    out: list[bytes] = []
    for d in digests:
        out += await get_in_parts(get, [d], too_large, on_too_large, oversize)
    return out


def parse_have(raw: bytes) -> list[bytes]:
    """The digests a ``have`` reply lists (malformed items skipped)."""
    inv = msgpack.unpackb(raw, raw=False, max_bin_len=64, max_array_len=MAX_HAVE)
    out = []
    for item in inv if isinstance(inv, list) else []:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[1], bytes) and len(item[1]) == 32:
            out.append(item[1])
    return out


def make_ad(
    seed: bytes, peer_id: bytes, *, swarm: str, addrs: Collection[str], version: tuple[int, int], now: float
) -> bytes:
    """A signed peer advertisement (SPEC 7.3) of the host whose Ed25519 seed is ``seed`` and libp2p id
    ``peer_id`` (bytes), listening at ``addrs`` (each ending in ``/p2p/<id>``)."""
    fields = {"addrs": list(addrs)[:8], "peer": peer_id, "swarm": swarm, "time": int(now)}
    body = _packb({**fields, "version": format_version(version)})
    return _packb({"body": body, "sig": Ed25519PrivateKey.from_private_bytes(seed).sign(AD_DOMAIN + body)})


def ad_signer_ok(raw: Any, swarm: str) -> bytes | None:
    """The peer id bytes of an Ed25519-signed advertisement of ``swarm`` whose signature verifies, else None.

    A relay's check before it keeps an advertisement to pass on (receivers run the full check of SPEC 7.3)."""
    if not isinstance(raw, bytes) or len(raw) > MAX_AD_BYTES:
        return None
    try:
        outer = msgpack.unpackb(raw, raw=False, max_bin_len=MAX_AD_BYTES, max_str_len=64, max_map_len=2)
        body, sig = outer["body"], outer["sig"]
        m = msgpack.unpackb(body, raw=False, max_bin_len=64, max_str_len=200, max_array_len=8, max_map_len=16)
        peer = m["peer"]
        if m["swarm"] != swarm or not isinstance(peer, bytes) or not peer.startswith(ED25519_PEER_ID_PREFIX):
            return None
        if len(peer) != len(ED25519_PEER_ID_PREFIX) + 32:
            return None
        Ed25519PublicKey.from_public_bytes(peer[len(ED25519_PEER_ID_PREFIX) :]).verify(sig, AD_DOMAIN + body)
    except (InvalidSignature, Exception):
        return None
    return bytes(peer)
