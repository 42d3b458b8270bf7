"""What the SAPO experiment (``benchmarks/b4_sapo.py``, ``configs/sim/sapo*.yaml``) measures, from a run directory.

Configuration names follow ``<population>-<budget>-<I>-<J>[-<ablation>]`` (e.g. ``het-same-4-4``,
``het-same-4-4-fresh1``): every row is compared with the ``<population>-<budget>-8-0`` row of its population and
budget, seed by seed (the same seed gives both the same initial models and task draws). Three metrics:

* **own-rollout reward** (primary): ``reward_mean`` of the node's own generated completions, summed over nodes
  and steps -- what the node itself can do on its training distribution as it learns; beside it its exact twin,
  ``exact_mean`` (own completions whose answer is exactly right), since partial credit rises with half-right strings;
* **held-out accuracy**: exact match, per family, on problems no node ever trains on (``node.eval``), at the start
  and end;
* **training-batch reward**: the mean reward of the groups the learner trained on (own groups kept plus peers'
  groups, re-scored locally), summed likewise -- probably what the SAPO paper plots; it rises with sharing even
  when the node's own skill does not, because receivers pick peers' informative groups.

"Aha propagation": per node and family, the first step at which the node's own success on that family (over its
last 10 draws of the family) clears its starting success + 0.1; per family, how many steps after the first node
the others follow.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.telemetry.metrics import read_jsonl
from sim.report.summary import md_table

_NAME_RE = re.compile(r"^(?P<prefix>[A-Za-z]+-[A-Za-z]+)-(?P<i>\d+)-(?P<j>\d+)(?:-(?P<ablation>[A-Za-z0-9_.+-]+))?$")
_SEED_RE = re.compile(r"^seed(-?\d+)$")
_NODE_RE = re.compile(r"^node(\d+)$")
RISE_WINDOW = 10


def baseline_candidates(name: str) -> list[str]:
    """The 8-0 rows a configuration is compared with, in order of preference: the 8-0 with the same suffix (a
    learning-rate row with the 8-0 at that rate), then the plain ``<population>-<budget>-8-0``; an 8/0 node
    generates 8 questions under either budget, so ``-paper-8-0`` falls back to the identical ``-same-8-0``."""
    m = _NAME_RE.match(name)
    if not m:
        return []
    out = []
    if m["ablation"] and (m["i"], m["j"]) != ("8", "0"):
        out.append(f"{m['prefix']}-8-0-{m['ablation']}")
    out.append(f"{m['prefix']}-8-0")
    out += [c.replace("-paper-8-0", "-same-8-0") for c in out if "-paper-8-0" in c]
    return [c for c in out if c != name]


def baseline_runs(results: dict[str, list[SeedResult]], name: str) -> list[SeedResult] | None:
    """The runs of the first of :func:`baseline_candidates` that ran."""
    for cand in baseline_candidates(name):
        if cand in results:
            return results[cand]
    return None


def baseline_of(name: str) -> str | None:
    """The preferred 8-0 row of ``name`` (None for a plain 8-0 row or a name outside the scheme)."""
    cands = baseline_candidates(name)
    return cands[0] if cands else None


@dataclass
class NodeRun:
    metrics: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    rollouts: list[dict[str, Any]]

    def own_cumulative(self, steps: int | None = None) -> float:
        """Own-rollout reward summed over the node's steps (the first ``steps`` of them, if given)."""
        return math.fsum(float(r.get("reward_mean", 0.0)) for r in self.metrics[:steps])

    def own_exact_cumulative(self, steps: int | None = None) -> float:
        """The exact twin of :meth:`own_cumulative`: own completions exactly right, summed over steps (runs from
        before the ``exact_mean`` field give NaN, not a number that looks like zero skill)."""
        rows = self.metrics[:steps]
        if rows and "exact_mean" not in rows[0]:
            return math.nan
        return math.fsum(float(r.get("exact_mean", 0.0)) for r in rows)

    def batch_cumulative(self) -> float:
        return math.fsum(float(r.get("batch_reward_mean", 0.0)) for r in self.metrics)

    def family_success(self) -> dict[str, dict[int, float]]:
        """family -> step -> mean reward of this node's own completions on that family at that step."""
        acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for row in self.rollouts:
            acc[row["task"]["family"]][int(row["step"])].extend(float(r) for r in row["rewards"])
        return {f: {s: statistics.fmean(v) for s, v in steps.items()} for f, steps in acc.items()}


