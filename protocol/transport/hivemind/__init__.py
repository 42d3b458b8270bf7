"""The hivemind transport: signed record bytes in a hivemind (Kademlia) DHT, in the sharded ``protocol.layout``.

* ``transport`` -- :class:`HivemindTransport`: publish, poll the followed senders and shards, restart a dead p2pd
* ``guard``     -- :class:`DHTRecordGuard`: what an honest DHT node agrees to store and accepts from a peer; key ids
* ``capacity``  -- :class:`CappedStorage`: no shard key holds more than ``SHARD_CAPACITY`` entries (the most worked)
* ``loop``      -- the private event loop in a daemon thread, two fixes to hivemind's p2p layer

Layers, top to bottom: ``transport`` -> ``guard`` | ``capacity`` | ``loop``. This package is the only one that imports
hivemind (it cannot share a process with libp2p); build it through ``protocol.transport.factory``.
"""

from protocol.transport.hivemind.guard import DHTRecordGuard, key_id
from protocol.transport.hivemind.transport import HivemindTransport

__all__ = ["DHTRecordGuard", "HivemindTransport", "key_id"]
