"""Fixtures shared by every test package."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model cache holding the reduced built-in model (``tiny.SMALL_RECIPE``), built once per test run.

    Under pytest-xdist each worker has its own base temp dir; their common parent is this run's, so all workers
    share one cache and the model is built once (``ensure_built`` holds a file lock while one process builds).
    """
    from node import tiny

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / "tiny-cache"
    tiny.ensure_built(path, tiny.SMALL_RECIPE)
    return path
