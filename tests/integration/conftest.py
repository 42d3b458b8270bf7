"""Fixtures for multi-process tests: a factory of ``swarm-node`` processes that are always ended by pid."""

from __future__ import annotations

import pytest

from tests.integration.procs import NodeProc


@pytest.fixture
def node_procs(tmp_path):
    """``start(name, *args)`` launches ``swarm-node <args>``; every process is stopped at teardown."""
    procs: list[NodeProc] = []

    def start(name: str, *args: str, env: dict[str, str] | None = None, own_group: bool = False) -> NodeProc:
        p = NodeProc(list(args), tmp_path / f"{name}.log", env=env, own_group=own_group)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()
