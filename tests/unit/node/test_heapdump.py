"""The heap dump a node writes on SIGUSR2 when traced (``PYTHONTRACEMALLOC``): sites, totals and a comparison that
names what grew."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

from node.telemetry import heapdump

ROOT = Path(__file__).resolve().parents[3]


def _leak(n: int) -> list[list[int]]:
    return [[i] for i in range(n)]  # the leak's one site


def test_a_dump_names_the_site_that_grew(tmp_path: Path) -> None:
    assert not tracemalloc.is_tracing() and heapdump.dump(tmp_path) is None  # off unless tracing
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    tracemalloc.start(1)
    try:
        first = heapdump.dump(tmp_path / "a")
        kept = _leak(20_000)
        second = heapdump.dump(tmp_path / "b")
    finally:
        tracemalloc.stop()
    assert first and second and first.read_text().startswith("# ")
    site, blocks, kib = heapdump.compare(first, second)[0]
    assert site == f"{__file__}:{_leak.__code__.co_firstlineno + 1}", site
    assert blocks >= 20_000 and kib > 0 and len(kept) == 20_000


def test_a_traced_node_writes_its_heap_on_sigusr2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONTRACEMALLOC": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "node.cli.app", "join", "--transport", "memory", "--run-dir", str(tmp_path),
           "--max-steps", "1000000", "--config", "tiny"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the handler is in place once the node prints its address
            if line.startswith("listening on"):
                break
        proc.send_signal(signal.SIGUSR2)
        for line in proc.stdout:  # the node says so once the dump is written (not while it is being written)
            if line.startswith("heap sites written to"):
                break
        dumps = list(tmp_path.glob("heap-*.txt"))
        assert len(dumps) == 1 and len(heapdump.read(dumps[0])) > 10
    finally:
        proc.terminate()
        proc.wait(120)
