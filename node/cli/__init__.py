"""The node's command line: ``swarm-node`` and what its commands share with ``swarm-sim``. Thin: each command
parses its arguments, then imports the heavy modules it needs (``--help`` is instant).

* ``app``       -- ``swarm-node``: keygen, join, eval, watch, export, doctor (the typer app and ``main``)
* ``join``      -- ``swarm-node join`` behind the argument parser: resolved config, network, signals, shutdown
* ``doctor``    -- ``swarm-node doctor``: port, p2pd, addresses, NAT, peers; one remedy per line
* ``export``    -- ``swarm-node export``: a checkpoint as a Hugging Face model directory with a model card
* ``preflight`` -- cheap input checks before anything slow starts (run dir, model name or path, peers, trackers)
* ``logs``      -- CLI logging: the project's INFO lines on stderr, other libraries' warnings only

Layers, top to bottom: ``app`` -> ``join`` | ``doctor`` | ``export`` -> ``preflight`` | ``logs`` -> the node library.
"""

from protocol.lazy import lazy_exports

__all__ = ["main"]
__getattr__ = lazy_exports(__name__, {"main": "app"})
