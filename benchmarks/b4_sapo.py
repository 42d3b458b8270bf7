"""B4 SAPO: does sharing rollouts pay? The SAPO paper's I/J experiment (arXiv 2509.08721) in the in-process
simulator, in the regime where it can: sparse rewards over nine task families, nodes that know different things.

Rows are named ``<population>-<budget>-<I>-<J>[-<ablation>]`` (``configs/sim/sapo.yaml`` says what each is):

* populations: ``het`` (nodes warm-started on different family subsets, as volunteers really are) and ``homo``
  (identical nodes, as in the paper);
* budgets: ``same`` (every configuration generates the same number of questions per step) and ``paper`` (an I/J
  node generates I questions, as in the paper);
* ablations of 4/4: ``fresh1`` (peers' groups from the latest round only), ``noIS`` (no importance weights on
  peers' completions), and ``8-0-keep0`` (a baseline that also trains on its zero-advantage groups).

Metrics (``benchmarks.analysis.sapo_b4``): own-rollout reward (primary), held-out accuracy per family, training-batch
reward; each ratio is paired by seed with the row's ``8-0``. Target: 4/4 >= 1.94x 8/0 and the
paper's ordering 4/4 > 2/6 > 6/2 > 8/0 (paper totals 1093.31, 945.87, 854.43, 561.79).

    python benchmarks/b4_sapo.py                      # configs/sim/sapo.yaml (hours on CPU; see --only)
    python benchmarks/b4_sapo.py --quick              # configs/sim/sapo-quick.yaml (< 20 min on 2 cores)
    python benchmarks/b4_sapo.py --smoke              # sapo-quick's own quick overrides (seconds; run by a test)
    python benchmarks/b4_sapo.py --only het-same-8-0,het-same-4-4   # some rows (run several in parallel)
    python benchmarks/b4_sapo.py --analyze            # re-read the run directory and write the report only

Writes ``benchmarks/results/b4_sapo.md`` (``b4_sapo_quick.md`` / ``b4_sapo_smoke.md``; or ``--out``) with the
tables and the reward, batch-reward and aha-propagation plots next to it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402

PAPER = {"8-0": 561.79, "6-2": 854.43, "4-4": 1093.31, "2-6": 945.87}
PAPER_ORDER = ("4-4", "2-6", "6-2", "8-0")


def headroom(results: dict, rows: list[dict]) -> list[str]:
    """For each 8-0 row: how much faster than it a sharing row would have to learn for 1.94x (linear growth)."""
    from benchmarks.analysis.sapo_b4 import needed_speedup

    out = []
    for r in rows:
        parts = r["config"].split("-")
        if len(parts) == 4 and parts[2:] == ["8", "0"]:
            r0, d8, d, k = needed_speedup(results[r["config"]], 1.94)
            out.append(
                f"{r['config']}: own reward {r0:.3f} in the first 10 steps, +{d8:.3f} by the last 10; for 1.94x its "
                f"cumulative reward a sharing row would have to rise by {d:.3f}, {k:.1f}x as fast"
            )
    return out


def _per_family(success: dict[str, float], where: dict[str, str] | None = None) -> str:
    """``family success`` pairs, best first, each followed by ``(row)`` when ``where`` names the row that reached it."""
    return ", ".join(
        f"{f} {success[f]:.2f}" + (f" ({where[f]})" if where else "")
        for f in sorted(success, key=lambda f: -success[f])
    )


def ceiling(results: dict, rows: list[dict]) -> list[str]:
    """For each 8-0 row: the ratio over it of a row whose every node had, from its first step, on each family the
    skill the nodes of its population reached (``family_ceiling``: the best row's mean end skill, and the generous
    best stretch of any node); below 1.94 no instant transfer of what the nodes learned reaches the paper's gain."""
    from benchmarks.analysis.sapo_b4 import CEILING_WINDOW, family_ceiling

    out = []
    for r in rows:
        parts = r["config"].split("-")
        if len(parts) != 4 or parts[2:] != ["8", "0"]:
            continue
        population = [n for n in results if n.split("-")[0] == parts[0]]
        c = family_ceiling(results, population, r["config"])
        if c is None:
            continue
        out.append(
            f"{r['config']} earns {c['base_reward']:.3f} a node-step. Over the {len(population)} {parts[0]} rows "
            f"(last / best {CEILING_WINDOW} draws of a family), every node from its "
            f"first step as good on each family as the best row's nodes are on average at the end would earn "
            f"{c['reward_end']:.3f}, **{c['ratio_end']:.2f}x** ({_per_family(c['end'])}); as good as the best "
            f"stretch any one node reached, a generous bound that rises with every run, {c['reward']:.3f}, "
            f"**{c['ratio']:.2f}x** ({_per_family(c['best'], c['where'])})"
        )
    return out


