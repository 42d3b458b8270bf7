"""Tests that import libp2p; they run only in their own pytest process or peer processes, never beside hivemind.

* ``contract_lp2p``  -- the Transport contract suite and libp2p-specific checks (one process, several hosts)
* ``peer_lp2p``      -- one honest or hostile peer process for the multi-process tests and the B1 benchmark

File names deliberately do not match ``test_*.py``: the main pytest process (which imports hivemind) must never
collect them. ``tests/integration/test_transport_libp2p.py`` runs them in subprocesses.
"""