@dataclass
class SeedResult:
    seed: int
    nodes: dict[int, NodeRun] = field(default_factory=dict)

    def own(self, steps: int | None = None) -> float:
        return math.fsum(n.own_cumulative(steps) for n in self.nodes.values())

    def own_exact(self, steps: int | None = None) -> float:
        return math.fsum(n.own_exact_cumulative(steps) for n in self.nodes.values())

    def batch(self) -> float:
        return math.fsum(n.batch_cumulative() for n in self.nodes.values())

    def heldout(self, which: int) -> dict[str, float]:
        """Mean over nodes of held-out accuracy per family (and ``mean``) at the first (0) or last (-1) eval."""
        per: dict[str, list[float]] = defaultdict(list)
        for n in self.nodes.values():
            if not n.evals:
                continue
            ev = n.evals[which]
            per["mean"].append(float(ev["accuracy"]))
            for fam, stats in ev["families"].items():
                per[fam].append(float(stats["accuracy"]))
        return {k: statistics.fmean(v) for k, v in per.items()}


def collect(run_dir: Path) -> dict[str, list[SeedResult]]:
    out: dict[str, list[SeedResult]] = {}
    for cfg_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        seeds = []
        for seed_dir in sorted(cfg_dir.iterdir()):
            m = _SEED_RE.match(seed_dir.name)
            if not (m and seed_dir.is_dir()):
                continue
            res = SeedResult(int(m.group(1)))
            for node_dir in sorted(seed_dir.iterdir()):
                n = _NODE_RE.match(node_dir.name)
                metrics = read_jsonl(node_dir / "metrics.jsonl") if n else []
                if n and metrics:  # a node that has not finished a step yet (a run in progress) is left out
                    res.nodes[int(n.group(1))] = NodeRun(
                        metrics,
                        read_jsonl(node_dir / "eval.jsonl"),
                        read_jsonl(node_dir / "rollouts.jsonl"),
                    )
            if res.nodes:
                seeds.append(res)
        if seeds:
            out[cfg_dir.name] = seeds
    return out


def window_reward(runs: list[SeedResult], first: bool, width: int = 10) -> float:
    """Mean own-rollout reward over the first (or last) ``width`` steps, over nodes and seeds."""
    vals: list[float] = []
    for r in runs:
        for n in r.nodes.values():
            rows = n.metrics[:width] if first else n.metrics[-width:]
            vals.extend(float(m.get("reward_mean", 0.0)) for m in rows)
    return statistics.fmean(vals) if vals else math.nan


def needed_speedup(base: list[SeedResult], target: float) -> tuple[float, float, float, float]:
    """What a sharing configuration would have to achieve against this baseline to reach ``target`` x its
    cumulative own-rollout reward, if both rewards grow linearly from the same start r0 over the run:
    ``target * (r0 + d8 / 2) = r0 + d / 2``. Returns (r0, d8, d, d / d8): the baseline's start and rise, the rise
    needed, and how many times faster than the baseline the sharing configuration would have to learn."""
    r0, r1 = window_reward(base, True), window_reward(base, False)
    d8 = r1 - r0
    mean = statistics.fmean(r.own() / sum(len(n.metrics) for n in r.nodes.values()) for r in base)
    d = 2 * (target * mean - r0)
    return r0, d8, d, (d / d8 if d8 > 0 else math.inf)


CEILING_WINDOW = 50


