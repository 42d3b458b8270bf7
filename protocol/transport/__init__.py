"""Transports: move opaque signed record bytes between peers; all share one interface and one contract suite.

* ``base``     -- the :class:`Transport` interface
* ``config``   -- pydantic configs, a discriminated union on ``type`` (memory, hivemind, libp2p)
* ``factory``  -- build a transport from its config (registry keyed by ``type``; backends imported lazily)
* ``netkey``   -- the node's libp2p key: its identity key pair as protobuf keys, a ``/p2p/`` peer id, p2pd's key file
* ``gossip``   -- the GossipSub topic, message tags and sync framing both network transports share (mixed swarms)
* ``memory``   -- in-process network with fault hooks (latency, loss, duplication, partitions, churn)
* ``hivemind`` -- the hivemind DHT transport (the only package that imports hivemind): transport, store guard,
  event-loop plumbing
* ``libp2p``   -- the py-libp2p transport (the only package that imports libp2p): GossipSub push, direct sync, peer
  exchange, and its parts

Layers, top to bottom: ``factory`` -> ``hivemind`` | ``libp2p`` | ``memory`` -> ``base`` | ``config`` | ``netkey`` |
``gossip``.
The fault-injecting wrappers that tests and the simulator put around a transport live in ``sim.faults``.
"""

from protocol.transport.base import RecordCheck, Transport
from protocol.transport.config import TransportConfig
from protocol.transport.factory import create_transport

__all__ = ["RecordCheck", "Transport", "TransportConfig", "create_transport"]
