"""The MNPO experiment (B6): HT-MNPO vs TD-MNPO vs two-player baselines, on tasks and on a non-transitive game.

Two parts, written into one report (``OUT/mnpo.md``, ``OUT/mnpo_gap.png``, ``OUT/mnpo_winrate.png``):

(a) **verifiable tasks**: the experiment's ``configurations`` (one per method, e.g. ``mnpo.opponents: peers`` /
    ``history`` / ``none`` and ``mnpo.loss: dpo``) run as ordinary simulator runs of real nodes (``sim.inprocess``)
    with the tiny model; this module reads their metrics: reward gain (mean reward of the last third of the steps
    minus the first third) and how many opponents the pairs had.
(b) **non-transitive population game** (:class:`MnpoGameConfig`): ``players`` categorical policies over a fixed set
    of ``responses`` responses, each judged by its own heterogeneous oracle with a rock-paper-scissors-like cyclic
    part (``node.mnpo.oracles.SyntheticOracle.population``). Each step every player samples responses into a shared
    pool, cross-scores the pool (``swarm.scores.ScoreBatch`` into a ``swarm.mnpo.ScoreBook``), builds pairs with its
    oracle, picks opponents with ``swarm.mnpo.select_opponents`` and takes one step of the real loss
    (``node.learn.losses.mnpo_loss`` / ``dpo_loss``, through the loss registry). Every method gets the same budget
    (steps, samples, pairs, lr).
    Metrics, exact for categorical policies under the population-level preference ``P``:

    * duality gap of ``pi``: ``2 max_a (P pi)_a - 1`` (0 exactly at the symmetric Nash equilibrium; the best
      response's win rate against ``pi``, rescaled), per player and for the method's mixture policy;
    * win rate of each player against the initial population (over steps) and against the *league*: the mixture
      of every method's final players (the population all methods end up in).

Knows nothing about how nodes are run (``sim.inprocess``); only reads their metrics files and
writes its tables with the simulator's report helpers (``sim.report.summary``).
"""

from __future__ import annotations

import logging
import random
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.config import METHODS, MnpoGameConfig, SimConfig
from sim.report.summary import collect, md_table

logger = logging.getLogger(__name__)

_OPPONENTS = {"ht_mnpo": "peers", "td_mnpo": "history", "ipo": "none", "dpo": "none"}

# ----------------------------------------------------------------------------------------------------- the game


def _pi(theta: Any) -> list[float]:
    import torch

    return torch.softmax(theta.detach().double(), -1).tolist()


def duality_gap(matrix: list[list[float]], pi: list[float]) -> float:
    """``2 max_a sum_b P[a][b] pi[b] - 1``: how much the best response beats ``pi`` (0 at the Nash equilibrium)."""
    return 2.0 * max(sum(row[b] * pi[b] for b in range(len(pi))) for row in matrix) - 1.0


def win_rate(matrix: list[list[float]], pi: list[float], sigma: list[float]) -> float:
    """``Pr(y ~ pi beats y' ~ sigma) = pi^T P sigma``."""
    k = len(pi)
    return sum(pi[a] * matrix[a][b] * sigma[b] for a in range(k) for b in range(k))


def _mix(pis: list[list[float]]) -> list[float]:
    return [sum(p[a] for p in pis) / len(pis) for a in range(len(pis[0]))]