def family_ceiling(
    results: dict[str, list[SeedResult]], names: list[str], base: str, window: int = CEILING_WINDOW
) -> dict[str, Any] | None:
    """The most sharing could gain over ``base`` by passing on what the nodes of the rows ``names`` learned, as two
    bounds, each a node that has a family's skill from its first step, families weighted by their share of ``base``'s
    own completions:

    * ``end``: per family, the best row's end skill -- the mean over its nodes (every seed) of each node's own success
      over its last ``window`` draws of that family. Every node as good from step 1 as the nodes of the best row are
      on average after the whole run: an instant, perfect transfer of what training reached.
    * ``best``: per family, the best stretch of ``window`` consecutive draws any one node of any run reached, anywhere
      in the run. A generous bound: a maximum over many noisy nodes and stretches, so it rises with every run added.

    Returns ``end``, ``best`` (family -> success), ``where`` (family -> the row of ``best``), ``share``,
    ``reward_end``, ``reward`` (per node-step), ``base_reward`` (``base``'s mean own reward per node-step),
    ``ratio_end`` and ``ratio``; None if ``base`` did not run or some family it draws was never drawn ``window``
    times by one node."""
    if base not in results:
        return None
    best: dict[str, float] = {}
    where: dict[str, str] = {}
    end: dict[str, float] = {}
    for name in names:
        last: dict[str, list[float]] = defaultdict(list)
        for run in results.get(name, []):
            for node in run.nodes.values():
                for fam, by_step in node.family_success().items():
                    draws = [by_step[s] for s in sorted(by_step)]
                    if len(draws) < window:
                        continue
                    last[fam].append(math.fsum(draws[-window:]) / window)
                    run_sum = math.fsum(draws[:window])
                    top = run_sum
                    for k in range(window, len(draws)):
                        run_sum += draws[k] - draws[k - window]
                        top = max(top, run_sum)
                    if top / window > best.get(fam, -1.0):
                        best[fam], where[fam] = top / window, name
        for fam, values in last.items():
            end[fam] = max(end.get(fam, -1.0), statistics.fmean(values))
    counts: dict[str, int] = defaultdict(int)
    for run in results[base]:
        for node in run.nodes.values():
            for row in node.rollouts:
                counts[row["task"]["family"]] += len(row["rewards"])
    total = sum(counts.values())
    if not best or not total or set(counts) - set(best):
        return None
    share = {f: c / total for f, c in counts.items()}
    reward = math.fsum(share[f] * best[f] for f in share)
    reward_end = math.fsum(share[f] * end[f] for f in share)
    base_reward = statistics.fmean(r.own() / sum(len(n.metrics) for n in r.nodes.values()) for r in results[base])
    return {
        "end": end,
        "best": best,
        "where": where,
        "share": share,
        "reward_end": reward_end,
        "reward": reward,
        "base_reward": base_reward,
        "ratio_end": reward_end / base_reward if base_reward > 0 else math.inf,
        "ratio": reward / base_reward if base_reward > 0 else math.inf,
    }


def _ms(values: list[float], digits: int) -> str:
    values = [v for v in values if not math.isnan(v)]  # a metric a run did not record (e.g. exact_mean before it)
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _paired_ratios(rows: list[SeedResult], base: list[SeedResult], metric: str) -> list[float]:
    by_seed = {r.seed: getattr(r, metric)() for r in base}
    return [getattr(r, metric)() / by_seed[r.seed] for r in rows if by_seed.get(r.seed)]