def verdict(rows: list[dict]) -> list[str]:
    """Per population and budget: 4/4 against 8/0, and the ordering of the splits (``ordering``)."""
    import statistics

    groups: dict[str, dict[str, dict]] = {}
    for r in rows:
        parts = r["config"].split("-")
        if len(parts) == 4:
            groups.setdefault("-".join(parts[:2]), {})[f"{parts[2]}-{parts[3]}"] = r
    out = []
    for prefix, by in groups.items():
        base = by.get("8-0") or groups.get(prefix.replace("-paper", "-same"), {}).get("8-0")
        if "4-4" in by and base is not None and not by["4-4"]["own_ratio"]:
            out.append(f"{prefix}: no 4/4 vs 8/0 ratio (8/0's own-rollout reward was 0 on every seed)")
        elif "4-4" in by and base is not None:
            ratios = by["4-4"]["own_ratio"]
            mean = statistics.fmean(ratios)
            spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
            gain = statistics.fmean(by["4-4"]["heldout_gain"]) - statistics.fmean(base["heldout_gain"])
            out.append(
                f"{prefix}: 4/4 vs 8/0 own-rollout reward {mean:.3f}"
                + (f" ± {spread:.3f}" if len(ratios) > 1 else "")
                + f" (target >= 1.94: {'PASS' if mean >= 1.94 else 'FAIL'}); held-out gain 4/4 minus 8/0 {gain:+.3f}"
            )
        present = [c for c in PAPER_ORDER if c in by]
        if len(present) > 2:
            out.append(f"{prefix}: {ordering(by, present)}")
    return out


def ordering(by: dict[str, dict], present: list[str]) -> str:
    """The splits ordered over the seeds all of them ran (means over different seed sets would compare seeds as much
    as splits), against the paper's order. With 8-0 among them the key is each split's own-rollout reward over
    8-0's, paired by seed and averaged, as in the by-length table (so its full-length row gives the same order);
    without it, the mean own-rollout reward."""
    import statistics

    common = sorted(set.intersection(*(set(by[c]["seed_ids"]) for c in present)))
    if not common:
        return "ordering: no seed common to " + ", ".join(present)
    from benchmarks.analysis.sapo_b4 import by_seed

    own = {c: by_seed(by[c], "own") for c in present}
    paired = "8-0" in own and all(own["8-0"][s] for s in common)

    def key(c: str) -> float:
        return statistics.fmean(own[c][s] / own["8-0"][s] if paired else own[c][s] for s in common)

    ours = sorted(present, key=lambda c: -key(c))
    seeds = ", ".join(map(str, common))
    return (
        f"ordering ours {' > '.join(ours)} (seed{'s' if len(common) > 1 else ''} {seeds}, common to these rows"
        + (", mean ratio over 8-0 paired by seed" if paired else ", mean own-rollout reward")
        + f"); paper {' > '.join(present)} ({'same' if ours == present else 'different'})"
    )


