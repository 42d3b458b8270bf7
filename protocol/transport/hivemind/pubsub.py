"""GossipSub through p2pd's own pubsub: the daemon flags, and a small client of its control socket.

hivemind's p2pd (go-libp2p-daemon) runs go-libp2p-pubsub when started with ``-pubsub`` (router ``gossipsub``; message
signing on and strict verification on by default, ``-pubsubSign``/``-pubsubSignStrict``), and its control protocol
carries ``PSRequest``/``PSMessage`` (hivemind's ``proto/p2pd.proto``), which hivemind's Python client does not wrap:

* ``SUBSCRIBE``: one control connection per subscription; the daemon answers ``Response{OK}`` and then writes one
  varint-delimited ``PSMessage`` per message of the topic (from, data, seqno, topicIDs, signature, key) for as long as
  the connection stays open; closing it unsubscribes;
* ``PUBLISH``: one request per message on a fresh connection, answered ``Response{OK}``; the daemon signs it with its
  host key (the node's identity) and publishes;
* ``LIST_PEERS``: the peers the daemon's router knows on a topic.

hivemind's ``P2P.create`` takes no pubsub arguments, so :func:`daemon_args` adds them to the p2pd command line of a
daemon started in the calling task (a context variable, so other daemons of the process are left as they are).

The daemon's router has no validation hook in this protocol: it forwards every message whose pubsub signature
verifies, before the node sees it (SPEC 7.6 states what that costs). Knows nothing about records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from hivemind.p2p import P2P
from hivemind.p2p.p2p_daemon_bindings.utils import raise_if_failed, read_pbmsg_safe, write_pbmsg
from hivemind.proto import p2pd_pb2 as pb

from protocol.transport.gossip import read_frame

logger = logging.getLogger(__name__)

#: p2pd flags for GossipSub, signing and strict verification spelled out (they are go-libp2p's defaults too).
PUBSUB_FLAGS = {"pubsub": True, "pubsubRouter": "gossipsub", "pubsubSign": True, "pubsubSignStrict": True}
#: Largest PSMessage read from the daemon (go-libp2p pubsub refuses messages over 1 MiB; fields add a little).
MAX_PSMESSAGE_BYTES = (1 << 20) + 4096

_EXTRA: ContextVar[dict[str, Any] | None] = ContextVar("p2pd_extra_args", default=None)
_installed = False


def _install() -> None:
    """Wrap ``P2P._make_process_args`` once so a daemon started under :func:`daemon_args` gets the extra flags."""
    global _installed
    if _installed:
        return
    original = P2P._make_process_args

    def make_process_args(*args: Any, **kwargs: Any) -> list[str]:
        return list(original(*args, **{**kwargs, **(_EXTRA.get() or {})}))

    P2P._make_process_args = staticmethod(make_process_args)
    _installed = True


@contextlib.contextmanager
def daemon_args(extra: dict[str, Any]) -> Iterator[None]:
    """p2pd daemons started in this task (or its children) inside the block get ``extra`` flags."""
    _install()
    token = _EXTRA.set(dict(extra))
    try:
        yield
    finally:
        _EXTRA.reset(token)


class DaemonPubsub:
    """One topic of a p2pd's pubsub: subscribe once (re-subscribing if the control connection breaks), publish,
    list the topic's peers. Runs on the loop that owns ``p2p``; ``on_message(msg)`` gets each ``PSMessage``."""

    def __init__(self, p2p: Any, topic: str, on_message: Callable[[Any], None]) -> None:
        self.p2p = p2p
        self.topic = topic
        self.on_message = on_message
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._closed = False
        self.resubscribes = 0

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self.p2p._client.control.daemon_connector.open_connection()
        return reader, writer

    async def _request(self, ps: Any) -> tuple[Any, asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self._connect()
        try:
            await write_pbmsg(writer, pb.Request(type=pb.Request.PUBSUB, pubsub=ps))
            resp = pb.Response()
            await read_pbmsg_safe(reader, resp)
            raise_if_failed(resp)
        except BaseException:
            writer.close()
            raise
        return resp, reader, writer

    async def subscribe(self) -> None:
        """Subscribe (raises if the daemon refuses, e.g. started without ``-pubsub``), then keep reading."""
        _, reader, writer = await self._request(pb.PSRequest(type=pb.PSRequest.SUBSCRIBE, topic=self.topic))
        self._writer = writer
        self._task = asyncio.get_running_loop().create_task(self._read(reader), name=f"pubsub-{self.topic}")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while not self._closed:
            try:
                raw = await read_frame(reader, MAX_PSMESSAGE_BYTES)
                msg = pb.PSMessage()
                msg.ParseFromString(raw)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the daemon closed the connection (it died or restarts) or sent junk
                if self._closed:
                    return
                logger.debug("pubsub subscription of %s broke (%s: %s); resubscribing", self.topic, type(e).__name__, e)
                again = await self._resubscribe()
                if again is None:
                    return
                reader = again
                continue
            try:
                self.on_message(msg)
            except Exception:  # the receive path never raises
                logger.debug("pubsub message handler failed", exc_info=True)

    async def _resubscribe(self) -> asyncio.StreamReader | None:
        if self._writer is not None:
            self._writer.close()
        delay = 0.5
        while not self._closed:
            await asyncio.sleep(delay)
            try:
                ps = pb.PSRequest(type=pb.PSRequest.SUBSCRIBE, topic=self.topic)
                _, reader, self._writer = await self._request(ps)
                self.resubscribes += 1
                return reader
            except Exception as e:
                logger.debug("resubscribing to %s failed: %s", self.topic, e)
                delay = min(delay * 2, 10.0)
        return None

    async def publish(self, data: bytes) -> None:
        """Publish ``data`` on the topic (the daemon signs it with its host key)."""
        ps = pb.PSRequest(type=pb.PSRequest.PUBLISH, topic=self.topic, data=bytes(data))
        _, _, writer = await self._request(ps)
        writer.close()

    async def topic_peers(self) -> list[bytes]:
        """Peer ids (bytes) the daemon's router knows on the topic."""
        resp, _, writer = await self._request(pb.PSRequest(type=pb.PSRequest.LIST_PEERS, topic=self.topic))
        writer.close()
        return [bytes(p) for p in resp.pubsub.peerIDs]

    def close(self) -> None:
        """Unsubscribe (close the control connection) and stop reading; idempotent."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        if self._writer is not None:
            self._writer.close()
