"""Does one node alone learn? ``swarm-node join --max-steps N`` on the default config, timed end to end.

Runs the real CLI in a subprocess (optionally with an empty model cache, so the first build is included), then
compares the mean reward of the first and last 10 steps. Prints a Markdown table and writes
``benchmarks/results/single_node.md`` with the machine and the date.

    python benchmarks/single_node.py                 # 100 steps, 2 seeds, cached model
    python benchmarks/single_node.py --fresh-cache   # include the built-in model's first build
    python benchmarks/single_node.py --quick         # 12 steps, 1 seed (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine_info  # noqa: E402


def run_once(run_dir: Path, steps: int, seed: int, env: dict[str, str], extra: list[str]) -> dict:
    exe = shutil.which("swarm-node") or f"{sys.executable} -m node.cli"
    cmd = [*exe.split(), "join", "--run-dir", str(run_dir), "--max-steps", str(steps), "--transport", "memory"]
    cmd += ["--set", f"seed={seed}", *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [r["reward_mean"] for r in rows]
    k = min(10, len(rewards) // 2)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    return {"seed": seed, "steps": len(rows), "first": first, "last": last, "gain": last - first, "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--fresh-cache", action="store_true", help="empty model cache: time includes the first build")
    ap.add_argument("--quick", action="store_true", help="12 steps, one seed")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra config overrides")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.seeds = 12, args.seeds[:1]
    extra = [x for s in args.sets for x in ("--set", s)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if args.fresh_cache:
            env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        for seed in args.seeds:
            results.append(run_once(Path(tmp) / f"seed{seed}", args.steps, seed, env, extra))
    lines = [
        f"# Single node alone: {args.steps} steps of the default config",
        "",
        f"Machine: {machine_info()}. "
        f"Model cache: {'empty at start (first seed includes the build)' if args.fresh_cache else 'warm'}.",
        "",
        "| seed | steps | reward first 10 | reward last 10 | gain | wall time (s) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cells = (
            r["seed"],
            r["steps"],
            f"{r['first']:.3f}",
            f"{r['last']:.3f}",
            f"{r['gain']:+.3f}",
            f"{r['wall_s']:.0f}",
        )
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ("single_node_quick.md" if args.quick else "single_node.md")).write_text(table)


if __name__ == "__main__":
    main()
