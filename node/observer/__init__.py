"""The swarm observer: a read-only peer that serves a live web dashboard (``swarm-node watch``).

* ``watch``  -- ``swarm-node watch``: the observer's state, its reader child process and the page, wired together
* ``reader`` -- the child process that joins the swarm through the configured transport and hands raw record bytes
  to its parent (the only part of the observer that imports a transport library)
* ``state``  -- validate records, re-score completions with the local verifier, aggregate per peer and per family
* ``http``   -- the read-only HTTP server: the page in ``web/`` and ``/api/state``

Layers, top to bottom: ``watch`` -> ``reader`` | ``http`` | ``state``. The observer's own process never imports
torch, transformers, hivemind or libp2p (an import-linter contract and a test check it); it needs no model.
"""

from node.observer.http import ObserverServer
from node.observer.state import ObserverLimits, SwarmObserver
from node.observer.watch import run_watch

__all__ = ["ObserverLimits", "ObserverServer", "SwarmObserver", "run_watch"]
