"""B6 MNPO: HT-MNPO / TD-MNPO vs the two-player baselines (IPO, DPO) on a non-transitive population game.

The game (``sim.experiments.mnpo_game.run_game``): a population of categorical players over a fixed response set, each
with its own heterogeneous, rock-paper-scissors-like preference oracle; the real MNPO / DPO loss code and the real
``swarm.mnpo`` opponent bookkeeping. Same budget for every method. Target: MNPO's duality gap lower
and its win rate against the population higher than the two-player (n = 2) baselines'.

    python benchmarks/b6_mnpo.py               # configs/sim/mnpo.yaml game, 3 seeds, plus part (a): real tiny-model
                                               # nodes on a verifiable task (minutes on 2 cores)
    python benchmarks/b6_mnpo.py --no-nodes    # the game only
    python benchmarks/b6_mnpo.py --quick       # a small game (seconds; run by a test)

Writes ``benchmarks/results/b6_mnpo.md`` (``b6_mnpo_quick.md``; or ``--out``) with the machine, the date, the
tables and the plots next to it.
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

from benchmarks.common.machine import machine_info  # noqa: E402


def verdict(rows: list[dict]) -> list[str]:
    """The B6 targets: each MNPO variant vs the best two-player baseline."""
    by = {r["method"]: r for r in rows}
    base = [by[m] for m in ("ipo", "dpo") if m in by]
    out = []
    if not base:
        return ["no two-player baseline in the run"]
    best_gap = min(b["gap"] for b in base)
    best_win = max(b["win_league"] for b in base)
    for m in ("ht_mnpo", "td_mnpo"):
        if m not in by:
            continue
        r = by[m]
        gap_ok = r["gap"] < best_gap
        win_ok = r["win_league"] > best_win
        out.append(
            f"{m}: duality gap {r['gap']:.4f} vs best two-player {best_gap:.4f} "
            f"({'lower: PASS' if gap_ok else 'FAIL'}); "
            f"win rate vs league {r['win_league']:.4f} vs {best_win:.4f} ({'higher: PASS' if win_ok else 'FAIL'})"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small game only (seconds)")
    ap.add_argument("--no-nodes", action="store_true", help="skip part (a), the real tiny-model nodes")
    ap.add_argument("--seeds", type=int, default=3, help="game seeds (full mode)")
    ap.add_argument("--run-dir", type=Path, help="where runs go (default runs/b6_mnpo[_quick])")
    ap.add_argument("--out", type=Path, help="the results Markdown file")
    args = ap.parse_args()

    from sim.config import load_sim_config
    from sim.experiments.mnpo_game import game_rows, game_table, node_rows, node_table, plot_game, run_game
    from sim.runner import run_experiment

    suffix = "_quick" if args.quick else ""
    config = ROOT / "configs" / "sim" / "mnpo.yaml"
    sim = load_sim_config(str(config), quick=args.quick)
    game = sim.mnpo_game
    assert game is not None
    seeds = [0] if args.quick else list(range(args.seeds))
    if args.quick:
        game = game.model_copy(update={"players": 4, "steps": 30, "eval_every": 10})
    run_dir = args.run_dir or ROOT / "runs" / f"b6_mnpo{suffix}"
    out = args.out or ROOT / "benchmarks" / "results" / f"b6_mnpo{suffix}.md"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    results = []
    for method in game.methods:
        for seed in seeds:
            results.append(run_game(game, method, seed))
            print(f"game {method} seed {seed} done", file=sys.stderr, flush=True)
    t_game = time.perf_counter() - t0
    rows = game_rows(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    plots = []
    for p in plot_game(results, run_dir):
        dest = out.parent / f"{out.stem}_{p.stem.removeprefix('mnpo_')}.png"
        shutil.copyfile(p, dest)
        plots.append(dest)
    lines = [
        f"# B6 MNPO ({config.name}{' --quick' if args.quick else ''})",
        "",
        f"Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Machine: {machine_info()}  ",
        f"Game: {game.players} players per method, {game.responses} responses, cyclic {game.cyclic}, transitive "
        f"{game.transitive}, heterogeneity {game.heterogeneity}; {game.steps} steps, {game.samples_per_step} samples "
        f"and {game.pairs_per_step} pairs per player per step, Adam lr {game.lr}, eta {game.eta}, ratio {game.ratio}, "
        f"dpo beta {game.dpo_beta}; seeds {seeds}; wall time {t_game:.0f} s.",
        "",
        "Duality gap = 2 max_a (P pi)_a - 1 under the population-level preference P (exact for categorical "
        "policies; 0 at the Nash equilibrium). Win rate vs league = pi^T P sigma against sigma, the mixture of every "
        "method's final players. Mean ± std over seeds.",
        "",
        game_table(rows),
        *[f"- {v}" for v in verdict(rows)],
        "",
        *[f"![{p.stem}]({p.name})" for p in plots],
    ]
    if not (args.quick or args.no_nodes):
        node_sim = sim.model_copy(update={"mnpo_game": None})
        t1 = time.perf_counter()
        run_experiment(node_sim, run_dir / "nodes", progress=lambda line: print(line, file=sys.stderr, flush=True))
        n_rows = node_rows(run_dir / "nodes", [v.name for v in sim.configurations])
        lines += [
            "",
            "## (a) Verifiable task, real tiny model (in-process simulator)",
            "",
            f"{sim.nodes} nodes x {sim.steps} rounds per method, seeds {list(sim.seeds)}, MNPO only (no GRPO update); "
            f"reward = mean verifier reward of each node's MNPO responses; wall time {time.perf_counter() - t1:.0f} s.",
            "",
            node_table(n_rows),
        ]
    text = "\n".join(lines) + "\n"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
