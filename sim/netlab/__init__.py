"""A network lab in Linux network namespaces: public hosts, home networks behind NAT routers, slow and lossy links,
real ``swarm-node`` processes inside (needs root, iproute2 and nftables).

* ``topology`` -- the lab described in one short line (``public=2 homes=3,3 nat=symmetric link=25ms/5ms/1%``)
* ``lab``      -- builds it (namespaces, bridges, veth/TAP links, nftables NAT and loss, tc rate), runs processes in
  hosts, cuts links, removes hosts, tears it all down
* ``wire``     -- the delaying link: a process joining two TAP devices (this kernel has no ``netem``)
* ``swarm``    -- ``swarm-node join`` processes in the lab's hosts and what they received
* ``ns``       -- namespace plumbing and the preconditions check

Layers, top to bottom: ``swarm`` -> ``lab`` -> ``wire`` | ``topology`` -> ``ns``. Imports nothing from ``node`` at
module import time.
"""
