"""Directories built once and cached: the built-in model and converted packaged models.

A build runs in a temporary directory beside its target and is renamed into place under a file lock, so
processes that start at once neither duplicate the work nor ever see a half-written directory. A build marks
itself complete by writing one file last; a directory without it is a crash's leftover and is rebuilt, and the
temporary directories of builds killed midway (up to a model's size each) are removed by the next build.

Knows nothing about what is built.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)


def build_once(target: Path, done_file: str, build: Callable[[Path], object], what: str) -> Path:
    """``target``, after ``build(tmp_dir)`` has filled it (``build`` writes ``done_file`` last), unless a complete
    one is already there; ``what`` names it in the one log line a build prints."""
    from filelock import FileLock

    if (target / done_file).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / done_file).exists():  # another process built it while we waited
            return target
        for stale in target.parent.glob(f".{target.name}-????????"):  # mkdtemp's name below, of a killed build
            shutil.rmtree(stale, ignore_errors=True)  # (SIGKILL skips its finally); the lock excludes a live one
        logger.info("building %s into %s; this happens once", what, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(tmp)
            if target.exists():  # a partial directory left by a crash before the rename
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target
