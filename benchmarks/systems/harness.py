"""What the systems benchmarks share: where reports go, writing one, and stopping a process a benchmark started.

Imports nothing heavy (neither hivemind nor libp2p): the libp2p benchmark, which must never share a process with
hivemind, uses it too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def write_table(text: str, out: Path) -> int:
    """Print a benchmark's Markdown report and write it to ``out`` (its folder made); returns 0, the exit code."""
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


def stop_process(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """End a process this benchmark started, by its handle: terminate, then kill if it does not exit in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
