"""``python -m node.cli``: the same as ``swarm-node``."""

from node.cli.app import main

main()
