"""B4 SAPO: the I/J table of the SAPO paper (arXiv 2509.08721) reproduced in the in-process simulator.

8 nodes with the built-in tiny model, the same budget per node per step (8 prompts x G completions generated,
I + J = 8 groups trained on), configurations 8/0, 6/2, 4/4, 2/6, 3 seeds. Cumulative reward = reward_mean summed
over nodes and steps, averaged over seeds. Target (BENCHMARKS.md): 4/4 / 8/0 >= 1.94 (the paper's +94%) and
the paper's ordering (4/4 > 2/6 > 6/2 > 8/0; paper totals 1093.31, 945.87, 854.43, 561.79).

    python benchmarks/b4_sapo.py            # configs/sim/sapo.yaml (long: run it in the background)
    python benchmarks/b4_sapo.py --quick    # configs/sim/sapo-quick.yaml (< 20 min on 2 cores)
    python benchmarks/b4_sapo.py --smoke    # sapo-quick's own quick overrides (seconds; run by a test)

Writes ``benchmarks/results/b4_sapo.md`` (``b4_sapo_quick.md`` / ``b4_sapo_smoke.md``; or ``--out``) with
machine info, the date, the table with ratios vs 8/0, and the reward-curve plot next to it.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import machine_info  # noqa: E402

PAPER = {"8-0": 561.79, "6-2": 854.43, "4-4": 1093.31, "2-6": 945.87}


def verdict(rows: list[dict]) -> list[str]:
    by = {r["config"]: r["cumulative_reward"] for r in rows}
    out = []
    if "8-0" in by and "4-4" in by and by["8-0"] > 0:
        ratio = by["4-4"] / by["8-0"]
        out.append(f"4/4 vs 8/0: {ratio:.3f} (target >= 1.94: {'PASS' if ratio >= 1.94 else 'FAIL'})")
    present = [c for c in ("4-4", "2-6", "6-2", "8-0") if c in by]
    ours = sorted(present, key=lambda c: -by[c])
    out.append(
        f"ordering: ours {' > '.join(ours)}; paper {' > '.join(present)} ({'same' if ours == present else 'different'})"
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="configs/sim/sapo-quick.yaml")
    mode.add_argument("--smoke", action="store_true", help="sapo-quick.yaml with its quick: overrides (seconds)")
    ap.add_argument("--run-dir", type=Path, help="where the per-node metrics go (default runs/b4_sapo[_quick])")
    ap.add_argument("--out", type=Path, help="the results Markdown file")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="experiment override key=value")
    args = ap.parse_args()

    from protocol.config import write_resolved
    from sim.config import load_sim_config
    from sim.report import markdown_table, write_report
    from sim.runner import run_experiment

    suffix = "_quick" if args.quick else "_smoke" if args.smoke else ""
    config = ROOT / "configs" / "sim" / ("sapo-quick.yaml" if (args.quick or args.smoke) else "sapo.yaml")
    cfg = load_sim_config(str(config), args.overrides, quick=args.smoke)
    run_dir = args.run_dir or ROOT / "runs" / f"b4_sapo{suffix}"
    out = args.out or ROOT / "benchmarks" / "results" / f"b4_sapo{suffix}.md"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    write_resolved(cfg, run_dir)
    t0 = time.perf_counter()
    run_experiment(cfg, run_dir, progress=lambda line: print(line, file=sys.stderr, flush=True))
    wall = time.perf_counter() - t0
    rows = write_report(run_dir, title=cfg.name, order=[v.name for v in cfg.configurations])
    plot = out.with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "rewards.png", plot)
    lines = [
        f"# B4 SAPO I/J ({config.name}{' --smoke' if args.smoke else ''})",
        "",
        f"Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Machine: {machine_info()}  ",
        f"Setup: {cfg.nodes} nodes, {cfg.steps} steps, seeds {cfg.seeds}, policy {cfg.policy}, "
        f"torch threads {cfg.torch_threads}; wall time {wall / 60:.1f} min.",
        "",
        markdown_table(rows),
        *[f"- {v}" for v in verdict(rows)],
        "- paper (8 x Qwen2.5-0.5B, 2000 rounds): " + ", ".join(f"{k} = {v}" for k, v in PAPER.items()),
        "",
        f"![reward curves]({plot.name})",
    ]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
