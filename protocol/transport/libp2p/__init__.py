"""The py-libp2p transport: GossipSub push, direct sync and peer exchange, in parts of one concept each.

* ``transport`` -- :class:`Libp2pTransport`: composes the parts below; the only module the factory imports
* ``store``     -- validated records by window and digest, bounded and expiring; the transport's counters
* ``edge``      -- the edge validator: size, decode, signature, swarm, window horizon, the caller's hook, then store
* ``gossipsub`` -- py-libp2p GossipSub and Pubsub subclasses that count what the library drops silently
* ``bridge``    -- the trio thread that runs the host, and the asyncio side's calls into it (with timeouts)
* ``sync``      -- the ``/rl-swarm/sync/1.0.0`` request/response protocol: have, get and peers
* ``peers``     -- signed peer advertisements (address + protocol version) and the bounded table of known peers
* ``stalls``    -- which forwarders an announced record may be fetched from now (a bound on stalling forwarders)

Layers, top to bottom: ``transport`` -> ``sync`` | ``gossipsub`` | ``bridge`` | ``peers`` -> ``edge`` -> ``store`` |
``stalls``. ``store``, ``edge``, ``stalls`` and this face import neither libp2p nor trio (public names resolve
lazily); the others do, and only this package imports them (hivemind and libp2p cannot share a process).
"""

from protocol.lazy import lazy_exports

__all__ = ["Libp2pTransport", "RecordStore"]
__getattr__ = lazy_exports(__name__, {"Libp2pTransport": "transport", "RecordStore": "store"})
