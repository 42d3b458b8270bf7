"""What the systems benchmarks share: where reports go, their command line's common options, writing a report,
and stopping a process a benchmark started.

Imports nothing heavy (neither hivemind nor libp2p): the libp2p benchmark, which must never share a process with
hivemind, uses it too.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def parser(description: str, quick: str, out: Path, out_help: str | None = None) -> argparse.ArgumentParser:
    """A benchmark's argument parser with its ``--quick`` (help ``quick``) and ``--out`` (default ``out``) options."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--out", type=Path, default=out, help=out_help)
    return ap


def report(out: Path, title: str, facts: Sequence[str], table: str) -> int:
    """Write a Markdown report to ``out`` (its folder made): the title, the date and the machine, ``facts`` as bullets,
    then ``table``; returns 0, the exit code."""
    from benchmarks.common.machine import machine_info

    bullets = [f"date: {datetime.datetime.now().isoformat(timespec='seconds')}", f"machine: {machine_info()}", *facts]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# {title}\n\n" + "".join(f"- {b}\n" for b in bullets) + f"\n{table}\n")
    return 0


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
