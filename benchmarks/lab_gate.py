"""B7's capability gate: does the laboratory model's written working carry the skill?

The same model (``builtin:lab``'s architecture, tokenizer and training problems) is trained with supervised steps
on the laboratory families twice: once on trace + answer (``<think>`` column working ``</think><answer>x</answer>``,
``node.arith``), once on the bare ``<answer>x</answer>``. Both are evaluated on the held-out TEST side (problems
that no training draw can produce, ``node.tasks``) with the node's own evaluator: greedy exact accuracy per
family, exact accuracy of 8 samples at temperature 1, pass@8, the majority-answer baseline. The built-in RL start
point (the default recipe: fewer warm-start steps) is evaluated the same way.

Pre-registered reading: the gate passes when traces reach greedy exact >= 0.6 on each laboratory family and bare
answers stay far below (less than half of that) at the same steps; the start point should have pass@1 about
0.2-0.4 and pass@8 at least twice pass@1.

    python benchmarks/lab_gate.py                 # 1200 warm-start steps each, 200 test items per family
    python benchmarks/lab_gate.py --quick         # seconds: a few steps, 4 items (smoke test)

Writes ``benchmarks/results/lab_gate.md`` and ``.json`` (per-item results inside) with the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402


def evaluate(name: str, builtin: dict[str, Any], cache: Path, items: int, threads: int) -> dict[str, Any]:
    """Build (cached) and evaluate one laboratory recipe on the test side."""
    from node.config import EvalConfig, ModelConfig, RolloutConfig, TaskConfig
    from node.eval import Evaluator
    from node.model import lab
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine
    from node.tasks import TaskSource

    t0 = time.perf_counter()
    policy = load_policy(ModelConfig(name=lab.LAB_NAME, device="cpu", cache_dir=cache, threads=threads,
                                     builtin=builtin))  # fmt: skip
    build_s = time.perf_counter() - t0
    rollout = RolloutConfig(max_new_tokens=112)
    tasks = TaskSource(TaskConfig(families=list(lab.lab_task_families())))
    engine = TransformersEngine(policy, batch_size=128)
    evaluator = Evaluator(tasks, policy, engine, EvalConfig(samples=8), rollout, items_per_family=items)
    t1 = time.perf_counter()
    result = evaluator.evaluate(0)
    recipe = lab.recipe_with(builtin)
    stats_file = lab.model_dir(cache, recipe) / "build_stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    return {"name": name, "recipe": recipe.to_dict(), "recipe_key": recipe.key(), "build_s": round(build_s, 1),
            "build_stats": stats, "eval_s": round(time.perf_counter() - t1, 1), "eval": result}  # fmt: skip


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def report(rows: list[dict[str, Any]], steps: int, items: int) -> str:
    fams = sorted(rows[0]["eval"]["families"])
    out = [
        "# B7 capability gate: laboratory model, traces against bare answers",
        "",
        f"- {machine_info()}",
        f"- date: {time.strftime('%Y-%m-%d')}",
        f"- command: `python benchmarks/lab_gate.py --steps {steps} --items {items}`",
        f"- evaluation: held-out TEST side, {items} items per family, greedy + 8 samples at temperature 1",
        "",
        "| model | warm-start steps | family | greedy exact | exact (8 samples) | pass@8 | majority baseline | "
        "format | build s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for fam in fams:
            f = r["eval"]["families"][fam]
            out.append(
                f"| {r['name']} | {r['recipe']['sft_steps']} | {fam} | {fmt(f.get('greedy_accuracy'))} | "
                f"{fmt(f['accuracy'])} | {fmt(f.get('pass_at_8'))} | {fmt(f.get('majority_baseline'))} | "
                f"{fmt(f.get('format_rate'))} | {r['build_stats'].get('total_s', r['build_s'])} |"
            )
    trace = next(r for r in rows if r["name"] == "traces")
    bare = next(r for r in rows if r["name"] == "bare answers")
    ok = all(
        (t := trace["eval"]["families"][fam].get("greedy_accuracy") or 0) >= 0.6
        and (bare["eval"]["families"][fam].get("greedy_accuracy") or 0) < t / 2
        for fam in fams
    )
    out += ["", f"Result: gate {'PASSED' if ok else 'NOT passed'} (traces >= 0.6 greedy on every family, bare below "
            "half of it)."]  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1200, help="warm-start steps of the gate's two models")
    ap.add_argument("--items", type=int, default=200, help="test items per family")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None, help="model cache (default: the user cache)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 steps, 4 items, a temporary cache")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "lab_gate.md")
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from node.model.lab import DEFAULT_LAB_RECIPE

    steps, items, cache = args.steps, args.items, args.cache
    if args.quick:
        steps, items, cache = 4, 4, Path(tempfile.mkdtemp(prefix="lab-gate-"))
    start = {"sft_steps": 4} if args.quick else {}
    runs = [
        ("traces", {"sft_steps": steps}),
        ("bare answers", {"sft_steps": steps, "trace": False}),
        (f"RL start (default recipe, {start.get('sft_steps', DEFAULT_LAB_RECIPE.sft_steps)} steps)", start),
    ]
    rows = []
    for name, builtin in runs:
        print(f"[lab_gate] {name}: building and evaluating", file=sys.stderr, flush=True)
        rows.append(evaluate(name, builtin, cache, items, args.threads))
    text = report(rows, steps, items)
    print(text)
    if not args.quick:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
