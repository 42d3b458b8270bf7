"""Transports: move opaque signed record bytes between peers; all share one interface and one contract suite.

* ``base``         -- the :class:`Transport` interface
* ``config``       -- pydantic configs, a discriminated union on ``type`` (memory, hivemind, libp2p)
* ``memory``       -- in-process network with fault hooks (latency, loss, duplication, partitions, churn)
* ``faults``       -- composable wrappers injecting drop, delay, duplicate, tamper, replay, flood, forge
* ``factory``      -- build a transport from its config (registry keyed by ``type``; backends imported lazily)
* ``hivemind_dht`` -- hivemind DHT (the only module that imports hivemind)
* ``libp2p_gossip`` -- py-libp2p GossipSub push + direct sync + peer exchange (with ``lp2p``, the only modules that
  import libp2p)
* ``lp2p``         -- the libp2p transport's parts: record store, edge validator, GossipSub, trio bridge, sync, peers
"""
