"""The hivemind transport: signed record bytes in a hivemind (Kademlia) DHT, in the sharded ``protocol.layout``.

* ``transport`` -- :class:`HivemindTransport`: publish, poll the followed senders and shards, restart a dead p2pd
* ``guard``     -- :class:`DHTRecordGuard`: what an honest DHT node agrees to store and accepts from a peer; key ids
* ``capacity``  -- :class:`CappedStorage`: no shard key holds more than ``SHARD_CAPACITY`` entries (the most worked)
* ``loop``      -- the private event loop in a daemon thread, two fixes to hivemind's p2p layer
* ``gossip``    -- :class:`TopicMember`: the swarm's GossipSub topic and sync protocol through p2pd (mixed swarms)
* ``pubsub``    -- p2pd's own pubsub: the daemon flags and a small client of its control socket

Layers, top to bottom: ``transport`` -> ``guard`` | ``capacity`` | ``loop`` | ``gossip`` -> ``pubsub``. This package is
the only one that imports hivemind (it cannot share a process with libp2p; ``gossip`` borrows the libp2p transport's
light ``edge`` and ``store``, which import no libp2p); build it through ``protocol.transport.factory``.
"""

from protocol.transport.hivemind.guard import DHTRecordGuard, key_id
from protocol.transport.hivemind.transport import HivemindTransport

__all__ = ["DHTRecordGuard", "HivemindTransport", "key_id"]
