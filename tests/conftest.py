"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    # Two workers on two cores: torch's default of one intra-op thread per core in every worker (and in every node
    # process a test starts, which inherits this) oversubscribes the cores, and its spinning threads then burn
    # CPU waiting for each other -- measured here, torch-heavy unit tests took 1.75x the CPU time without this.
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # already imported by a plugin: the variable is read only at import
        sys.modules["torch"].set_num_threads(1)

if "ATEN_CPU_CAPABILITY" not in os.environ and "torch" not in sys.modules:
    # A laboratory build runs on AVX2 kernels (node.model.lab.BUILD_CPU_CAPABILITY), in a process of its own where
    # torch runs on wider ones: a test session on an AVX-512 host started one per small build, about 5 s each
    # (tests/unit/sim/test_driver_seed_start.py: 75 s against 33 s). Tests run on AVX2 kernels themselves, so builds
    # stay in process; test_lab_model.py drives the pinned path in processes without the variable.
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file() and " avx2" in cpuinfo.read_text():
        os.environ["ATEN_CPU_CAPABILITY"] = "avx2"


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model cache holding the reduced built-in model (``tiny.SMALL_RECIPE``), built once per test run.

    Under pytest-xdist each worker has its own base temp dir; their common parent is this run's, so all workers
    share one cache and the model is built once (``ensure_built`` holds a file lock while one process builds).
    """
    from node.model import tiny

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / "tiny-cache"
    tiny.ensure_built(path, tiny.SMALL_RECIPE)
    return path
