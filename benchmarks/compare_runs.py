"""Compare two simulator run trees line by line, timings aside: is a refactor's behaviour unchanged?

Every ``*.jsonl`` file under ``BEFORE`` (``metrics.jsonl``, ``rollouts.jsonl``, ``eval.jsonl`` of every node) is
compared with the same path under ``AFTER``, one JSON object per line, after dropping the keys that are wall-clock
measurements or the process's own state (``sim.report.noise``: names ending in ``_s``, ``time`` or ``seconds``, and
``py_heap_blocks``, which moves with whatever else the interpreter holds). Prints each differing line's keys and a
summary; exits 1 when anything differs. ``configs/sim/equivalence.yaml`` is the run to compare.

    python benchmarks/compare_runs.py runs/before runs/after
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from sim.report.noise import without_run_noise  # noqa: E402


def compare(before: Path, after: Path) -> tuple[int, list[str]]:
    """(lines compared, one message per difference: a missing file, a length, or a line's differing keys)."""
    diffs: list[str] = []
    total = 0
    for fb in sorted(before.rglob("*.jsonl")):
        rel = fb.relative_to(before)
        fa = after / rel
        if not fa.exists():
            diffs.append(f"{rel}: missing after")
            continue
        lb, la = fb.read_text().splitlines(), fa.read_text().splitlines()
        if len(lb) != len(la):
            diffs.append(f"{rel}: {len(lb)} lines before, {len(la)} after")
        for i, (x, y) in enumerate(zip(lb, la, strict=False)):
            total += 1
            dx, dy = without_run_noise(json.loads(x)), without_run_noise(json.loads(y))
            if dx != dy:
                keys = sorted(k for k in set(dx) | set(dy) if dx.get(k) != dy.get(k)) if isinstance(dx, dict) else []
                diffs.append(f"{rel}:{i + 1}: {', '.join(keys[:10]) or 'differs'}")
    return total, diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    total, diffs = compare(args.before, args.after)
    for d in diffs:
        print(d)
    print(f"{total} lines compared, {len(diffs)} differ")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
