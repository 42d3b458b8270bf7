"""B7: does a node alone learn a skill, not its training items? Held-out accuracy before and after training.

For each seed, the real CLI: ``swarm-node join --transport memory --run-dir D --max-steps N --set seed=S`` on the
default config, then ``swarm-node eval --run-dir D --json`` (the final checkpoint) and ``swarm-node eval
--run-dir D --initial --json`` (the initial model), both on the run's held-out split: questions the node never
trained on (a hash of the canonical problem reserves them; training draws and peers' groups on them are refused).
Prints a Markdown table (per seed and per family, mean ± std over seeds) and writes
``benchmarks/results/b7_generalization.md`` with the machine and the date.

    python benchmarks/b7_generalization.py                  # 150 steps, seeds 0 1 2
    python benchmarks/b7_generalization.py --quick          # 4 steps, one seed, 4 items (smoke test)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402


def swarm_node(*args: str, capture: bool = False) -> str:
    """Run the real ``swarm-node`` CLI; its stdout when ``capture``."""
    exe = shutil.which("swarm-node")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "node.cli.app", *args]
    done = subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.PIPE if capture else subprocess.DEVNULL)
    return done.stdout.decode() if capture else ""


def evaluate(run_dir: Path, items: int | None, initial: bool = False) -> dict:
    args = ["eval", "--run-dir", str(run_dir), "--json", *(["--initial"] if initial else [])]
    args += ["--items", str(items)] if items else []
    return json.loads(swarm_node(*args, capture=True))


def run_seed(run_dir: Path, steps: int, seed: int, items: int | None, extra: list[str]) -> dict:
    t0 = time.perf_counter()
    # the in-run evaluations are off: the two `swarm-node eval` calls below are the measurement
    swarm_node(
        "join", "--run-dir", str(run_dir), "--max-steps", str(steps), "--transport", "memory",
        "--set", f"seed={seed}", "--set", "eval.at_start=false", "--set", "eval.at_end=false",
        "--set", "eval.every_steps=null", *extra,
    )  # fmt: skip
    train_s = time.perf_counter() - t0
    before, after = evaluate(run_dir, items, initial=True), evaluate(run_dir, items)
    return {"seed": seed, "before": before, "after": after, "train_s": train_s}


def mean_std(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:+.3f}" if xs else "-"
    return f"{statistics.fmean(xs):+.3f} ± {statistics.stdev(xs):.3f}"


def report(results: list[dict], steps: int) -> str:
    fams = list(results[0]["after"]["families"])
    lines = [
        f"# B7 generalization: a node alone, default config, {steps} steps",
        "",
        f"Machine: {machine_info()}.",
        "",
        "Held-out accuracy = exact-match rate over k samples per item at the training temperature, on questions of "
        "the held-out split (never drawn for training), mean over families; greedy = one greedy completion per item "
        "(exact). "
        "Before = the run's initial model (`swarm-node eval --initial`), after = its final checkpoint.",
        "",
        "| seed | held-out before | after | gain | greedy before | greedy after | train wall (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        b, a = r["before"], r["after"]
        lines.append(
            f"| {r['seed']} | {b['accuracy']:.3f} | {a['accuracy']:.3f} | {a['accuracy'] - b['accuracy']:+.3f} | "
            f"{b['greedy_accuracy']:.3f} | {a['greedy_accuracy']:.3f} | {r['train_s']:.0f} |"
        )
    gains = [r["after"]["accuracy"] - r["before"]["accuracy"] for r in results]
    ggains = [r["after"]["greedy_accuracy"] - r["before"]["greedy_accuracy"] for r in results]
    lines += [
        "",
        f"Mean gain over seeds: **{mean_std(gains)}** (sampled), {mean_std(ggains)} (greedy). Target: >= +0.10.",
        "",
        "Per family (mean over seeds; gain ± std over seeds):",
        "",
        "| family | items | before | after | gain | greedy gain | format rate before -> after |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for fam in fams:
        fb = [r["before"]["families"][fam] for r in results]
        fa = [r["after"]["families"][fam] for r in results]
        lines.append(
            f"| {fam} | {fa[0]['n']} | {statistics.fmean(x['accuracy'] for x in fb):.3f} | "
            f"{statistics.fmean(x['accuracy'] for x in fa):.3f} | "
            f"{mean_std([a['accuracy'] - b['accuracy'] for a, b in zip(fa, fb, strict=True)])} | "
            f"{mean_std([a['greedy_accuracy'] - b['greedy_accuracy'] for a, b in zip(fa, fb, strict=True)])} | "
            f"{statistics.fmean(x['format_rate'] for x in fb):.2f} -> "
            f"{statistics.fmean(x['format_rate'] for x in fa):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--items", type=int, default=None, help="held-out items per family (default: the config's)")
    ap.add_argument("--quick", action="store_true", help="4 steps, one seed, 4 items")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra config overrides")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.seeds, args.items = 4, args.seeds[:1], 4
    extra = [x for s in args.sets for x in ("--set", s)]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            print(f"seed {seed}: training {args.steps} steps, then evaluating", file=sys.stderr, flush=True)
            results.append(run_seed(Path(tmp) / f"seed{seed}", args.steps, seed, args.items, extra))
    table = report(results, args.steps)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ("b7_generalization_quick.md" if args.quick else "b7_generalization.md")).write_text(table)
    (args.out / ("b7_generalization_quick.json" if args.quick else "b7_generalization.json")).write_text(
        json.dumps(results, indent=1)
    )


if __name__ == "__main__":
    main()