def run_parallel(cfg, args: argparse.Namespace, run_dir: Path) -> None:
    """Every (configuration, seed) run in its own process, ``args.jobs`` at a time (each with the experiment's
    ``torch_threads``); one failed run fails the benchmark after the others finish."""
    import subprocess

    base = [sys.executable, str(Path(__file__).resolve()), "--run-dir", str(run_dir), "--no-report"]
    base += ["--quick"] if args.quick else ["--smoke"] if args.smoke else []
    base += ["--config", str(args.config)] if args.config else []
    for o in args.overrides:
        base += ["--set", o]
    todo = [(v.name, s) for v in cfg.configurations for s in cfg.seeds]
    running: list[tuple[subprocess.Popen, str]] = []
    failed = []
    while todo or running:
        while todo and len(running) < args.jobs:
            name, seed = todo.pop(0)
            cmd = [*base, "--only", name, "--set", f"seeds=[{seed}]"]
            running.append((subprocess.Popen(cmd), f"{name} seed {seed}"))
        time.sleep(1.0)
        for proc, label in list(running):
            if proc.poll() is not None:
                running.remove((proc, label))
                if proc.returncode != 0:
                    failed.append(label)
    if failed:
        raise SystemExit(f"runs failed: {', '.join(failed)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="configs/sim/sapo-quick.yaml")
    mode.add_argument("--smoke", action="store_true", help="sapo-quick.yaml with its quick: overrides (seconds)")
    ap.add_argument("--config", type=Path, help="another experiment file with the same row names (default sapo.yaml)")
    ap.add_argument("--run-dir", type=Path, help="where the per-node metrics go (default runs/b4_sapo[_quick])")
    ap.add_argument("--out", type=Path, help="the results Markdown file")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="experiment override key=value")
    ap.add_argument("--only", help="comma-separated configuration names to run (others in the run dir are kept)")
    ap.add_argument("--analyze", action="store_true", help="run nothing; report on what the run dir holds")
    ap.add_argument("--jobs", type=int, default=1, help="(configuration, seed) runs in parallel processes")
    ap.add_argument("--no-report", action="store_true", help=argparse.SUPPRESS)  # a --jobs worker
    args = ap.parse_args()

    from benchmarks.analysis import sapo_b4 as sa
    from node.config import LearnerConfig
    from protocol.config import write_resolved
    from sim.config import load_sim_config
    from sim.runner import run_experiment

    suffix = "_quick" if args.quick else "_smoke" if args.smoke else ""
    default = "sapo-quick.yaml" if (args.quick or args.smoke) else "sapo.yaml"
    config = args.config or ROOT / "configs" / "sim" / default
    cfg = load_sim_config(str(config), args.overrides, quick=args.smoke)
    run_dir = args.run_dir or ROOT / "runs" / f"b4_sapo{suffix}"
    out = args.out or ROOT / "benchmarks" / "results" / f"b4_sapo{suffix}.md"
    order = [v.name for v in cfg.configurations]
    wall = None
    if not args.analyze:
        if args.only:
            wanted = args.only.split(",")
            unknown = sorted(set(wanted) - set(order))
            if unknown:
                ap.error(f"--only names unknown configurations {unknown}; known: {order}")
            cfg = cfg.model_copy(update={"configurations": [v for v in cfg.configurations if v.name in wanted]})
        for v in cfg.configurations:  # a rerun replaces its own runs only
            for seed in cfg.seeds:
                shutil.rmtree(run_dir / v.name / f"seed{seed}", ignore_errors=True)
        t0 = time.perf_counter()
        if args.jobs > 1:
            run_parallel(cfg, args, run_dir)
        else:
            write_resolved(cfg, run_dir / "resolved" / "+".join(v.name for v in cfg.configurations))
            run_experiment(cfg, run_dir, progress=lambda line: print(line, file=sys.stderr, flush=True))
        wall = time.perf_counter() - t0
        if args.no_report:
            return 0

    results = sa.collect(run_dir)
    rows = sa.summary_rows(results, order)
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = out.with_suffix("")
    names = [r["config"] for r in rows]
    main_rows = [n for n in names if len(n.split("-")) == 4]
    plots = {
        "own-rollout reward": sa.plot_curves(results, main_rows, Path(f"{stem}_reward.png"), "reward_mean"),
        "training-batch reward": sa.plot_curves(results, main_rows, Path(f"{stem}_batch.png"), "batch_reward_mean"),
        "aha propagation": sa.plot_propagation(
            results, [n for n in main_rows if n.endswith(("-8-0", "-4-4"))], Path(f"{stem}_aha.png")
        ),
    }
    lines = [
        f"# B4 SAPO ({config.name}{' --smoke' if args.smoke else ''})",
        "",
        f"Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Machine: {machine_info()}  ",
        f"Setup: {max((len(r.nodes) for runs in results.values() for r in runs), default=0)} nodes per run "
        f"(steps and seeds per row in the table), policy {cfg.policy}, torch threads {cfg.torch_threads}"
        + (f"; wall time of this invocation {wall / 60:.1f} min." if wall is not None else "."),
        "",
        "Own-rollout reward: the reward of the node's own completions (reasoning-gym's score, partial credit "
        "included), summed over nodes and steps (primary); own exact: the same count of completions whose answer is "
        "exactly right. Held-out: exact-match accuracy on problems no node trains on. Batch reward: the reward of "
        "what the learner trained on (own plus selected peers' groups); it is not the node's skill. Ratios are "
        "paired by seed with the row's 8-0; ± is the standard deviation over seeds.",
        "",
        sa.markdown_summary(rows),
        "",
        *[f"- {v}" for v in verdict(rows)],
        *[f"- headroom: {v}" for v in headroom(results, rows)],
        *[f"- ceiling: {v}" for v in ceiling(results, rows)],
        "- paper (8 x Qwen2.5-0.5B, 2000 rounds, batch reward): " + ", ".join(f"{k} = {v}" for k, v in PAPER.items()),
        "",
        "## Held-out accuracy per family at the end (gain since step 0)",
        "",
        sa.heldout_by_family(results, names),
        "",
    ]
    sweep = sa.lr_sweep(rows, LearnerConfig.model_validate(cfg.node.get("learner", {})).lr)
    if sweep:
        lines += ["## Learning-rate sweep (best rate for 8/0 and 4/4 each)", "", *sweep]
    for prefix in dict.fromkeys("-".join(n.split("-")[:2]) for n in main_rows):
        splits = [f"{prefix}-{s}" for s in PAPER_ORDER[:-1] if f"{prefix}-{s}" in results]
        table = sa.splits_by_length(results, splits, f"{prefix}-8-0") if len(splits) > 1 else ""
        if table:
            lines += [f"## {prefix}: the splits by run length (own-rollout reward over steps 1..K)", "", table, ""]
    lines += [
        "## Aha propagation (share of nodes whose own success rose; first rise; mean lag of the others, steps)",
        "",
    ]
    for name in [n for n in main_rows if n.endswith(("-8-0", "-4-4"))]:
        prop = sa.propagation(results, name)
        cells = ", ".join(
            f"{f}: {p['share']:.2f} rose"
            + (f", first {p['first']:.0f}" if p.get("first") is not None else "")
            + (f", lag {p['lag']:.0f}" if p.get("lag") is not None else "")
            for f, p in sorted(prop.items())
        )
        lines.append(f"- {name}: {cells}")
    lines.append("")
    for title, path in plots.items():
        if path is not None:
            lines.append(f"![{title}]({path.name})")
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    (out.with_suffix(".json")).write_text(json.dumps(rows, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
