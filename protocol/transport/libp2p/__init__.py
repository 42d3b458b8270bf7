"""The parts of the libp2p transport (``protocol.transport.libp2p.transport`` composes them), one concept each.

* ``store``     -- validated records by window and digest, bounded and expiring; the transport's counters
* ``edge``      -- the edge validator: size, decode, signature, swarm, window horizon, the caller's hook, then store
* ``gossipsub`` -- py-libp2p GossipSub and Pubsub subclasses that count what the library drops silently
* ``bridge``    -- the trio thread that runs the host, and the asyncio side's calls into it (with timeouts)
* ``sync``      -- the ``/rl-swarm/sync/1.0.0`` request/response protocol: have, get and peers
* ``peers``     -- signed peer advertisements (address + protocol version) and the bounded table of known peers
* ``stalls``    -- which forwarders an announced record may be fetched from now (a bound on stalling forwarders)

``store``, ``edge``, ``stalls`` and this package's ``__init__`` import neither libp2p nor trio; the others do, and
only the libp2p transport imports them (hivemind and libp2p cannot share a process).
"""