def summary_rows(results: dict[str, list[SeedResult]], order: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in [n for n in order if n in results] + sorted(n for n in results if n not in order):
        runs = results[name]
        base = baseline_runs(results, name)
        start = [r.heldout(0).get("mean", math.nan) for r in runs]
        end = [r.heldout(-1).get("mean", math.nan) for r in runs]
        rows.append(
            {
                "config": name,
                "seeds": len(runs),
                "seed_ids": [r.seed for r in runs],
                "steps": max(len(n.metrics) for r in runs for n in r.nodes.values()),
                "own": [r.own() for r in runs],
                "own_ratio": _paired_ratios(runs, base, "own") if base else [1.0] * len(runs),
                "own_exact": [r.own_exact() for r in runs],
                "own_exact_ratio": _paired_ratios(runs, base, "own_exact") if base else [1.0] * len(runs),
                "batch": [r.batch() for r in runs],
                "batch_ratio": (_paired_ratios(runs, base, "batch") if base else [1.0] * len(runs)),
                "heldout_start": start,
                "heldout_end": end,
                "heldout_gain": [e - s for s, e in zip(start, end, strict=True)],
                "ext_age": [
                    statistics.fmean(
                        float(m.get("external_age_mean", 0.0)) for n in r.nodes.values() for m in n.metrics
                    )
                    for r in runs
                ],
            }
        )
    return rows


def markdown_summary(rows: list[dict[str, Any]]) -> str:
    head = (
        "config",
        "seeds",
        "steps",
        "own-rollout reward (cum.)",
        "ratio vs 8-0",
        "own exact (cum.)",
        "exact ratio vs 8-0",
        "held-out start -> end",
        "held-out gain",
        "batch reward (cum.)",
        "batch ratio vs 8-0",
        "mean age of peer groups",
    )
    body = [
        (
            r["config"],
            r["seeds"],
            r["steps"],
            _ms(r["own"], 1),
            _ms(r["own_ratio"], 3),
            _ms(r["own_exact"], 1),
            _ms(r["own_exact_ratio"], 3),
            f"{_ms(r['heldout_start'], 3)} -> {_ms(r['heldout_end'], 3)}",
            _ms(r["heldout_gain"], 3),
            _ms(r["batch"], 1),
            _ms(r["batch_ratio"], 3),
            _ms(r["ext_age"], 1),
        )
        for r in rows
    ]
    return md_table(head, body).rstrip("\n")


def by_seed(row: dict[str, Any], key: str, seeds: list[int] | None = None) -> dict[int, float]:
    """A summary row's per-seed ``key`` (``own``, ``heldout_gain``, ...) as {seed: value}, only ``seeds`` if given."""
    return {s: v for s, v in zip(row["seed_ids"], row[key], strict=True) if seeds is None or s in seeds}


def lr_sweep(rows: list[dict[str, Any]], base_lr: float, splits: tuple[str, ...] = ("8-0", "4-4")) -> list[str]:
    """The learning-rate sweep: per ``<population>-<budget>``, the rows ``<prefix>-<I>-<J>`` (at ``base_lr``) and
    ``<prefix>-<I>-<J>-lr<rate>`` of each split, compared over the seeds all of them ran (a rate run on one seed is
    compared with the others on that seed only). Returns a Markdown table per prefix (own-rollout reward and
    held-out gain, mean over those seeds), then one line each: the best rate of each split by own-rollout reward,
    and the best 4/4 over the best 8/0 paired by seed. Empty when no prefix has a rate row."""
    sweeps: dict[str, dict[str, dict[float, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        m = _NAME_RE.match(r["config"])
        split = f"{m['i']}-{m['j']}" if m else ""
        if not m or split not in splits:
            continue
        if m["ablation"] is None:
            sweeps[m["prefix"]][split][base_lr] = r
        elif re.fullmatch(r"lr\d+(\.\d+)?e-?\d+", m["ablation"]):
            sweeps[m["prefix"]][split][float(m["ablation"][2:])] = r
    out: list[str] = []
    for prefix, by_split in sweeps.items():
        if all(len(rates) < 2 for rates in by_split.values()):
            continue
        every = [r for rates in by_split.values() for r in rates.values()]
        common = sorted(set.intersection(*(set(r["seed_ids"]) for r in every)))
        if not common:
            out.append(f"{prefix}: learning-rate sweep has no seed common to its rows")
            continue
        own = {(sp, lr): by_seed(r, "own", common) for sp, rates in by_split.items() for lr, r in rates.items()}
        gain = {
            (sp, lr): by_seed(r, "heldout_gain", common) for sp, rates in by_split.items() for lr, r in rates.items()
        }
        body = [
            (f"{prefix}-{sp}", f"{lr:g}", _ms(list(own[sp, lr].values()), 1), _ms(list(gain[sp, lr].values()), 3))
            for sp, rates in by_split.items()
            for lr in sorted(rates)
        ]
        best = {
            sp: max((statistics.fmean(own[sp, lr].values()), lr) for lr in rates)[1] for sp, rates in by_split.items()
        }
        seeds = ", ".join(map(str, common))
        out += [
            f"Seed{'s' if len(common) > 1 else ''} {seeds} (common to every row of the sweep).",
            "",
            md_table(("row", "lr", "own-rollout reward (cum.)", "held-out gain"), body).rstrip("\n"),
            "",
            f"- {prefix}: best learning rate by own-rollout reward: "
            + ", ".join(f"{k} {v:g}" for k, v in best.items()),
        ]
        if {"8-0", "4-4"} <= set(best):
            a, b = ("4-4", best["4-4"]), ("8-0", best["8-0"])
            ratios = [own[a][s] / own[b][s] for s in common if own[b][s]]
            out.append(
                f"- {prefix}: best 4/4 over best 8/0, own-rollout reward paired by seed {_ms(ratios, 3)}; "
                f"held-out gain {statistics.fmean(gain[a].values()) - statistics.fmean(gain[b].values()):+.3f}"
            )
        out.append("")
    return out


LENGTH_FRACTIONS = (1 / 5, 1 / 3, 1 / 2, 2 / 3, 5 / 6, 1)


def splits_by_length(results: dict[str, list[SeedResult]], splits: list[str], base: str) -> str:
    """Own-rollout reward over the first K steps, each split over ``base`` (its 8-0) paired by seed, at K = 1/5 ..
    all of the shortest run, over the seeds every split and the base ran (mean ± sd); and the splits' order at each
    K. A ratio that holds only at some lengths shows here; so does one seed's lead against the seed spread."""
    rows_of = [base, *splits]
    if any(n not in results for n in rows_of):
        return ""
    common = sorted(set.intersection(*({r.seed for r in results[n]} for n in rows_of)))
    if not common:
        return ""
    by_seed = {n: {r.seed: r for r in results[n]} for n in rows_of}
    steps = min(len(node.metrics) for n in rows_of for s in common for node in by_seed[n][s].nodes.values())
    lengths = sorted({max(1, round(f * steps)) for f in LENGTH_FRACTIONS})
    common = [s for s in common if all(by_seed[base][s].own(k) for k in lengths)]  # a ratio needs a base reward
    if not common:
        return ""
    table = []
    for k in lengths:
        ratios = {n: [by_seed[n][s].own(k) / by_seed[base][s].own(k) for s in common] for n in splits}
        mean = {base: 1.0, **{n: statistics.fmean(ratios[n]) for n in splits}}
        order = sorted(rows_of, key=lambda n: -mean[n])
        table.append([str(k), *(_ms(ratios[n], 3) for n in splits), " > ".join(order)])
    seeds = ", ".join(map(str, common))
    head = ["K (steps)", *splits, "order"]
    return f"Seeds {seeds} (common to these rows); each cell over {base}.\n\n" + md_table(head, table)


def heldout_by_family(results: dict[str, list[SeedResult]], names: list[str]) -> str:
    fams = sorted({f for n in names for r in results.get(n, []) for f in r.heldout(-1) if f != "mean"})
    if not fams:
        return ""
    lines = ["| config | " + " | ".join(fams) + " |", "|---|" + "---:|" * len(fams)]
    for n in names:
        if n not in results:
            continue
        cells = []
        for f in fams:
            gains = [r.heldout(-1).get(f, math.nan) - r.heldout(0).get(f, math.nan) for r in results[n]]
            ends = [r.heldout(-1).get(f, math.nan) for r in results[n]]
            cells.append(f"{_ms(ends, 2)} ({'+' if statistics.fmean(gains) >= 0 else ''}{statistics.fmean(gains):.2f})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ aha propagation


def rise_steps(node: NodeRun, window: int = RISE_WINDOW) -> dict[str, int | None]:
    """Per family: the step of the first draw at which the node's success over its last ``window`` draws of that
    family clears ``start + 0.1``, where start is its success over its first ``window`` draws; ``None`` if it
    never does (or the family was drawn fewer than ``2 * window`` times). Windows count draws, not steps, so a
    node that generates fewer questions per step (the paper budget) is measured the same way."""
    out: dict[str, int | None] = {}
    for fam, by_step in node.family_success().items():
        steps = sorted(by_step)
        out[fam] = None
        if len(steps) < 2 * window:
            continue
        threshold = statistics.fmean(by_step[s] for s in steps[:window]) + 0.1
        for k in range(window, len(steps) + 1):
            if statistics.fmean(by_step[s] for s in steps[k - window : k]) >= threshold:
                out[fam] = steps[k - 1]
                break
    return out


def propagation(results: dict[str, list[SeedResult]], name: str) -> dict[str, dict[str, Any]]:
    """Per family over seeds: share of nodes that rose, mean first rise, and the mean lag of the followers."""
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in results.get(name, []):
        rises = {i: rise_steps(n) for i, n in run.nodes.items()}
        fams = {f for r in rises.values() for f in r}
        for fam in fams:
            steps = [r.get(fam) for r in rises.values()]
            risen = sorted(s for s in steps if s is not None)
            per[fam]["share"].append(len(risen) / len(steps))
            if risen:
                per[fam]["first"].append(risen[0])
                per[fam]["lag"].extend(s - risen[0] for s in risen[1:])
    return {
        f: {k: (statistics.fmean(v) if v else None) for k, v in d.items()} | {"n_lags": len(d["lag"])}
        for f, d in per.items()
    }


def plot_propagation(results: dict[str, list[SeedResult]], names: list[str], path: Path) -> Path | None:
    """Per family (rows), every node's rise step (dots; seeds pooled), one colour per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in names if n in results]
    if not names:
        return None
    fams = sorted({f for n in names for r in results[n] for node in r.nodes.values() for f in node.family_success()})
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(fams) + 1.5))
    for k, name in enumerate(names):
        xs, ys, never, total = [], [], 0, 0
        for run in results[name]:
            for node in run.nodes.values():
                for fam, step in rise_steps(node).items():
                    total += 1
                    if step is None:
                        never += 1
                    else:
                        xs.append(step)
                        ys.append(fams.index(fam) + (k - (len(names) - 1) / 2) * 0.25)
        ax.scatter(xs, ys, s=14, alpha=0.7, label=f"{name} ({never} of {total} node-families never rose)")
    ax.set_yticks(range(len(fams)), fams)
    ax.set_xlabel("step at which a node's own success on the family rises")
    ax.set_title("aha propagation: when each node's success on a family rises")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_curves(results: dict[str, list[SeedResult]], names: list[str], path: Path, metric: str) -> Path | None:
    """Mean over nodes and seeds of ``metric`` per step, one line per configuration (10-step moving mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in names if n in results]
    if not names:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name in names:
        per_step: dict[int, list[float]] = defaultdict(list)
        for run in results[name]:
            for node in run.nodes.values():
                for m in node.metrics:
                    per_step[int(m["step"])].append(float(m.get(metric, 0.0)))
        steps = sorted(per_step)
        ys = [statistics.fmean(per_step[s]) for s in steps]
        smooth = [statistics.fmean(ys[max(0, i - 9) : i + 1]) for i in range(len(ys))]
        ax.plot(steps, smooth, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