def run_game(cfg: MnpoGameConfig, method: str, seed: int) -> dict[str, Any]:
    """Play ``cfg`` with ``method`` for ``seed``; returns curves (gap, win rate vs the start) and final policies."""
    import torch

    from node.learn.losses import get_loss, opponent_tensors
    from node.mnpo.oracles import SyntheticOracle, response_text
    from protocol.types import TaskRef
    from swarm.mnpo import History, Pair, Response, ScoreBook, choose_pairs, select_opponents
    from swarm.scores import ScoreBatch, response_hash

    n, k = cfg.players, cfg.responses
    pop, oracles = SyntheticOracle.population(
        n, k, cyclic=cfg.cyclic, transitive=cfg.transitive, heterogeneity=cfg.heterogeneity, seed=seed
    )
    task = TaskRef("synthetic", {}, seed, 0)
    resp = [Response(response_hash(task, response_text(a)), task, response_text(a), "", 0) for a in range(k)]
    gen = torch.Generator().manual_seed(seed)  # the same start for every method
    thetas = [
        (torch.randn(k, generator=gen, dtype=torch.float64) * cfg.init_spread).requires_grad_(True) for _ in range(n)
    ]
    refs = [torch.log_softmax(t.detach(), -1) for t in thetas]
    start = _mix([_pi(t) for t in thetas])
    opts = [torch.optim.Adam([t], lr=cfg.lr) for t in thetas]
    histories = [History(cfg.history) for _ in range(n)]
    rng = random.Random(f"mnpo-game:{seed}:{method}")
    sample_gen = torch.Generator().manual_seed(seed + 1)
    source = _OPPONENTS[method]
    spec = get_loss("dpo" if method == "dpo" else "mnpo")
    matrix = pop.matrix
    curve: list[dict[str, float]] = []
    stats = {"pairs": 0.0, "peer_opponents": 0.0, "self_opponents": 0.0}

    def evaluate(step: int) -> None:
        pis = [_pi(t) for t in thetas]
        curve.append(
            {
                "step": float(step),
                "gap": statistics.fmean(duality_gap(matrix, p) for p in pis),
                "gap_mixture": duality_gap(matrix, _mix(pis)),
                "win_rate_vs_start": statistics.fmean(win_rate(matrix, p, start) for p in pis),
            }
        )

    evaluate(0)
    for step in range(1, cfg.steps + 1):
        logps = [torch.log_softmax(t.detach(), -1) for t in thetas]
        pool: set[int] = set()
        for i in range(n):
            draws = torch.multinomial(logps[i].exp(), cfg.samples_per_step, replacement=True, generator=sample_gen)
            pool.update(int(a) for a in draws)
        pooled = sorted(pool)
        book = ScoreBook()  # what each player hears this step: every other player's scores on the pool
        batches = [
            ScoreBatch(
                0,
                "categorical",
                "-",
                step,
                tuple(resp[a].hash for a in pooled),
                tuple(float(logps[i][a]) for a in pooled),
            )
            for i in range(n)
        ]
        for i in range(n):
            histories[i].record(step, batches[i].as_dict())
        for i in range(n):
            if source == "peers":
                book = ScoreBook()
                for j in range(n):
                    if j != i:
                        book.add(f"p{j}", step, batches[j])
            texts = [resp[a].text for a in pooled]
            cands = []
            for w, lo in oracles[i].pairs(task, texts, rng):
                opps = select_opponents(
                    resp[pooled[w]].hash,
                    resp[pooled[lo]].hash,
                    source=source,  # type: ignore[arg-type]
                    book=book,
                    history=histories[i],
                    max_opponents=cfg.max_opponents,
                    rng=rng,
                )
                cands.append(Pair(resp[pooled[w]], resp[pooled[lo]], tuple(opps)))
            # the same number of pairs for every method: sample with replacement up to pairs_per_step
            chosen = choose_pairs(cands, cfg.pairs_per_step, rng)
            if not chosen:
                continue
            while len(chosen) < cfg.pairs_per_step:
                chosen.append(chosen[rng.randrange(len(chosen))])
            stats["pairs"] += len(chosen)
            stats["peer_opponents"] += sum(p.peer_opponents for p in chosen)
            stats["self_opponents"] += sum(len(p.opponents) - p.peer_opponents for p in chosen)
            idx = {r.hash: a for a, r in enumerate(resp)}
            a_w = torch.tensor([idx[p.win.hash] for p in chosen])
            a_l = torch.tensor([idx[p.lose.hash] for p in chosen])
            opp_w, opp_l, mask = opponent_tensors(
                [[(o.lp_w, o.lp_l) for o in p.opponents] for p in chosen], cfg.max_opponents, torch.float64
            )  # (P, J) each
            lp = torch.log_softmax(thetas[i], -1)
            loss, _ = spec.fn(lp[a_w], lp[a_l], refs[i][a_w], refs[i][a_l], opp_w, opp_l, mask, **spec.kwargs(cfg))
            opts[i].zero_grad()
            loss.backward()
            opts[i].step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            evaluate(step)
    pairs = max(stats["pairs"], 1.0)
    return {
        "method": method,
        "seed": seed,
        "curve": curve,
        "final": [_pi(t) for t in thetas],
        "matrix": matrix,
        "peer_opponents": stats["peer_opponents"] / pairs,
        "self_opponents": stats["self_opponents"] / pairs,
    }


