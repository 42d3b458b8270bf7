"""Can peers dial this node? A dial-back probe over hivemind's p2p, and switching a running ``DHTNode`` between
DHT server and DHT client without restarting its daemon.

Why: a node behind NAT that acts as a DHT server is put in other peers' routing tables, becomes one of the replicas
of keys near its id, and cannot be dialled by peers it has no connection to: stores meant for it fail and readers
that look a key up there find nothing. Such a node must be a DHT client (it still reads and writes through servers).
Its own address says little (a public host may listen on a private address behind a forwarded port; the lab's hosts
all have private addresses), and asking a connected peer to ping us proves nothing either: the ping comes back over
the connection we opened. So a peer is asked to open a *new* TCP connection.

The probe (protocol :data:`DIALBACK`, a binary stream; SPEC 9 is normative): the asker sends its listening TCP ports
(one msgpack array, at most :data:`MAX_PORTS`); the answerer opens a TCP connection to each distinct port among the
first :data:`MAX_PORTS` entries, on the IP address the asker's connection comes from (never any other address: the
probe cannot be pointed at a third host), closes it at once, and answers with the ports that accepted (one msgpack
map). One probe per asking peer per :data:`PROBE_COOLDOWN_S`, at most :data:`MAX_CONCURRENT` being dialled at once
(a bound on concurrency, not a rate: a probe that finds them all busy is refused, the next one may be answered).

**Who may demote a node.** Any peer can answer "none open", truthfully or not, so a node that serves the DHT stops
serving only when peers in at least :data:`DEMOTE_NETWORKS` distinct networks (:func:`network_of`: an IPv4 /16, an
IPv6 /32, of the connection the answer came over) all say so and no peer opened a connection: one hostile peer, or
several in one network, cannot take a reachable node out of the DHT (SPEC 9). One "open" is enough to serve: a
wrongly serving node costs a replica of the 5 each key has, a wrongly demoted one costs the swarm a server.

Knows nothing about records or the swarm's key layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
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
#: Probes answered at once (those beyond are refused, not queued).
MAX_CONCURRENT = 4
#: Longest request or answer, in bytes (a msgpack array of 4 ports is at most 13; an answer well under 100).
MAX_MESSAGE_BYTES = 256
#: Distinct networks (:func:`network_of`) whose peers must all answer "none open" before a serving node stops serving.
DEMOTE_NETWORKS = 2
#: Peers asked at once by one probe, at most (spread over networks first).
MAX_ASKED = 8

REACHABLE, UNREACHABLE, UNKNOWN = "reachable", "unreachable", "unknown"


class DialBackService:
    """Answers other peers' dial-back probes (register with :meth:`register` on the node's p2p)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._active = 0
        self.answered = 0

    async def register(self, p2p: Any) -> None:
        await p2p.add_binary_stream_handler(DIALBACK, self._handle)

    async def _handle(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        active = False
        try:
            ip = _ip_of(info.addr)
            peer = str(info.peer_id)
            now = time.monotonic()
            if (
                ip is None
                or now - self._last.get(peer, -PROBE_COOLDOWN_S) < PROBE_COOLDOWN_S
                or self._active >= MAX_CONCURRENT
            ):
                writer.write(msgpack.packb({"refused": True}))
                return
            self._last[peer] = now
            self._active += 1
            active = True
            if len(self._last) > 4096:
                self._last = {p: t for p, t in self._last.items() if now - t < PROBE_COOLDOWN_S}
            request = await asyncio.wait_for(read_message(reader), DIAL_TIMEOUT_S)
            if not isinstance(request, list):
                return
            ports = list(dict.fromkeys(p for p in request[:MAX_PORTS] if _is_port(p)))
            results = await asyncio.gather(*(_dial(ip, p) for p in ports))
            self.answered += 1
            writer.write(msgpack.packb({"ip": ip, "open": [p for p, ok in zip(ports, results, strict=True) if ok]}))
            await writer.drain()
        except Exception as e:  # a peer's bad probe never disturbs this node
            logger.debug("dial-back probe failed: %s: %s", e.__class__.__name__, e)
        finally:
            if active:
                self._active -= 1
            with contextlib.suppress(Exception):
                writer.close()


def _is_port(p: Any) -> bool:
    return isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536


async def read_message(reader: asyncio.StreamReader) -> Any:
    """One msgpack value from ``reader``, however the stream splits it; ``ValueError`` when the stream ends before a
    whole value or the value runs past :data:`MAX_MESSAGE_BYTES`. Bytes after the value are not read."""
    unpacker = msgpack.Unpacker(max_buffer_size=MAX_MESSAGE_BYTES)
    got = 0
    while got < MAX_MESSAGE_BYTES:
        chunk = await reader.read(MAX_MESSAGE_BYTES - got)
        if not chunk:
            raise ValueError("the stream ended before a whole message")
        got += len(chunk)
        unpacker.feed(chunk)
        for value in unpacker:
            return value
    raise ValueError(f"no whole message in {MAX_MESSAGE_BYTES} bytes")


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


def network_of(ip: str | None) -> str | None:
    """The network an address counts in when answers are weighed: its IPv4 /16 or IPv6 /32 (an IPv4-mapped IPv6
    address as IPv4), as Bitcoin Core groups peers against eclipse attacks; None for no or an unparsable address.
    Loopback is no exception: on one host, peers bound to 127.1.0.1 and 127.2.0.1 count as two networks."""
    if ip is None:
        return None
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    prefix = 16 if addr.version == 4 else 32
    return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))


