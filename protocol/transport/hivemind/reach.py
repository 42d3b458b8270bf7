"""Can peers dial this node? A dial-back probe over hivemind's p2p, and switching a running ``DHTNode`` between
DHT server and DHT client without restarting its daemon.

Why: a node behind NAT that acts as a DHT server is put in other peers' routing tables, becomes one of the replicas
of keys near its id, and cannot be dialled by peers it has no connection to: stores meant for it fail and readers
that look a key up there find nothing. Such a node must be a DHT client (it still reads and writes through servers).
Its own address says little (a public host may listen on a private address behind a forwarded port; the lab's hosts
all have private addresses), and asking a connected peer to ping us proves nothing either: the ping comes back over
the connection we opened. So a peer is asked to open a *new* TCP connection.

The probe (protocol :data:`DIALBACK`, a binary stream): the asker sends its listening TCP ports (msgpack list, at
most :data:`MAX_PORTS`); the answerer opens a TCP connection to each port on the IP address the asker's connection
comes from (never any other address: the probe cannot be pointed at a third host), closes it at once, and answers
with the ports that accepted (msgpack). One probe per asking peer per :data:`PROBE_COOLDOWN_S`, a few at a time.

Knows nothing about records or the swarm's key layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import msgpack
from hivemind.dht.protocol import DHTProtocol
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.auth import AuthRole, AuthRPCWrapper
from multiaddr import Multiaddr

logger = logging.getLogger(__name__)

#: The dial-back protocol's libp2p handler name.
DIALBACK = "rl-swarm/dialback/1"
#: Most ports one probe asks about.
MAX_PORTS = 4
#: Seconds the answerer waits for one TCP connection to open (and the asker for the answer, plus this).
DIAL_TIMEOUT_S = 4.0
#: Seconds before the same peer may ask again.
PROBE_COOLDOWN_S = 20.0
#: Probes answered at once.
MAX_CONCURRENT = 4

REACHABLE, UNREACHABLE, UNKNOWN = "reachable", "unreachable", "unknown"


class DialBackService:
    """Answers other peers' dial-back probes (register with :meth:`register` on the node's p2p)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._busy = asyncio.Semaphore(MAX_CONCURRENT)
        self.answered = 0

    async def register(self, p2p: Any) -> None:
        await p2p.add_binary_stream_handler(DIALBACK, self._handle)

    async def _handle(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ip = _ip_of(info.addr)
            peer = str(info.peer_id)
            now = time.monotonic()
            if ip is None or now - self._last.get(peer, -PROBE_COOLDOWN_S) < PROBE_COOLDOWN_S or self._busy.locked():
                writer.write(msgpack.packb({"refused": True}))
                return
            self._last[peer] = now
            if len(self._last) > 4096:
                self._last = {p: t for p, t in self._last.items() if now - t < PROBE_COOLDOWN_S}
            raw = await asyncio.wait_for(reader.read(256), DIAL_TIMEOUT_S)
            ports = msgpack.unpackb(raw) if raw else []
            if not isinstance(ports, list):
                return
            ports = [p for p in ports[:MAX_PORTS] if isinstance(p, int) and 0 < p < 65536]
            async with self._busy:
                results = await asyncio.gather(*(_dial(ip, p) for p in ports))
            self.answered += 1
            writer.write(msgpack.packb({"ip": ip, "open": [p for p, ok in zip(ports, results, strict=True) if ok]}))
            await writer.drain()
        except Exception as e:  # a peer's bad probe never disturbs this node
            logger.debug("dial-back probe failed: %s: %s", e.__class__.__name__, e)
        finally:
            with contextlib.suppress(Exception):
                writer.close()


async def _dial(ip: str, port: int) -> bool:
    try:
        _, w = await asyncio.wait_for(asyncio.open_connection(ip, port), DIAL_TIMEOUT_S)
    except (OSError, TimeoutError):
        return False
    w.close()
    with contextlib.suppress(Exception):
        await w.wait_closed()
    return True


def _ip_of(addr: Any) -> str | None:
    """The IPv4/IPv6 address of a connection's remote multiaddr (None for a relayed or unknown one)."""
    try:
        m = Multiaddr(str(addr))
        if "p2p-circuit" in str(m):
            return None
        for proto in ("ip4", "ip6"):
            with contextlib.suppress(Exception):
                return str(m.value_for_protocol(proto))
    except Exception:
        return None
    return None


async def ask(p2p: Any, peer: PeerID, ports: Sequence[int]) -> bool | None:
    """Ask ``peer`` to dial ``ports`` back: True if one opened, False if none did, None if it did not answer."""
    try:
        _, reader, writer = await asyncio.wait_for(p2p.call_binary_stream_handler(peer, DIALBACK), DIAL_TIMEOUT_S)
    except Exception as e:
        logger.debug("dial-back: %s did not take the probe: %s", peer, e)
        return None
    try:
        writer.write(msgpack.packb(list(ports)[:MAX_PORTS]))
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(256), DIAL_TIMEOUT_S * 2 + 2)
        answer = msgpack.unpackb(raw) if raw else None
    except Exception as e:
        logger.debug("dial-back: no answer from %s: %s", peer, e)
        return None
    finally:
        with contextlib.suppress(Exception):
            writer.close()
    if not isinstance(answer, dict) or answer.get("refused") or not isinstance(answer.get("open"), list):
        return None
    return bool(answer["open"])


async def probe(p2p: Any, peers: Sequence[PeerID], ports: Sequence[int], want: int = 2) -> str:
    """Ask up to ``want`` of ``peers`` (in order) until one answers yes: :data:`REACHABLE` when a peer opened a
    connection, :data:`UNREACHABLE` when at least one answered and none could, :data:`UNKNOWN` when nobody answered."""
    answers: list[bool] = []
    for peer in peers:
        if len(answers) >= want:
            break
        got = await ask(p2p, peer, ports)
        if got is None:
            continue
        if got:
            return REACHABLE
        answers.append(got)
    return UNREACHABLE if answers else UNKNOWN


async def set_client_mode(node: Any, client: bool) -> None:
    """Make a running hivemind ``DHTNode`` a DHT client (stop serving: peers drop it from their routing tables at
    their next request) or a DHT server (serve, then ping the peers it knows so they add it), keeping its daemon,
    connections, routing table and storage. Run on the node's own loop."""
    protocol: DHTProtocol = node.protocol
    if protocol.client_mode == client:
        return
    if client:
        protocol.client_mode = True
        protocol.node_info = dht_pb2.NodeInfo()
        with contextlib.suppress(Exception):
            await protocol.remove_p2p_handlers(node.p2p)
        return
    await protocol.add_p2p_handlers(node.p2p, AuthRPCWrapper(protocol, AuthRole.SERVICER, protocol.authorizer))
    protocol.node_info = dht_pb2.NodeInfo(node_id=node.node_id.to_bytes())
    protocol.client_mode = False
    peers = list(protocol.routing_table.peer_id_to_uid)
    if peers:
        await asyncio.gather(*(protocol.call_ping(p) for p in peers[:32]), return_exceptions=True)
