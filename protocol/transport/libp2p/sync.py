"""The sync protocol ``/rl-swarm/sync/1.0.0``: request/response streams for anti-entropy, announce-then-fetch and
peer exchange (``protocol/SPEC.md`` 7.3).

One request per stream; every frame is an unsigned-varint length prefix and that many bytes. A request is one
MessagePack map of at most :data:`MAX_REQUEST_BYTES`:

* ``{op: "have", windows: [int]}`` -> one frame, the ``[window, digest]`` pairs the server holds;
* ``{op: "get", digests: [bin(32)]}`` -> one frame per record held, then an empty frame;
* ``{op: "peers", ad: bin}`` -> one frame, an array of at most :data:`MAX_PX` signed peer advertisements (the
  server's own first); ``ad`` is the requester's own advertisement (how a server learns the listening address of
  a peer that dialled it). Added in protocol 1.1: a 1.0 server refuses it and closes the stream.

Knows nothing about records beyond their digests (the caller admits what arrives) nor about advertisements
beyond their bytes (``peers`` verifies them).
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import trio
from libp2p.io.exceptions import IncompleteReadError, MessageTooLarge
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from protocol.transport.gossip import (
    MAX_GET,
    MAX_HAVE,
    MAX_PX,
    MAX_REQUEST_BYTES,
    MAX_WINDOWS,
    SYNC_PROTOCOL,
    get_in_parts,
)
from protocol.transport.libp2p.peers import MAX_AD_BYTES
from protocol.transport.libp2p.store import Counters, RecordStore, digest_of

logger = logging.getLogger(__name__)

#: The stream failing under a request (the requester gave up or went away), as opposed to a malformed request.
STREAM_FAILURES = (StreamError, IncompleteReadError, trio.BrokenResourceError, trio.ClosedResourceError)

PeersHandler = Callable[[Any], list[bytes]]
#: Digests remembered as too large for us (listed by a peer whose ``max_record_bytes`` is larger), never asked again.


class SyncServer:
    """Answers sync requests from the record store and, for ``peers``, from ``on_peers(requester_ad)``."""

    def __init__(self, store: RecordStore, counters: Counters, timeout: float, on_peers: PeersHandler) -> None:
        self.store = store
        self.counters = counters
        self.timeout = timeout
        self.on_peers = on_peers

    async def handle(self, stream: Any) -> None:
        with trio.move_on_after(self.timeout):
            try:
                raw = await read_varint_prefixed_bytes_limited(stream, MAX_REQUEST_BYTES)
                req = msgpack.unpackb(raw, raw=False, max_bin_len=MAX_AD_BYTES, max_array_len=MAX_HAVE, max_map_len=4)
                op = req.get("op") if isinstance(req, dict) else None
                if op == "have":
                    windows = [w for w in req.get("windows", [])[:MAX_WINDOWS] if isinstance(w, int)]
                    inv = self.store.inventory(windows, MAX_HAVE)
                    reply = msgpack.packb([[w, d] for w, d in inv], use_bin_type=True)
                    await stream.write(encode_varint_prefixed(reply))
                elif op == "get":
                    for d in req.get("digests", [])[:MAX_GET]:
                        data = self.store.get(d) if isinstance(d, bytes) else None
                        if data is not None:
                            await stream.write(encode_varint_prefixed(data))
                    await stream.write(encode_varint_prefixed(b""))
                elif op == "peers":
                    ads = self.on_peers(req.get("ad"))[:MAX_PX]
                    await stream.write(encode_varint_prefixed(msgpack.packb(ads, use_bin_type=True)))
                    self.counters.stat("px_served")
                else:
                    self.counters.drop("sync_bad_request")
            except STREAM_FAILURES as e:  # not the requester's fault that we can tell: a timeout on its side
                self.counters.drop("sync_serve_failed")
                logger.debug("sync stream failed while serving: %s: %s", e.__class__.__name__, e)
            except Exception as e:  # malformed or oversized frame, bad MessagePack, fields of the wrong type
                self.counters.drop("sync_bad_request")
                logger.debug("bad sync request: %s: %s", e.__class__.__name__, e)
        with contextlib.suppress(Exception), trio.move_on_after(2):
            await stream.close()


class SyncClient:
    """Makes sync requests to connected peers; records that arrive are handed to ``admit`` (the edge validator)."""

    def __init__(
        self,
        host: Any,
        store: RecordStore,
        counters: Counters,
        *,
        max_record_bytes: int,
        timeout: float,
        admit: Callable[[bytes, bytes], str | None],
    ) -> None:
        self.host = host
        self.store = store
        self.counters = counters
        self.max_record_bytes = max_record_bytes
        self.timeout = timeout
        self.admit = admit
        self.too_large: OrderedDict[bytes, None] = OrderedDict()

    async def request(self, peer: ID, req: dict[str, Any]) -> Any:
        stream = await self.host.new_stream(peer, [SYNC_PROTOCOL])
        try:
            await stream.write(encode_varint_prefixed(msgpack.packb(req, use_bin_type=True)))
            if req["op"] == "have":
                raw = await read_varint_prefixed_bytes_limited(stream, MAX_HAVE * 48 + 16)
                return msgpack.unpackb(raw, raw=False, max_bin_len=64, max_array_len=MAX_HAVE)
            if req["op"] == "peers":
                raw = await read_varint_prefixed_bytes_limited(stream, MAX_PX * (MAX_AD_BYTES + 8) + 16)
                ads = msgpack.unpackb(raw, raw=False, max_bin_len=MAX_AD_BYTES, max_array_len=MAX_PX)
                return [a for a in ads if isinstance(a, bytes)] if isinstance(ads, list) else []
            out: list[bytes] = []
            for _ in range(len(req["digests"]) + 1):
                data = await read_varint_prefixed_bytes_limited(stream, self.max_record_bytes)
                if not data:
                    break
                out.append(bytes(data))
            return out
        finally:
            with contextlib.suppress(Exception), trio.move_on_after(2):
                await stream.close()

    async def get(self, peer: ID, digests: list[bytes]) -> list[bytes]:
        """Records by digest from ``peer`` (only those whose digest was asked for)."""
        wanted = set(digests)
        out = []
        for data in await self.request(peer, {"op": "get", "digests": digests}):
            if digest_of(data) in wanted:
                out.append(data)
            else:
                self.counters.drop("sync_unrequested")
        return out

    async def peers(self, peer: ID, own_ad: bytes) -> list[bytes]:
        """Exchange advertisements with ``peer``: send ours, get at most :data:`MAX_PX` back (unverified)."""
        with trio.fail_after(self.timeout):
            ads: list[bytes] = await self.request(peer, {"op": "peers", "ad": own_ad})
            return ads

    async def sync_from(self, peer: ID, windows: Sequence[int]) -> int:
        """Pull the records of ``windows`` that ``peer`` has and we lack; returns how many new ones passed."""
        with trio.fail_after(self.timeout):
            inv = await self.request(peer, {"op": "have", "windows": list(windows)})
        missing = []
        for item in inv if isinstance(inv, list) else []:
            ok = isinstance(item, list) and len(item) == 2 and isinstance(item[1], bytes) and len(item[1]) == 32
            if ok and not self.store.has(item[1]) and item[1] not in self.too_large:
                missing.append(item[1])
        new = 0
        for i in range(0, len(missing), MAX_GET):
            got = await self._get_batch(peer, missing[i : i + MAX_GET])
            for data in got:
                if self.admit(data, digest_of(data)) is None:
                    new += 1
        self.counters.stat("synced", new)
        return new

    async def _get_batch(self, peer: ID, digests: list[bytes]) -> list[bytes]:
        """``get`` of a batch, in parts where a record is over our ``max_record_bytes`` (:func:`get_in_parts`)."""

        async def get(ds: list[bytes]) -> list[bytes]:
            with trio.fail_after(self.timeout):
                return await self.get(peer, ds)

        return await get_in_parts(
            get, digests, self.too_large, lambda: self.counters.drop("sync_too_large"), MessageTooLarge
        )