def game_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method: final gap (players, mixture), win rates vs the league and vs the start, opponents."""
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        by_seed.setdefault(r["seed"], []).append(r)
    per_method: dict[str, dict[str, list[float]]] = {}
    for runs in by_seed.values():
        league = _mix([p for r in runs for p in r["final"]])
        for r in runs:
            m = r["matrix"]
            d = per_method.setdefault(r["method"], {})
            d.setdefault("gap", []).append(r["curve"][-1]["gap"])
            d.setdefault("gap_mixture", []).append(r["curve"][-1]["gap_mixture"])
            d.setdefault("gap_start", []).append(r["curve"][0]["gap"])
            d.setdefault("win_league", []).append(statistics.fmean(win_rate(m, p, league) for p in r["final"]))
            d.setdefault("win_start", []).append(r["curve"][-1]["win_rate_vs_start"])
            d.setdefault("peer_opponents", []).append(r["peer_opponents"])
            d.setdefault("self_opponents", []).append(r["self_opponents"])
    rows = []
    for method, d in per_method.items():
        row: dict[str, Any] = {"method": method, "seeds": len(d["gap"])}
        for key, vals in d.items():
            row[key] = statistics.fmean(vals)
            row[key + "_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        rows.append(row)
    return rows


def game_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "method",
        "seeds",
        "duality gap (players)",
        "gap (mixture)",
        "gap at start",
        "win rate vs league",
        "win rate vs start",
        "peer opp./pair",
        "own-history opp./pair",
    )
    body = [
        (
            r["method"],
            r["seeds"],
            f"{r['gap']:.4f} ± {r['gap_std']:.4f}",
            f"{r['gap_mixture']:.4f}",
            f"{r['gap_start']:.4f}",
            f"{r['win_league']:.4f} ± {r['win_league_std']:.4f}",
            f"{r['win_start']:.4f}",
            f"{r['peer_opponents']:.2f}",
            f"{r['self_opponents']:.2f}",
        )
        for r in rows
    ]
    return md_table(head, body)


def plot_game(results: list[dict[str, Any]], out: Path) -> list[Path]:
    """``mnpo_gap.png`` (duality gap over steps) and ``mnpo_winrate.png`` (win rate vs the starting population)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, name, ylabel in (
        ("gap", "mnpo_gap.png", "duality gap (mean over players)"),
        ("win_rate_vs_start", "mnpo_winrate.png", "win rate vs the starting population"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        methods = sorted({r["method"] for r in results}, key=lambda m: METHODS.index(m))
        for method in methods:
            runs = [r for r in results if r["method"] == method]
            steps = [c["step"] for c in runs[0]["curve"]]
            vals = [statistics.fmean(r["curve"][i][key] for r in runs) for i in range(len(steps))]
            ax.plot(steps, vals, label=method, linewidth=1.5)
        ax.set_xlabel("learner step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / name)
        plt.close(fig)
        paths.append(out / name)
    return paths


# ------------------------------------------------------------------------------------------ part (a): the nodes


def node_rows(out: Path, order: list[str]) -> list[dict[str, Any]]:
    """Per configuration (method on the real tiny model): reward at start / end, gain, opponents per pair."""
    rows = []
    for res in collect(out, order):
        starts: list[float] = []
        ends: list[float] = []
        peer: list[float] = []
        own: list[float] = []
        pairs: list[float] = []
        for run in res.runs:
            for series in run.nodes.values():
                if not series:
                    continue
                third = max(1, len(series) // 3)
                rewards = [float(r.get("reward_mean", 0.0)) for r in series]
                starts.append(statistics.fmean(rewards[:third]))
                ends.append(statistics.fmean(rewards[-third:]))
                peer.extend(float(r.get("mnpo_peer_opponents", 0.0)) for r in series if r.get("mnpo_pairs"))
                own.extend(float(r.get("mnpo_self_opponents", 0.0)) for r in series if r.get("mnpo_pairs"))
                pairs.extend(float(r.get("mnpo_pairs", 0.0)) for r in series)
        if not starts:
            continue
        rows.append(
            {
                "config": res.name,
                "nodes": max(len(r.nodes) for r in res.runs),
                "steps": max(r.max_step() for r in res.runs),
                "start": statistics.fmean(starts),
                "end": statistics.fmean(ends),
                "gain": statistics.fmean(ends) - statistics.fmean(starts),
                "pairs": statistics.fmean(pairs) if pairs else 0.0,
                "peer": statistics.fmean(peer) if peer else 0.0,
                "own": statistics.fmean(own) if own else 0.0,
            }
        )
    return rows


def node_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "config",
        "nodes",
        "steps",
        "reward (first third)",
        "reward (last third)",
        "gain",
        "pairs/step",
        "peer opp./pair",
        "own-history opp./pair",
    )
    body = [
        (
            r["config"],
            r["nodes"],
            r["steps"],
            f"{r['start']:.3f}",
            f"{r['end']:.3f}",
            f"{r['gain']:+.3f}",
            f"{r['pairs']:.1f}",
            f"{r['peer']:.2f}",
            f"{r['own']:.2f}",
        )
        for r in rows
    ]
    return md_table(head, body)


def run_mnpo_report(sim: SimConfig, out: str | Path, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Part (b) for every seed and method, then ``mnpo.md`` with both parts and the plots; returns the rows."""
    import time

    import torch

    out = Path(out)
    cfg = sim.mnpo_game
    if cfg is None:
        raise ValueError("the experiment has no mnpo_game: section")
    torch.set_num_threads(sim.torch_threads)
    results = []
    for method in cfg.methods:
        for seed in sim.seeds:
            t0 = time.perf_counter()
            results.append(run_game(cfg, method, seed))
            wall = time.perf_counter() - t0
            line = f"mnpo game {method} seed {seed}: {cfg.players} players x {cfg.steps} steps in {wall:.1f}s"
            logger.info(line)
            if progress is not None:
                progress(line)
    g_rows = game_rows(results)
    n_rows = node_rows(out, [v.name for v in sim.configurations])
    plots = plot_game(results, out)
    md = [
        f"# {sim.name}: MNPO on the swarm population (B6)\n",
        "## (b) Non-transitive population game\n",
        f"{cfg.players} categorical players per method over {cfg.responses} responses; heterogeneous per-player "
        f"oracles (cyclic {cfg.cyclic}, transitive {cfg.transitive}, heterogeneity {cfg.heterogeneity}); "
        f"{cfg.steps} steps, {cfg.pairs_per_step} pairs/step, lr {cfg.lr}, eta {cfg.eta}, ratio {cfg.ratio}, "
        f"seeds {list(sim.seeds)}. Duality gap = 2 max_a (P pi)_a - 1 under the population preference P (exact); "
        "win rate vs league = against the mixture of all methods' final players.\n",
        game_table(g_rows),
        f"\nPlots: {', '.join(p.name for p in plots)}\n",
    ]
    if n_rows:
        md += [
            "\n## (a) Verifiable tasks, real tiny model (in-process simulator)\n",
            f"{sim.nodes} nodes x {sim.steps} rounds per configuration; reward = the node's mean verifier reward on "
            "its MNPO responses (reward_mean).\n",
            node_table(n_rows),
        ]
    (out / "mnpo.md").write_text("\n".join(md))
    if progress is not None:
        progress(game_table(g_rows) + (node_table(n_rows) if n_rows else ""))
        progress(f"MNPO results in {out}/mnpo.md")
    return {"game": g_rows, "nodes": n_rows, "results": results}


def mean_curve(results: list[dict[str, Any]], method: str, key: str) -> list[float]:
    """The mean over seeds of ``key`` along the evaluation steps of ``method``."""
    runs = [r for r in results if r["method"] == method]
    return [statistics.fmean(r["curve"][i][key] for r in runs) for i in range(len(runs[0]["curve"]))]


__all__ = ["METHODS", "MnpoGameConfig", "duality_gap", "run_game", "run_mnpo_report", "win_rate"]