@dataclass(frozen=True)
class Answer:
    """One peer's answer to a probe: whether it opened a connection to one of the ports, and the network
    (:func:`network_of`) of the connection the answer came over (None: unknown or relayed)."""

    open: bool
    network: str | None


@dataclass(frozen=True)
class Probe:
    """What one probe heard: the answers of the peers that answered (refusals and silence are not answers)."""

    answers: tuple[Answer, ...] = ()

    @property
    def verdict(self) -> str:
        """What the answers say: :data:`REACHABLE` when a peer opened a connection, :data:`UNREACHABLE` when peers
        answered and none could, :data:`UNKNOWN` when nobody answered. Evidence enough to demote a serving node is
        :attr:`demotes`, not this."""
        if any(a.open for a in self.answers):
            return REACHABLE
        return UNREACHABLE if self.answers else UNKNOWN

    @property
    def closed_networks(self) -> set[str]:
        """The distinct networks of peers that answered "none open"."""
        return {a.network for a in self.answers if not a.open and a.network is not None}

    @property
    def demotes(self) -> bool:
        """Whether a serving node should stop serving: nobody opened a connection, and peers in at least
        :data:`DEMOTE_NETWORKS` distinct networks answered that none opened."""
        return self.verdict == UNREACHABLE and len(self.closed_networks) >= DEMOTE_NETWORKS


async def ask(p2p: Any, peer: PeerID, ports: Sequence[int]) -> Answer | None:
    """Ask ``peer`` to dial ``ports`` back: its :class:`Answer`, or None if it did not answer (refused, silent,
    closed the stream, or said something that is not an answer)."""
    try:
        info, reader, writer = await asyncio.wait_for(p2p.call_binary_stream_handler(peer, DIALBACK), DIAL_TIMEOUT_S)
    except Exception as e:
        logger.debug("dial-back: %s did not take the probe: %s", peer, e)
        return None
    try:
        writer.write(msgpack.packb(list(ports)[:MAX_PORTS]))
        await writer.drain()
        answer = await asyncio.wait_for(read_message(reader), DIAL_TIMEOUT_S * 2 + 2)
    except Exception as e:
        logger.debug("dial-back: no answer from %s: %s", peer, e)
        return None
    finally:
        with contextlib.suppress(Exception):
            writer.close()
    if not isinstance(answer, dict) or answer.get("refused") or not isinstance(answer.get("open"), list):
        return None
    return Answer(open=bool(answer["open"]), network=network_of(_ip_of(getattr(info, "addr", None))))


def spread(peers: Sequence[tuple[PeerID, str | None]], n: int = MAX_ASKED) -> list[PeerID]:
    """Up to ``n`` of ``peers`` (each with the IP address its connection comes from, None when unknown), one per
    network in turn, in their order within a network: peers crowded into one network cannot fill a probe."""
    groups: dict[str | None, list[PeerID]] = {}
    for peer, ip in dict(peers).items():
        groups.setdefault(network_of(ip), []).append(peer)
    picked: list[PeerID] = []
    while len(picked) < n and any(groups.values()):
        for members in groups.values():
            if members and len(picked) < n:
                picked.append(members.pop(0))
    return picked


async def candidates(p2p: Any, servers: Sequence[PeerID], timeout: float) -> list[PeerID]:
    """The peers a probe asks (:func:`spread`): those connected now, with the address each connection comes from, then
    ``servers`` (the routing table's) that are not connected, whose networks are not known before they answer."""
    connected: list[tuple[PeerID, str | None]] = []
    with contextlib.suppress(Exception):
        infos = await asyncio.wait_for(p2p.list_peers(), timeout)
        connected = [(i.peer_id, _ip_of(i.addrs[0]) if i.addrs else None) for i in infos]
    return spread([*connected, *((p, None) for p in servers)])


async def probe(p2p: Any, peers: Sequence[PeerID], ports: Sequence[int]) -> Probe:
    """Ask ``peers`` (at most :data:`MAX_ASKED`, all at once; :func:`spread` picks them) to dial ``ports`` back."""
    got = await asyncio.gather(*(ask(p2p, peer, ports) for peer in list(peers)[:MAX_ASKED]))
    return Probe(tuple(a for a in got if a is not None))


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
