"""B7: does a node alone learn a skill, not its training items? Held-out accuracy before and after training.

For each seed, the real CLI: ``swarm-node join --transport memory --run-dir D --max-steps N --set seed=S`` on the
default config, then ``swarm-node eval --run-dir D --json`` (the final checkpoint) and ``swarm-node eval
--run-dir D --initial --json`` (the initial model), both on the run's held-out split: questions the node never
trained on (a hash of the canonical problem reserves them; training draws and peers' groups on them are refused).
Prints a Markdown table (per seed and per family, mean ± std over seeds) and writes
``benchmarks/results/b7_generalization.md`` with the machine and the date.

    python benchmarks/b7_generalization.py                  # 150 steps, seeds 0 1 2
    python benchmarks/b7_generalization.py --config configs/node/lab.yaml --seeds 0 1 2 3 4 --name b7_lab

**The laboratory model, pre-registered (committed before any test-side result was read).** ``configs/node/lab.yaml``
(``builtin:lab``, ``lab_add`` + ``lab_sub``, lr 3e-5 and 32 prompts a step, both chosen on the DEV side), seeds
0-4, 150 steps, evaluation on the TEST side, 64 items per family, 8 samples + greedy. Metric: per seed, the mean over
the two families of sampled exact accuracy after minus before (the run's initial model). The target (BENCHMARKS.md)
is met when the mean gain over seeds is >= +0.10 and more than 2 sd above 0, every family ends above its
majority-answer baseline, and the mean pass@8 change is >= 0. Nothing else is read as the result.
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


def _fam(results: list[dict], when: str, fam: str, key: str) -> list[float]:
    """``key`` of family ``fam`` in each seed's ``when`` ("before" / "after") evaluation (None skipped)."""
    return [v for r in results if (v := r[when]["families"][fam].get(key)) is not None]


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _pair(results: list[dict], fam: str, key: str, digits: int = 3) -> str:
    b, a = _mean(_fam(results, "before", fam, key)), _mean(_fam(results, "after", fam, key))
    return f"{b:.{digits}f} -> {a:.{digits}f}"


def report(results: list[dict], steps: int, extra: list[str] | None = None) -> str:
    """The B7 table: exact-match held-out accuracy before and after, against each family's majority baseline, with
    pass@8 (new skill vs sharpening), greedy accuracy, the top answer's share and partial-credit reward beside."""
    fams = list(results[0]["after"]["families"])
    lines = [
        f"# B7 generalization: a node alone, {steps} steps",
        "",
        f"Machine: {machine_info()}.",
        "",
        "Held-out problems only (the split hashes the canonical problem: a re-bracketed or reordered question falls "
        "on the same side as its original; training draws and peers' groups on held-out problems are refused). "
        "**accuracy** = exact match of the extracted answer with the gold answer, over k samples per item at the "
        "training temperature; **pass@8** = unbiased estimate from those samples (a rise is new coverage, a fall "
        "is sharpening); **greedy** = one greedy completion per item, exact; **majority** = always giving the most "
        "common gold answer of the held-out items; **top share** = share of samples giving the single most common "
        "answer; **reward** = reasoning-gym's partial credit (not evidence of skill). Before = the run's initial "
        "model (`swarm-node eval --initial`), after = its final checkpoint. Config overrides: "
        f"`{' '.join(extra or []) or 'none (the default node)'}`.",
        "",
        "| seed | exact before | after | gain | pass@8 before | after | greedy before | after "
        "| reward before | after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        b, a = r["before"], r["after"]

        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"

        lines.append(
            f"| {r['seed']} | {f(b['accuracy'])} | {f(a['accuracy'])} | {a['accuracy'] - b['accuracy']:+.3f} | "
            f"{f(b.get('pass_at_8'))} | {f(a.get('pass_at_8'))} | {f(b['greedy_accuracy'])} | "
            f"{f(a['greedy_accuracy'])} | {f(b.get('reward'))} | {f(a.get('reward'))} |"
        )
    gains = [r["after"]["accuracy"] - r["before"]["accuracy"] for r in results]
    p8 = [
        r["after"]["pass_at_8"] - r["before"]["pass_at_8"] for r in results if r["before"].get("pass_at_8") is not None
    ]
    above = [
        fam
        for fam in fams
        if _mean(_fam(results, "after", fam, "accuracy")) > _mean(_fam(results, "after", fam, "majority_baseline"))
    ]
    gains_above = (
        [
            statistics.fmean(
                r["after"]["families"][fam]["accuracy"] - r["before"]["families"][fam]["accuracy"] for fam in above
            )
            for r in results
        ]
        if above
        else []
    )
    lines += [
        "",
        f"Mean exact gain over families: **{mean_std(gains)}** (± sd over {len(results)} seeds); pass@8 change "
        f"{mean_std(p8)}. Families above their majority baseline after training: "
        f"{', '.join(above) or 'none'}; their mean exact gain {mean_std(gains_above)}. Target (BENCHMARKS.md): "
        "exact gain >= +0.10 in 150 steps beyond 2 sd, above the baseline, pass@8 not falling. Evaluation side: "
        f"{results[0]['after'].get('side', 'held-out (before split v2)')}.",
        "",
        "Per family (mean over seeds; gain ± sd over seeds):",
        "",
        "| family | items | majority | exact before -> after | gain | pass@8 | greedy | top share | reward | verdict |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for fam in fams:
        fb = [r["before"]["families"][fam] for r in results]
        fa = [r["after"]["families"][fam] for r in results]
        base = _mean(_fam(results, "after", fam, "majority_baseline"))
        after = _mean([x["accuracy"] for x in fa])
        verdict = "above majority" if after > base else "**at or below majority**"
        lines.append(
            f"| {fam} | {fa[0]['n']} | {base:.3f} | {_pair(results, fam, 'accuracy')} | "
            f"{mean_std([a['accuracy'] - b['accuracy'] for a, b in zip(fa, fb, strict=True)])} | "
            f"{_pair(results, fam, 'pass_at_8', 2)} | {_pair(results, fam, 'greedy_accuracy', 2)} | "
            f"{_pair(results, fam, 'top_answer_share', 2)} | {_pair(results, fam, 'reward', 3)} | {verdict} |"
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
    ap.add_argument("--config", default=None, help="node config YAML (e.g. configs/node/lab.yaml, the lab model)")
    ap.add_argument("--name", default="b7_generalization", help="results file name (default b7_generalization)")
    merge_help = "report only: combine the JSON results of runs made apart (e.g. seeds in two processes)"
    ap.add_argument("--merge", type=Path, nargs="+", default=None, help=merge_help)
    args = ap.parse_args()
    if args.merge:
        results = sorted((r for f in args.merge for r in json.loads(f.read_text())), key=lambda r: r["seed"])
        sets = ([f"--config {args.config}"] if args.config else []) + args.sets
        table = report(results, args.steps, sets)
        print(table)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.md").write_text(table)
        (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=1))
        return
    if args.quick:
        args.steps, args.seeds, args.items = 4, args.seeds[:1], 4
    extra = [x for s in args.sets for x in ("--set", s)]
    if args.config:
        extra = ["--config", args.config, *extra]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            print(f"seed {seed}: training {args.steps} steps, then evaluating", file=sys.stderr, flush=True)
            results.append(run_seed(Path(tmp) / f"seed{seed}", args.steps, seed, args.items, extra))
    table = report(results, args.steps, ([f"--config {args.config}"] if args.config else []) + args.sets)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.name + ("_quick" if args.quick else "")
    (args.out / f"{name}.md").write_text(table)
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
