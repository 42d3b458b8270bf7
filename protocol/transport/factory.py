"""Build a transport from its config: a small registry keyed by the config's ``type``.

A node's identity reaches the backends as its :class:`~protocol.transport.netkey.NetworkKey` (the same Ed25519
key pair), so its libp2p peer id is stable across restarts; without an identity a backend makes a fresh key.

Backends are imported only when their type is asked for, so choosing ``memory`` never imports hivemind and
the hivemind and libp2p transports (which cannot share a process, see FACTS.md) never meet.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from protocol.errors import ConfigError
from protocol.identity import Identity
from protocol.transport.base import RecordCheck, Transport
from protocol.transport.config import ProtocolConfig
from protocol.transport.netkey import NetworkKey


@dataclass(frozen=True)
class Context:
    """What every backend is built with besides its own config section."""

    swarm: str
    peer_id: str
    validate: RecordCheck | None
    protocol: ProtocolConfig
    network: Any = None
    """The shared ``MemoryNetwork`` of an in-process swarm (memory transport only)."""
    key: NetworkKey | None = None
    """The node's libp2p key (its identity's key pair); None: the backend makes a fresh one (a new peer id)."""


Builder = Callable[[Any, Context], Awaitable[Transport]]
_BUILDERS: dict[str, Builder] = {}


def register_transport(type_name: str, builder: Builder) -> None:
    """Register ``builder(cfg, context)`` for ``transport.type``."""
    _BUILDERS[type_name] = builder


async def _memory(cfg: Any, ctx: Context) -> Transport:
    from protocol.transport.memory import MemoryNetwork, MemoryTransport

    # A process-local network: with no ``network`` given the node is alone (offline single-node training).
    net = ctx.network or MemoryNetwork.from_config(cfg)
    return MemoryTransport(net, ctx.peer_id, validate=ctx.validate, protocol=ctx.protocol, swarm=ctx.swarm)


async def _hivemind(cfg: Any, ctx: Context) -> Transport:
    from protocol.transport.hivemind.transport import HivemindTransport

    return await HivemindTransport.create(
        cfg, swarm=ctx.swarm, validate=ctx.validate, protocol=ctx.protocol, key=ctx.key
    )


async def _libp2p(cfg: Any, ctx: Context) -> Transport:
    from protocol.transport.libp2p.transport import Libp2pTransport

    return await Libp2pTransport.create(cfg, swarm=ctx.swarm, validate=ctx.validate, protocol=ctx.protocol, key=ctx.key)


register_transport("memory", _memory)
register_transport("hivemind", _hivemind)
register_transport("libp2p", _libp2p)


async def create_transport(
    cfg: Any,
    *,
    swarm: str,
    peer_id: str,
    validate: RecordCheck | None = None,
    protocol: ProtocolConfig | None = None,
    network: Any = None,
    identity: Identity | None = None,
) -> Transport:
    """Start the transport ``cfg.type`` names; ``network`` is the shared MemoryNetwork for in-process swarms;
    ``identity`` (the node's record key) is also the network transports' libp2p key, so their ``/p2p/`` id is
    the same at every start (without one they make a fresh key)."""
    builder = _BUILDERS.get(cfg.type)
    if builder is None:
        raise ConfigError(f"transport.type={cfg.type!r} is unknown; choose one of {sorted(_BUILDERS)}")
    key = NetworkKey.of(identity) if identity is not None else None
    ctx = Context(swarm, peer_id, validate, protocol or ProtocolConfig(), network, key)
    return await builder(cfg, ctx)
