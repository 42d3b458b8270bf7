"""Build a transport from its config: a small registry keyed by the config's ``type``.

Backends are imported only when their type is asked for, so choosing ``memory`` never imports hivemind and
the hivemind and libp2p transports (which cannot share a process, see FACTS.md) never meet.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from protocol.errors import ConfigError
from protocol.transport.base import RecordCheck, Transport
from protocol.transport.config import ProtocolConfig

Builder = Callable[..., Awaitable[Transport]]
_BUILDERS: dict[str, Builder] = {}


def register_transport(type_name: str, builder: Builder) -> None:
    """Register ``builder(cfg, *, swarm, peer_id, validate, protocol, network)`` for ``transport.type``."""
    _BUILDERS[type_name] = builder


async def _memory(
    cfg: Any,
    *,
    swarm: str,
    peer_id: str,
    validate: RecordCheck | None,
    protocol: ProtocolConfig,
    network: Any = None,
) -> Transport:
    from protocol.transport.memory import MemoryNetwork, MemoryTransport

    # A process-local network: with no ``network`` given the node is alone (offline single-node training).
    net = network or MemoryNetwork.from_config(cfg)
    return MemoryTransport(net, peer_id, validate=validate, protocol=protocol, swarm=swarm)


async def _hivemind(
    cfg: Any,
    *,
    swarm: str,
    peer_id: str,
    validate: RecordCheck | None,
    protocol: ProtocolConfig,
    network: Any = None,
) -> Transport:
    from protocol.transport.hivemind_dht import HivemindTransport

    return await HivemindTransport.create(cfg, swarm=swarm, validate=validate, protocol=protocol)


async def _libp2p(
    cfg: Any,
    *,
    swarm: str,
    peer_id: str,
    validate: RecordCheck | None,
    protocol: ProtocolConfig,
    network: Any = None,
) -> Transport:
    from protocol.transport.libp2p_gossip import Libp2pTransport

    return await Libp2pTransport.create(cfg, swarm=swarm, validate=validate, protocol=protocol)


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
) -> Transport:
    """Start the transport ``cfg.type`` names; ``network`` is the shared MemoryNetwork for in-process swarms."""
    builder = _BUILDERS.get(cfg.type)
    if builder is None:
        raise ConfigError(f"transport.type={cfg.type!r} is unknown; choose one of {sorted(_BUILDERS)}")
    return await builder(
        cfg, swarm=swarm, peer_id=peer_id, validate=validate, protocol=protocol or ProtocolConfig(), network=network
    )
