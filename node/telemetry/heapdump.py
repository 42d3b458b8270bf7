"""Where a node's Python heap goes, for chasing a leak in a long run (docs/operations.md, "Memory").

Started with ``PYTHONTRACEMALLOC=<frames>`` in its environment, ``swarm-node join`` writes the largest live
allocation sites to ``<run dir>/heap-<unix time>.txt`` on ``SIGUSR2`` (text, one site a line). Two dumps an hour
apart, compared site by site (:func:`compare`), name what grew. Off otherwise: tracing costs time on every
allocation.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

#: Allocation sites written per dump.
TOP = 60


def dump(run_dir: Path, top: int = TOP) -> Path | None:
    """Write the ``top`` allocation sites by size (file:line, KiB, blocks) and the totals; None when not tracing."""
    if not tracemalloc.is_tracing():
        return None
    stats = tracemalloc.take_snapshot().statistics("lineno")
    lines = [f"# {len(stats)} sites, {sum(s.size for s in stats) / 1024:.0f} KiB, {sum(s.count for s in stats)} blocks"]
    for s in stats[:top]:
        frame = s.traceback[0]
        lines.append(f"{frame.filename}:{frame.lineno}\t{s.size / 1024:.1f}\t{s.count}")
    path = Path(run_dir) / f"heap-{int(time.time())}.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def read(path: Path) -> dict[str, tuple[float, int]]:
    """A dump's sites: ``file:line -> (KiB, blocks)``."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line and not line.startswith("#"):
            site, kib, count = line.rsplit("\t", 2)
            out[site] = (float(kib), int(count))
    return out


def compare(before: Path, after: Path, top: int = 15) -> list[tuple[str, int, float]]:
    """The sites whose block count grew most between two dumps: ``(site, blocks gained, KiB gained)``."""
    a, b = read(before), read(after)
    grown = [(site, cnt - a.get(site, (0.0, 0))[1], kib - a.get(site, (0.0, 0))[0]) for site, (kib, cnt) in b.items()]
    return sorted(grown, key=lambda g: -g[1])[:top]
