"""Logging for the command-line tools: the project's own INFO lines on stderr, other libraries' warnings only.

A person waiting on a CLI should see what the project is doing from the first second (the built-in model
build, checkpoints, a resume) without the chatter of hivemind, transformers or asyncio. Knows nothing about
what the lines say; modules log through ``logging.getLogger(__name__)`` as usual.
"""

from __future__ import annotations

import logging
import sys

#: Top-level packages whose INFO lines a CLI user sees.
PROJECT_PACKAGES = ("node", "sim", "swarm", "protocol", "benchmarks")


def setup_cli_logging(level: str = "INFO", *, others: str = "WARNING") -> None:
    """Project loggers at ``level``, everything else at ``others`` (everything at ``level`` when it is DEBUG);
    one concise line per record (``HH:MM:SS name: message``) on stderr, so stdout stays machine-readable."""
    project_level = logging.getLevelName(level.upper())
    if not isinstance(project_level, int):
        raise ValueError(f"unknown log level {level!r}")
    # Asking for DEBUG means debugging: then every library speaks too.
    root_level = project_level if project_level < logging.INFO else logging.getLevelName(others.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(root_level)
    for name in PROJECT_PACKAGES:
        logging.getLogger(name).setLevel(project_level)
