"""B6 on real models: MNPO on a SmolLM2 population against DPO and GRPO, on held-out problems.

Three real ``swarm-node join`` processes over hivemind on 127.0.0.1 (``sim.multiproc``), each SmolLM2-135M with B8's
format warm start (it states answers as ``<answer>...</answer>``, so what moves is the answer), on one family's
training split. Arms (the experiment's configurations), all at one generation budget of 32 completions a step:

* ``grpo``: GRPO on the node's own groups (4 prompts x 8), no MNPO;
* ``dpo``: DPO against the reference (n = 2), MNPO's phase only, 8 shared prompts x 4 responses a step;
* ``dpo_no_length``: DPO with the oracle's length tie-break off (``oracle.shorter_wins: false``), a diagnostic arm:
  populations that narrowed onto few answers (DPO seed 1, HT- and TD-MNPO seed 0) trained more and more on "the
  shorter of two wrong answers"; without such pairs, does the population still collapse?
* ``ipo``: MNPO's loss with no opponent (the reference alone: IPO, MNPO's n = 2 case), a diagnostic arm: against
  DPO it measures the loss's form (a squared distance to the target margin ``1 / (2 eta)`` instead of DPO's
  logistic), against HT-/TD-MNPO what the opponents add;
* ``td_mnpo``: the MNPO loss against the node's own past policy versions (TD-MNPO);
* ``ht_mnpo``: the MNPO loss against the peers as players, from their signed ``scores`` records (HT-MNPO);
* ``grpo_mnpo``: GRPO on even steps, HT-MNPO on odd steps (32 completions a step either way).

The preference oracle is the task's verifier, exact answer first (``mnpo.oracle: {type: verifiable, rank: exact}``):
a right answer beats a wrong one; between two equally right (or wrong) ones, an answer in the format beats none, then
the shorter text wins; equal on all three makes no pair. Partial credit never decides. Every node evaluates on the
same held-out items (problems no node trained on).

Every player answers the same 8 prompts within an MNPO window of 120 s (``--window-span 8`` protocol windows of
15 s), and pools the last two windows' responses (240 s), which outlasts a node step (100-180 s on 2 cores): peers'
responses were then 61-63% of a node's pool over DPO seed 0. With one protocol window (15 s), the players' steps
fell in different windows, so they answered different prompts: in the first 20 steps of DPO seed 0 that way,
peers' responses were 21-27% of a node's pool and 6-10 of each node's 40-47 peers' ``scores`` records arrived for a
window already gone; HT-MNPO would have had almost no peer to play against.

40 steps (``--steps``): with the pool shared, a step trains on all 16 pairs (32 sequences, as many as GRPO's 4 x 8),
which takes 100-210 s with three nodes on 2 cores, about 1.7-2.2 hours an arm and seed with the evaluations.

    python benchmarks/b6_real.py run --seeds 0 1 2        # resumable, seed by seed
    python benchmarks/b6_real.py run --arms dpo ht_mnpo td_mnpo --seeds 0   # the target's arms first; the rest later
    python benchmarks/b6_real.py run --quick --seeds 0    # 2 steps of two tiny-model nodes, two arms: a smoke run
    python benchmarks/b6_real.py report
    python benchmarks/b6_real.py run --device cuda --engine transformers --jobs 6 --window-span 1   # a lent GPU
    python benchmarks/b6_real.py report --until 20    # runs cut short: at a step every run reached

The report (``benchmarks/results/b6_real.md``), per arm, mean ± sd over seeds of the arm's nodes' mean: held-out
exact gain (sampled), greedy and pass@8 gains; the win rate against the league (the final policies of every arm that
finished the same seed) when only exactness is judged, from the per-item exact counts of the final evaluations; and
the empirical duality gap of the arm's population (how much the league's best policy beats it). Exactness is a
transitive judge: the win rate is then ``1/2 + (accuracy - opponent's accuracy) / 2`` and the gap the league's best
accuracy minus the arm's, which the report says. A verifier cannot show MNPO's edge on non-transitive preferences;
what it can show is whether MNPO's loss and opponents learn more from the same completions than DPO's. MNPO's
metrics (pairs a step, opponents covering a pair) say what limited it. Target: MNPO's held-out exact gain beats
DPO's beyond 2 sd.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.b8_learning import CANDIDATES, families_of, mean_sd  # noqa: E402
from benchmarks.common.machine import machine_info  # noqa: E402
from benchmarks.common.multirun import (  # noqa: E402
    experiment_cli,
    prebuild,
    prepare,
    read_evals,
    report_rows,
    run_pending,
    write_results,
)

RESULTS = ROOT / "benchmarks" / "results"
WORK = Path(os.environ.get("RL_SWARM_BENCH_DIR", Path.home() / ".cache" / "rl-swarm" / "bench")) / "b6_real"
#: Arm -> (node overrides, description). MNPO's phase: 8 shared prompts x 4 responses = GRPO's 4 x 8.
ARMS: dict[str, tuple[dict[str, Any], str]] = {
    "grpo": ({"mnpo": {"schedule": "off"}}, "GRPO on own groups, no MNPO"),
    "dpo": ({"mnpo": {"schedule": "only", "opponents": "none", "loss": "dpo"}}, "DPO against the reference (n = 2)"),
    "dpo_no_length": (
        {"mnpo": {"schedule": "only", "opponents": "none", "loss": "dpo", "oracle": {"shorter_wins": False}}},
        "DPO with no length tie-break in the oracle (two wrong answers in the format: no pair)",
    ),
    "ipo": ({"mnpo": {"schedule": "only", "opponents": "none"}}, "MNPO's loss with no opponent (IPO, n = 2)"),
    "td_mnpo": ({"mnpo": {"schedule": "only", "opponents": "history"}}, "MNPO against own past versions"),
    "ht_mnpo": ({"mnpo": {"schedule": "only", "opponents": "peers"}}, "MNPO against the peers (scores records)"),
    "grpo_mnpo": ({"mnpo": {"schedule": "alternate", "opponents": "peers"}}, "GRPO and HT-MNPO steps alternating"),
}
QUICK_ARMS = ["dpo", "ht_mnpo"]
#: What limits the preference signal, per MNPO step (``MnpoPhase.pair_diagnostics``): the chosen pairs a right answer
#: decided over a wrong one and their share of the update's pull (the loss's per-pair weight), the candidate pairs,
#: the oracle's ties (pairs of distinct responses it leaves unordered), the distinct responses per pooled prompt.
DIAGNOSTICS = ("exact_pairs", "decisive_pull", "candidates", "ties", "distinct_per_prompt")
#: How each diagnostic prints (a share, or a count per step).
DIAGNOSTIC_FORMAT = {"decisive_pull": "{:.2f}"}
#: Windows of MNPO steps (first, last) in which the candidate pairs a run's pool offered are read against its held-out
#: gain, the last running to the end: on B6 real every run's pool offered alike in steps 1-5, and the runs that
#: narrowed onto few answers had parted from the rest by steps 6-10.
WINDOWS = ((1, 5), (6, 10), (11, None))


def arms_of(args: argparse.Namespace) -> list[str]:
    """The arms to run, in the order given (``--arms``; the target's pair, DPO and the MNPO arms, can go first)."""
    if args.quick:
        return QUICK_ARMS
    return list(dict.fromkeys(args.arms or ARMS))


def work_dir(args: argparse.Namespace) -> Path:
    return args.work / "quick" if args.quick else args.work


def sim_mapping(args: argparse.Namespace) -> dict[str, Any]:
    """The experiment as a ``swarm-sim`` configuration (multiprocess mode)."""
    family = families_of([args.family])
    if args.quick:
        model: dict[str, Any] = {"name": "builtin:tiny"}
        engine = "transformers"
    else:
        warm = {"families": families_of([args.format_family]), "examples": args.format_examples}
        model = {"name": "smollm2-135m", "device": args.device, "warm_start": warm}
        engine = args.engine
    if args.device != "cpu":  # float32 as on the CPU: bf16 weights without fp32 master copies drop small updates
        model = {**model, "device": args.device, "dtype": "float32"}
    nodes = 2 if args.quick else 3
    return {
        "name": "b6-real",
        "mode": "multiprocess",
        "nodes": nodes,
        "steps": 2 if args.quick else args.steps,
        "seeds": list(args.seeds),
        "torch_threads": 1,
        "node": {
            "swarm_id": "b6-real",
            "model": model,
            "tasks": {"families": family},
            "rollout": {"engine": engine, "prompts_per_step": 4, "group_size": 8,
                        "max_new_tokens": args.max_new_tokens},
            "sapo": {"local_groups": 4, "external_groups": 0},
            "mnpo": {"prompts_per_window": 8, "responses_per_prompt": 4, "pairs_per_step": 16, "eta": args.eta,
                     "window_span": args.window_span,
                     "ratio": 0.5, "dpo_beta": args.dpo_beta, "max_opponents": 4, "history": 4,
                     "oracle": {"type": "verifiable", "rank": "exact"}},
            "eval": {
                "every_steps": 1 if args.quick else args.eval_every,
                "items_per_family": 4 if args.quick else args.items, "samples": 8, "greedy": True,
            },
            "checkpoint": {"every": 10, "keep": 1},
            # A smoke run's tiny node 0 would finish before node 1 has loaded: they start their first step together,
            # and poll faster than a tiny step (under a second), so each sees the other's records within the run.
            **({"runtime": {"wait_for_peers": nodes - 1, "wait_for_peers_s": 300, "poll_interval_s": 0.1}}
               if args.quick else {}),
        },
        "configurations": [
            {"name": arm, "description": ARMS[arm][1], "node": ARMS[arm][0]} for arm in arms_of(args)
        ],
        "multiprocess": {"startup_timeout_s": 1800, "run_timeout_s": 86_400,
                         **({"linger_s": 60} if args.quick else {})},  # a tiny node 0 outpaces node 1's start
    }  # fmt: skip


def run(args: argparse.Namespace) -> None:
    """Run every (arm, seed) not finished yet; an interrupted pair resumes from its checkpoints."""
    work, mapping = work_dir(args), sim_mapping(args)
    roles = {str(i): [f"player{i}", str(mapping["node"]["model"]["name"])] for i in range(mapping["nodes"])}
    sim = prepare(work, mapping, roles)
    prebuild(sim)
    run_pending(sim, work, arms_of(args), args.seeds, args.jobs)


# ---------------------------------------------------------------------------------------------- the oracle's game


def win_rate(a: list[int], b: list[int], samples: int) -> float:
    """P(a's response beats b's) when only exactness is judged, per item from exact counts out of ``samples``, a tie
    (both right or both wrong) counting one half; the mean over items. With such a judge this equals
    ``1/2 + (accuracy_a - accuracy_b) / 2``: it is linear in each item."""
    total = 0.0
    for ca, cb in zip(a, b, strict=True):
        pa, pb = ca / samples, cb / samples
        total += pa * (1 - pb) + 0.5 * (pa * pb + (1 - pa) * (1 - pb))
    return total / len(a)


def league_stats(finals: dict[tuple[str, int], list[int]], samples: int) -> dict[str, dict[str, float]]:
    """Per arm, from the final per-item exact counts of every (arm, node) of one seed (the league): the arm's mean
    win rate against every other league member, and the empirical duality gap of its population sigma (uniform over
    its nodes): ``2 max_pi P(pi beats sigma) - 1`` over the league's policies, 0 when none beats it."""
    out: dict[str, dict[str, float]] = {}
    for arm in dict.fromkeys(a for a, _ in finals):
        mine = [k for k in finals if k[0] == arm]
        wins = [win_rate(finals[k], finals[o], samples) for k in mine for o in finals if o != k]
        best = max(
            statistics.fmean(win_rate(finals[p], finals[k], samples) for k in mine) for p in finals
        )  # a member of sigma itself is a candidate: the gap is never below 0
        out[arm] = {"win_league": statistics.fmean(wins) if wins else float("nan"), "gap": max(0.0, 2 * best - 1)}
    return out


# ---------------------------------------------------------------------------------------------------- the report


def _node_metrics(node_dir: Path, until: float = float("inf")) -> dict[str, Any]:
    rows = [json.loads(x) for x in (node_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    mnpo = [r for r in rows if "mnpo_pairs" in r and r.get("step", 0) <= until]

    def mean(key: str, first: float = 0, last: float = float("inf")) -> float:  # nan where no step recorded it
        got = [r[key] for r in mnpo if key in r and first <= r.get("step", 0) <= last]  # (runs from before the key)
        return statistics.fmean(got) if got else float("nan")

    return {"mnpo_steps": len(mnpo), "pairs": mean("mnpo_pairs"), "covered": mean("mnpo_covered_frac"),
            "peer_opponents": mean("mnpo_peer_opponents"), **{k: mean(f"mnpo_{k}") for k in DIAGNOSTICS},
            "window_candidates": [mean("mnpo_candidates", a, b or float("inf")) for a, b in WINDOWS],
            "late_exact_pairs": mean("mnpo_exact_pairs", WINDOWS[-1][0])}  # fmt: skip


def collect(work: Path, until: float = float("inf")) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The experiment and one row per (arm, seed) whose every node evaluated at the last step, or at ``until`` (a
    budget cut short, as on a lent GPU, is reported at a step every run reached; evaluations and MNPO steps after it
    are left out). The league's figures come later, from every row of the seed: :func:`add_league`."""
    import yaml

    mapping = yaml.safe_load((work / "experiment.yaml").read_text())
    fam = mapping["node"]["tasks"]["families"][0]["name"]
    step = min(mapping["steps"], until)
    rows = []
    for seed in sorted(mapping["seeds"]):
        per_arm, curves = {}, {}
        for conf in mapping["configurations"]:
            arm, run_dir = conf["name"], work / conf["name"] / f"seed{seed}"
            evals = [read_evals(run_dir / f"node{i}", until) for i in range(mapping["nodes"])]
            if not all(e and e[-1]["step"] >= step and len(e) > 1 for e in evals):
                continue
            nodes = []
            for i, e in enumerate(evals):
                first, last = e[0]["families"][fam], e[-1]["families"][fam]
                nodes.append({"node": i, "before": first, "after": last, **_node_metrics(run_dir / f"node{i}", until)})
            per_arm[arm], curves[arm] = nodes, evals
        for arm, nodes in per_arm.items():
            gain = {k: statistics.fmean(n["after"][k] - n["before"][k] for n in nodes)
                    for k in ("accuracy", "greedy_accuracy", "pass_at_8")}  # fmt: skip
            by_step = [{e["step"]: e["families"][fam] for e in ev} for ev in curves[arm]]
            steps = sorted(set.intersection(*(set(b) for b in by_step)))
            curve = [
                (t, *(statistics.fmean(b[t][k] for b in by_step) for k in ("accuracy", "pass_at_8"))) for t in steps
            ]  # (step, mean exact, mean pass@8) over the arm's nodes
            rows.append({"arm": arm, "seed": seed, "step": step, "nodes": nodes, "gain": gain, "curve": curve,
                         "baseline": nodes[0]["after"]["majority_baseline"]})  # fmt: skip
    return mapping, rows


def add_league(mapping: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Each row's win rate against the league and its population's gap (nan where not judged). The league of a seed
    is the final policies of every arm that finished it with per-item counts (evaluations recorded before those
    counts have none), judged where at least two arms did: an arm not run on a seed (yet) leaves the others judged
    against each other, so a seed's league can hold more arms than another's (``league_size`` says how many
    policies)."""
    samples = mapping["node"]["eval"]["samples"]
    for seed in {r["seed"] for r in rows}:
        sel = [r for r in rows if r["seed"] == seed and all(n["after"].get("correct") is not None for n in r["nodes"])]
        finals = {(r["arm"], n["node"]): n["after"]["correct"] for r in sel for n in r["nodes"]}
        league = league_stats(finals, samples) if len({r["arm"] for r in sel}) >= 2 else {}
        for r in (r for r in rows if r["seed"] == seed):
            judged = league.get(r["arm"], {"win_league": float("nan"), "gap": float("nan")})
            r.update(judged, league_size=len(finals) if r["arm"] in league else 0)


def report(args: argparse.Namespace) -> None:
    work = work_dir(args)
    stem = args.stem or ("b6_real_quick" if args.quick else "b6_real")
    until = args.until if args.until is not None else float("inf")
    mapping, rows = report_rows(work, args.out / f"{stem}.json", lambda: collect(work, until), key="arm")
    step = min(mapping["steps"], until)
    rows = [r for r in rows if r.get("step", mapping["steps"]) == step]  # an earlier report's rows may be elsewhere
    add_league(mapping, rows)
    if not rows:
        raise SystemExit(f"no (arm, seed) under {work} whose every node evaluated at step {step}")
    fam = mapping["node"]["tasks"]["families"][0]
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    baseline = "n/a" if rows[0]["baseline"] is None else f"{rows[0]['baseline']:.3f}"
    lines = [
        "# B6 on real models: MNPO, DPO and GRPO on a SmolLM2 population",
        "",
        f"Machine: {args.machine or machine_info()}. Family `{fam['name']}` `{json.dumps(fam['config'])}`; "
        f"{mapping['nodes']} real `swarm-node join` processes per arm over hivemind on 127.0.0.1 "
        f"(`benchmarks/b6_real.py`, experiment in `{work.name}/experiment.yaml`), {mapping['steps']} steps"
        f"{'' if step == mapping['steps'] else f' (reported at step {step}, the last every run here reached)'}, "
        f"model `{mapping['node']['model']['name']}`. Oracle: the verifier, exact first, then format, then "
        "the shorter text (equal on all three: no pair). "
        "Held-out items: the family's held-out split, the same for every node; exact = share of 8 samples exactly "
        f"right; majority baseline {baseline}.",
        "",
        "Per arm, mean ± sd over seeds of the mean over its nodes. Win rate vs league: against every other final "
        "policy of the same seed (of every arm that finished it; a seed with one arm is not judged), judged on "
        "exactness alone, a tie "
        "counting one half. Gap: the empirical duality gap of the arm's population, 2 max P(league policy beats it) "
        "- 1 (0: nothing in the league beats it). Exactness is transitive, so these two say the same as accuracy: "
        "win rate = 1/2 + (accuracy - the league's) / 2, gap = the league's best accuracy - the arm's.",
        "",
        "MNPO columns, per MNPO step, the mean over the arm's nodes and steps: the pairs trained on, the share with "
        "an opponent covering it, of those pairs the ones exactness decided (a right answer over a wrong one; the "
        "rest the tie-breaks decided) and their share of the update's pull (each pair's weight in the gradient, "
        "minus the derivative of its loss by the player's log-ratio; a pair pushed away from its winner counts "
        "against), the candidate pairs, the oracle's ties (pairs of distinct responses to a "
        "prompt it leaves unordered) and the distinct responses per pooled prompt (the population's diversity); "
        "`-` where not recorded.",
        "",
        "| arm | seeds | exact gain | greedy gain | pass@8 gain | win rate vs league | gap | MNPO pairs / step | "
        "covered by an opponent | exactness decided | their share of the pull | candidates | ties | "
        "distinct / prompt |",
        "|---|---:|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in arms:
        sel = [r for r in rows if r["arm"] == arm]
        cells = [
            mean_sd([r["gain"][k] for r in sel], signed=True) for k in ("accuracy", "greedy_accuracy", "pass_at_8")
        ]
        cells += [mean_sd([r[k] for r in sel if r[k] == r[k]]) for k in ("win_league", "gap")]  # nan: no league
        nodes = [n for r in sel for n in r["nodes"] if n["mnpo_steps"]]
        mnpo = " | ".join(["-"] * (2 + len(DIAGNOSTICS)))
        if nodes:
            pairs, covered = (statistics.fmean(n[k] for n in nodes) for k in ("pairs", "covered"))
            diag = [
                [v for n in nodes if (v := n.get(k)) is not None and v == v] for k in DIAGNOSTICS
            ]  # v == v: not nan
            mnpo = f"{pairs:.1f} | {covered:.2f} | " + " | ".join(
                DIAGNOSTIC_FORMAT.get(k, "{:.1f}").format(statistics.fmean(d)) if d else "-"
                for k, d in zip(DIAGNOSTICS, diag, strict=True)
            )
        lines.append(f"| {arm} | {len(sel)} | " + " | ".join(cells) + f" | {mnpo} |")
    lines += ["", "Per node (exact before -> after; greedy; pass@8):", ""]
    for r in rows:
        per_node = "; ".join(
            f"{n['before']['accuracy']:.3f} -> {n['after']['accuracy']:.3f}, "
            f"{n['before']['greedy_accuracy']:.3f} -> {n['after']['greedy_accuracy']:.3f}, "
            f"{n['before']['pass_at_8']:.3f} -> {n['after']['pass_at_8']:.3f}"
            for n in r["nodes"]
        )
        lines.append(f"- {r['arm']} seed {r['seed']}: {per_node}")
    lines += [""]
    dpo = [r["gain"]["accuracy"] for r in rows if r["arm"] == "dpo"]
    for arm in [a for a in arms if a != "dpo"] if dpo else []:
        mine = [r["gain"]["accuracy"] for r in rows if r["arm"] == arm]
        diff = statistics.fmean(mine) - statistics.fmean(dpo)
        if min(len(mine), len(dpo)) < 2:
            verdict = "not judged (one seed, no spread)"
        else:
            spread = 2 * max(statistics.stdev(mine), statistics.stdev(dpo))
            verdict = f"{'beyond' if abs(diff) > spread else 'within'} 2 sd of the seeds ({spread:.3f})"
        lines.append(f"- {arm}: exact gain {statistics.fmean(mine):+.3f} against DPO's {statistics.fmean(dpo):+.3f}; "
                     f"the difference {diff:+.3f} is {verdict}.")  # fmt: skip
    lines += diversity_lines(rows, step)
    write_results(args.out, stem, "\n".join(lines) + "\n", {"experiment": mapping, "rows": rows})
    _plot(rows, args.out / f"{stem}.png")


def rank_correlation(x: list[float], y: list[float]) -> float:
    """Spearman's rho: Pearson's correlation of the ranks, ties taking their mean rank; nan under 3 points or when
    either side is constant."""

    def ranks(v: list[float]) -> list[float]:  # 1 + the values below, + half the other values equal to it
        return [1 + sum(u < x for u in v) + (sum(u == x for u in v) - 1) / 2 for x in v]

    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return float("nan")
    return statistics.correlation(ranks(x), ranks(y))


def diversity_lines(rows: list[dict[str, Any]], step: int) -> list[str]:
    """Per run, the candidate pairs its pool offered in each of :data:`WINDOWS` and its decisive pairs in the last,
    against its held-out gain, with the rank correlation over runs: where a population narrows onto few answers."""
    spans = [f"{a}-{b or step}" for a, b in WINDOWS]
    runs = []
    for r in rows:
        nodes = [n for n in r["nodes"] if n["mnpo_steps"]]
        got = [
            [n.get("window_candidates", [float("nan")] * len(WINDOWS))[w] for n in nodes] for w in range(len(WINDOWS))
        ]
        got.append([n.get("late_exact_pairs", float("nan")) for n in nodes])
        if not nodes or any(v != v for vs in got for v in vs):  # no MNPO step, or recorded before the diagnostics
            continue
        tops = [s for n in r["nodes"] if (s := n["after"].get("top_answer_share")) is not None]
        top = f"{min(tops):.0%}-{max(tops):.0%}" if tops else "-"
        runs.append(([statistics.fmean(vs) for vs in got], top, r["gain"]["accuracy"], f"{r['arm']} seed {r['seed']}"))
    if not runs:
        return []
    runs.sort(key=lambda t: -t[2])
    head = (
        "Diversity and the gain, per run, ordered by its gain (held-out exact): the candidate pairs its pool offered "
        "per MNPO step in each span of steps and the pairs a right answer decided (decisive) in the last, the mean "
        f"over its nodes; top answer: the most common sampled answer's share of the held-out samples at step {step}, "
        "lowest-highest over nodes."
    )
    cols = " | ".join(f"candidates, {x}" for x in spans)
    lines = ["", head, "", f"| run | gain | {cols} | decisive, {spans[-1]} | top answer |"]
    lines += ["|---|---|" + "---:|" * (len(spans) + 1) + "---|"]
    for figures, top, gain, name in runs:
        lines.append(f"| {name} | {gain:+.3f} | " + " | ".join(f"{v:.1f}" for v in figures) + f" | {top} |")
    gains = [t[2] for t in runs]
    rho = [f"{rank_correlation([t[0][i] for t in runs], gains):+.2f}" for i in range(len(spans) + 1)]
    lines += [
        "",
        f"Rank correlation (Spearman) with the gain over these {len(runs)} runs: the candidate pairs of steps "
        + ", ".join(f"{x} {c}" for x, c in zip(spans, rho[:-1], strict=True))
        + f"; the decisive pairs of steps {spans[-1]} {rho[-1]}. A run's own learning adds right answers, so the "
        "later spans' figures are partly its outcome, not only its cause.",
    ]
    return lines


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Held-out exact (sampled) and pass@8 over steps, the mean of each arm's nodes, one line per (arm, seed): the
    arm's colour, the seed's line style; the axes stop a little above the highest point (these gains are small)."""
    from benchmarks.common.plots import save_step_panels

    arms = list(dict.fromkeys(r["arm"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    styles = ["-", "--", ":", "-."]
    panels = {"held-out exact (sampled)": 1, "held-out pass@8": 2}
    top = max([c[k] for r in rows for c in r["curve"] for k in (1, 2)] + [rows[0]["baseline"] or 0.0])

    def draw(ax: Any, title: str) -> None:
        for r in rows:
            ax.plot([c[0] for c in r["curve"]], [c[panels[title]] for c in r["curve"]], alpha=0.8,
                    color=f"C{arms.index(r['arm'])}", linestyle=styles[seeds.index(r["seed"]) % len(styles)],
                    label=f"{r['arm']} seed {r['seed']}")  # fmt: skip
        ax.axhline(rows[0]["baseline"] or 0.0, color="grey", lw=0.8, label="majority baseline")

    save_step_panels(path, list(panels), draw, "mean over the arm's nodes", ymax=min(1.0, 1.15 * top + 0.02))


def parser() -> argparse.ArgumentParser:
    """The command line (``run`` and ``report``), with the experiment's defaults."""
    quick = "2 steps of two tiny-model nodes, two arms (a smoke run)"
    ap, r, rep = experiment_cli(__doc__ or "", WORK, RESULTS, quick, list(CANDIDATES))
    r.add_argument("--eta", type=float, default=0.5, help="MNPO step size (target margin 1/(2 eta))")
    r.add_argument("--dpo-beta", type=float, default=1.0)
    r.add_argument("--arms", nargs="+", choices=list(ARMS), help="the arms to run, in this order (default: all)")
    span_help = "protocol windows (15 s) per MNPO window, the prompts all players answer; two windows must outlast "
    span_help += "a node step, or peers answer other prompts (8 = 120 s, for steps of 100-180 s on 2 cores)"
    r.add_argument("--window-span", type=int, default=8, help=span_help)
    r.set_defaults(steps=40)  # 16 pairs a step: 100-180 s with 3 nodes on 2 cores (the docstring)
    until_help = "report at this step (an evaluation every run reached), for runs cut short (a lent GPU's budget)"
    rep.add_argument("--until", type=int, help=until_help)
    return ap


def main() -> None:
    args = parser().parse_args()
    {"run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
