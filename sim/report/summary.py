"""Turn a simulator run directory into a results table (CSV + Markdown) and reward-curve plots (PNG).

Layout read: ``OUT/<configuration>/seed<k>/node<i>/metrics.jsonl`` (one JSON object per learner step, written
by :class:`node.runtime.Node`) and ``eval.jsonl`` beside it (held-out evaluations, ``node.eval``). ``results.md``
opens with what to look at (per configuration and node: the family it lacks and its own, first to last evaluation)
before the full table. Cumulative reward is ``reward_mean`` summed over nodes and steps (the SAPO paper's "total
reward": training reward on the node's own rollouts, partial credit included where the families give it), per
seed, then averaged over seeds with its standard deviation; cumulative exact is its exact twin (``exact_mean``),
shown only where the two differ. Held-out accuracy is exact match, the mean over nodes of each
node's first and last evaluation on problems no node trained on, shown beside the majority-answer baseline and
pass@8; its gain is the learning measure (training reward alone can be memorization or partial credit). Knows
nothing about how the nodes were run.
"""

from __future__ import annotations

import csv
import logging
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.telemetry.metrics import read_jsonl
from sim.report.html import write_html_report

logger = logging.getLogger(__name__)

_SEED_RE = re.compile(r"^seed(-?\d+)$")
_NODE_RE = re.compile(r"^node(\d+)$")
CSV_FIELDS = (
    "config",
    "seeds",
    "nodes",
    "steps",
    "cumulative_reward",
    "cumulative_reward_std",
    "cumulative_exact",
    "final_reward",
    "external_groups",
    "rejected",
    "ratio_vs_baseline",
    "heldout_start",
    "heldout_end",
    "heldout_gain",
    "heldout_gain_std",
    "heldout_majority",
    "heldout_pass8_start",
    "heldout_pass8_end",
)


@dataclass
class SeedRun:
    """Per-node metric rows of one (configuration, seed)."""

    seed: int
    nodes: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    evals: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Per node: its held-out evaluations in order (empty when it did not evaluate)."""

    def heldout(self, key: str = "accuracy") -> tuple[float, float] | None:
        """Mean over evaluated nodes of (first, last) held-out ``key`` (exact accuracy; ``pass_at_8``...), or None
        when no node has two evaluations that carry it."""
        pairs = [
            (float(e[0][key]), float(e[-1][key]))
            for e in self.evals.values()
            if len(e) >= 2 and e[0].get(key) is not None and e[-1].get(key) is not None
        ]
        if not pairs:
            return None
        return statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs)

    def majority_baseline(self) -> float | None:
        """Mean over nodes and families of the majority-answer baseline at the last evaluation (None before the
        evaluator reported it)."""
        vals = [
            float(f["majority_baseline"])
            for e in self.evals.values()
            if e
            for f in e[-1].get("families", {}).values()
            if f.get("majority_baseline") is not None
        ]
        return statistics.fmean(vals) if vals else None

    def cumulative_reward(self, key: str = "reward_mean") -> float:
        """``key`` (partial-credit ``reward_mean``, or its exact twin ``exact_mean``) summed over nodes and steps."""
        return math.fsum(float(r.get(key, 0.0)) for rows in self.nodes.values() for r in rows)

    def external_groups(self) -> int:
        return int(sum(int(r.get("external_groups", 0)) for rows in self.nodes.values() for r in rows))

    def rejected(self) -> int:
        # the counter is cumulative per node: its last value is the node's total
        return int(sum(int(rows[-1].get("rejected", 0)) for rows in self.nodes.values() if rows))

    def final_reward(self, tail: int) -> float:
        """Mean over nodes of each node's mean reward over its last ``tail`` steps."""
        vals = []
        for rows in self.nodes.values():
            if rows:
                last = rows[-tail:]
                vals.append(math.fsum(float(r.get("reward_mean", 0.0)) for r in last) / len(last))
        return math.fsum(vals) / len(vals) if vals else 0.0

    def max_step(self) -> int:
        return max((int(r.get("step", 0)) for rows in self.nodes.values() for r in rows), default=0)


@dataclass
class ConfigResult:
    """All seeds of one configuration and the row they make."""

    name: str
    runs: list[SeedRun]

    def row(self, baseline: float | None) -> dict[str, Any]:
        cums = [r.cumulative_reward() for r in self.runs]
        steps = max((r.max_step() for r in self.runs), default=0)
        tail = max(1, steps // 10)
        mean = statistics.fmean(cums) if cums else 0.0
        held = [h for h in (r.heldout() for r in self.runs) if h is not None]
        gains = [end - start for start, end in held]
        pass8 = [h for h in (r.heldout("pass_at_8") for r in self.runs) if h is not None]
        majority = [m for m in (r.majority_baseline() for r in self.runs) if m is not None]
        nan = float("nan")
        return {
            "config": self.name,
            "seeds": len(self.runs),
            "nodes": max((len(r.nodes) for r in self.runs), default=0),
            "steps": steps,
            "cumulative_reward": mean,
            "cumulative_reward_std": statistics.stdev(cums) if len(cums) > 1 else 0.0,
            "cumulative_exact": statistics.fmean(r.cumulative_reward("exact_mean") for r in self.runs)
            if self.runs
            else 0.0,
            "final_reward": statistics.fmean(r.final_reward(tail) for r in self.runs) if self.runs else 0.0,
            "external_groups": statistics.fmean(r.external_groups() for r in self.runs) if self.runs else 0.0,
            "rejected": statistics.fmean(r.rejected() for r in self.runs) if self.runs else 0.0,
            "ratio_vs_baseline": (mean / baseline) if baseline else float("nan"),
            "heldout_start": statistics.fmean(h[0] for h in held) if held else nan,
            "heldout_end": statistics.fmean(h[1] for h in held) if held else nan,
            "heldout_gain": statistics.fmean(gains) if gains else nan,
            "heldout_gain_std": statistics.stdev(gains) if len(gains) > 1 else nan,
            "heldout_pass8_start": statistics.fmean(h[0] for h in pass8) if pass8 else nan,
            "heldout_pass8_end": statistics.fmean(h[1] for h in pass8) if pass8 else nan,
            "heldout_majority": statistics.fmean(majority) if majority else nan,
        }

    def family_curves(self, key: str = "accuracy") -> dict[tuple[str, int], tuple[list[int], list[float]]]:
        """Per (family, node): held-out ``key`` at each evaluated step, mean over seeds."""
        by: dict[tuple[str, int], dict[int, list[float]]] = {}
        for run in self.runs:
            for node, evals in run.evals.items():
                for e in evals:
                    for fam, f in e.get("families", {}).items():
                        if f.get(key) is not None:
                            by.setdefault((fam, node), {}).setdefault(int(e["step"]), []).append(float(f[key]))
        return {k: (sorted(v), [statistics.fmean(v[s]) for s in sorted(v)]) for k, v in sorted(by.items())}

    def heldout_curve(self) -> tuple[list[int], list[float]]:
        """Per evaluated step: held-out accuracy, mean over nodes and seeds."""
        by_step: dict[int, list[float]] = {}
        for run in self.runs:
            for evals in run.evals.values():
                for e in evals:
                    by_step.setdefault(int(e["step"]), []).append(float(e["accuracy"]))
        steps = sorted(by_step)
        return steps, [statistics.fmean(by_step[s]) for s in steps]

    def curve(self) -> tuple[list[int], list[float], list[float], list[float]]:
        """Per step: the mean over nodes (averaged over seeds), and the min and max over nodes (averaged)."""
        by_step: dict[int, list[tuple[float, float, float]]] = {}
        for run in self.runs:
            per_step: dict[int, list[float]] = {}
            for rows in run.nodes.values():
                for r in rows:
                    per_step.setdefault(int(r["step"]), []).append(float(r.get("reward_mean", 0.0)))
            for s, vals in per_step.items():
                by_step.setdefault(s, []).append((statistics.fmean(vals), min(vals), max(vals)))
        steps = sorted(by_step)
        mean = [statistics.fmean(v[0] for v in by_step[s]) for s in steps]
        lo = [statistics.fmean(v[1] for v in by_step[s]) for s in steps]
        hi = [statistics.fmean(v[2] for v in by_step[s]) for s in steps]
        return steps, mean, lo, hi


def collect(out: str | Path, order: list[str] | None = None) -> list[ConfigResult]:
    """Read every ``<config>/seed<k>/node<i>/metrics.jsonl`` under ``out``; ``order`` fixes the row order."""
    out = Path(out)
    found: dict[str, list[SeedRun]] = {}
    for cfg_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        runs = []
        for seed_dir in sorted(cfg_dir.iterdir()):
            m = _SEED_RE.match(seed_dir.name)
            if not (m and seed_dir.is_dir()):
                continue
            run = SeedRun(int(m.group(1)))
            for node_dir in sorted(seed_dir.iterdir()):
                n = _NODE_RE.match(node_dir.name)
                if n and node_dir.is_dir():
                    run.nodes[int(n.group(1))] = read_jsonl(node_dir / "metrics.jsonl")
                    run.evals[int(n.group(1))] = read_jsonl(node_dir / "eval.jsonl")
            runs.append(run)
        if runs:
            found[cfg_dir.name] = runs
    names = [n for n in (order or []) if n in found] + sorted(n for n in found if n not in (order or []))
    return [ConfigResult(n, found[n]) for n in names]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)


def _spread(value: float, std: float, seeds: int, digits: int) -> str:
    """``value ± std`` over seeds; the value alone for one seed (a spread of one sample means nothing)."""
    if math.isnan(value):
        return "-"
    if seeds < 2 or math.isnan(std):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} ± {std:.{digits}f}"


def md_table(head: Sequence[str], rows: Iterable[Sequence[Any]], numeric_from: int = 1) -> str:
    """A GitHub Markdown table: ``head`` cells, then one line per row (cells already formatted, or ``str()``-ed);
    columns from ``numeric_from`` on are right-aligned."""
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" if i >= numeric_from else "---" for i in range(len(head))) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def has_partial_credit(rows: list[dict[str, Any]]) -> bool:
    """Whether the training reward gave partial credit anywhere: its cumulative sum differs from its exact twin's
    (the laboratory families score 0 or 1, so their reward is the exact one)."""
    return any(abs(r["cumulative_reward"] - r["cumulative_exact"]) > 1e-9 for r in rows)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The results rows as a GitHub Markdown table (the cumulative exact column only where the reward differs from
    it: partial credit)."""
    partial = has_partial_credit(rows)
    head = (
        "config",
        "seeds",
        "nodes",
        "steps",
        "cumulative reward (partial credit)" if partial else "cumulative reward",
        f"ratio vs {rows[0]['config'] if rows else 'baseline'}",
        *(("cumulative exact",) if partial else ()),
        "final reward",
        "held-out exact start -> end",
        "held-out gain",
        "majority baseline",
        "held-out pass@8 start -> end",
        "external groups",
        "rejected",
    )
    body = []
    for r in rows:
        held = "-" if math.isnan(r["heldout_start"]) else f"{r['heldout_start']:.3f} -> {r['heldout_end']:.3f}"
        p8 = (
            "-"
            if math.isnan(r["heldout_pass8_start"])
            else f"{r['heldout_pass8_start']:.3f} -> {r['heldout_pass8_end']:.3f}"
        )
        body.append(
            (
                r["config"],
                r["seeds"],
                r["nodes"],
                r["steps"],
                _spread(r["cumulative_reward"], r["cumulative_reward_std"], r["seeds"], 2),
                _fmt(r["ratio_vs_baseline"]),
                *((f"{r['cumulative_exact']:.2f}",) if partial else ()),
                f"{r['final_reward']:.3f}",
                held,
                _spread(r["heldout_gain"], r["heldout_gain_std"], r["seeds"], 3),
                _fmt(r["heldout_majority"]),
                p8,
                _fmt(r["external_groups"]),
                _fmt(r["rejected"]),
            )
        )
    return md_table(head, body)


def plot_curves(results: list[ConfigResult], path: Path, title: str) -> Path:
    """Reward per step for each configuration: mean over nodes, shaded between the min and max node."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_heldout = any(res.heldout_curve()[0] for res in results)
    fig, axes = plt.subplots(1, 2 if has_heldout else 1, figsize=(13 if has_heldout else 8, 4.5), dpi=110)
    ax = axes[0] if has_heldout else axes
    for res in results:
        steps, mean, lo, hi = res.curve()
        if not steps:
            continue
        (line,) = ax.plot(steps, mean, label=res.name, linewidth=1.5)
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
        if has_heldout:
            hs, hv = res.heldout_curve()
            axes[1].plot(hs, hv, marker="o", label=res.name, color=line.get_color(), linewidth=1.5)
    ax.set_xlabel("learner step")
    ax.set_ylabel("training reward, own rollouts\n(mean over nodes; band: min-max node)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    if has_heldout:
        axes[1].set_xlabel("learner step")
        axes[1].set_ylabel("held-out accuracy\n(unseen questions; mean over nodes)")
        axes[1].set_title("held-out accuracy")
        axes[1].grid(alpha=0.3)
        axes[1].legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _family_ends(res: ConfigResult, fam: str, node: int, key: str) -> list[tuple[float, float]]:
    """Per seed where ``node`` evaluated twice: ``key`` of ``fam`` at its first and last evaluation."""
    out = []
    for run in res.runs:
        ev = run.evals.get(node) or []
        if len(ev) >= 2:
            a, b = ev[0]["families"].get(fam, {}).get(key), ev[-1]["families"].get(fam, {}).get(key)
            if a is not None and b is not None:
                out.append((float(a), float(b)))
    return out


def _pair_text(ends: list[tuple[float, float]]) -> str:
    if not ends:
        return "-"
    return f"{statistics.fmean(x for x, _ in ends):.3f} -> {statistics.fmean(y for _, y in ends):.3f}"


def family_table(results: list[ConfigResult]) -> str:
    """Per configuration, node and family: held-out exact accuracy at the first and the last evaluation (mean over
    seeds, gain ± sd over seeds), greedy and pass@8 beside it: what each node learned on each family."""
    head = ("config", "node", "family", "exact start -> end", "gain", "greedy start -> end", "pass@8 start -> end",
            "majority")  # fmt: skip
    body = []
    for res in results:
        keys = sorted({(fam, node) for run in res.runs for node, ev in run.evals.items() if ev
                       for fam in ev[0].get("families", {})})  # fmt: skip
        for fam, node in sorted(keys, key=lambda k: (k[1], k[0])):
            gains = [b - a for a, b in _family_ends(res, fam, node, "accuracy")]
            gain = _spread(statistics.fmean(gains), statistics.stdev(gains) if len(gains) > 1 else 0.0, len(gains),
                           3) if gains else "-"  # fmt: skip
            major = [float(m) for _, m in _family_ends(res, fam, node, "majority_baseline")]
            pairs = [_pair_text(_family_ends(res, fam, node, k)) for k in ("accuracy", "greedy_accuracy", "pass_at_8")]
            majority = _fmt(statistics.fmean(major)) if major else "-"
            body.append((res.name, node, fam, pairs[0], gain, pairs[1], pairs[2], majority))
    return md_table(head, body, numeric_from=3)


def lacking_and_own(results: list[ConfigResult]) -> dict[int, tuple[str, str]]:
    """Per node evaluated on two or more families: ``(lacking, own)``, the families with the lowest and the highest
    held-out exact accuracy at its first evaluation (mean over configurations and seeds; a specialised node's
    initial model is the same in every configuration); a node whose families start equal has none."""
    starts: dict[int, dict[str, list[float]]] = {}
    for res in results:
        for run in res.runs:
            for node, ev in run.evals.items():
                for fam, f in (ev[0].get("families", {}) if ev else {}).items():
                    if f.get("accuracy") is not None:
                        starts.setdefault(node, {}).setdefault(fam, []).append(float(f["accuracy"]))
    out = {}
    for node, fams in sorted(starts.items()):
        order = sorted(fams, key=lambda fam: (statistics.fmean(fams[fam]), fam))
        if len(order) >= 2 and statistics.fmean(fams[order[0]]) < statistics.fmean(fams[order[-1]]):
            out[node] = (order[0], order[-1])  # equal starts name no family lacking
    return out


def _problem_scores(family: dict[str, Any]) -> dict[str, float]:
    """Per held-out problem of one family's evaluation record: the share of its samples scored right ({} when the
    record has no per-problem items)."""
    return {
        str(it["key"]): int(it["samples_right"]) / int(it["n_samples"])
        for it in family.get("items") or []
        if int(it.get("n_samples") or 0) > 0
    }


def _sem(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def change_se(res: ConfigResult, fam: str, node: int) -> tuple[float, str] | None:
    """The standard error of ``node``'s change on ``fam`` (held-out exact, first to last evaluation) and what it is
    over: with several seeds, over seeds (sd of the per-seed changes / sqrt(k)); with one seed, over problems (the
    same problems scored at both ends, so sd of the per-problem changes / sqrt(n): the cell's noise from which
    problems were drawn). None when neither can be computed."""
    ends = _family_ends(res, fam, node, "accuracy")
    if len(ends) > 1:
        se = _sem([b - a for a, b in ends])
        return (se, "seeds") if se is not None else None
    for run in res.runs:  # the one run that gave ``ends``: the same selection as _family_ends
        ev = run.evals.get(node) or []
        fams = (ev[0].get("families", {}), ev[-1].get("families", {})) if len(ev) >= 2 else ({}, {})
        if fams[0].get(fam, {}).get("accuracy") is None or fams[1].get(fam, {}).get("accuracy") is None:
            continue
        first, last = _problem_scores(fams[0][fam]), _problem_scores(fams[1][fam])
        if set(first) != set(last):  # not the same problems at both ends: no paired error describes the means
            return None
        se = _sem([last[k] - first[k] for k in first])
        return (se, "problems") if se is not None else None
    return None


def level_se(res: ConfigResult, fam: str, node: int) -> dict[int, float]:
    """Per evaluated step: the standard error of ``node``'s held-out exact on ``fam`` over its problems, each
    problem's score first averaged over the seeds (every seed scores the same problems, so pooling them would count
    each problem once a seed); steps whose records carry no per-problem items are left out. It is the spread of the
    level over problems, which is mostly their difficulty: lines that share the problems differ by less noise than
    two bands suggest."""
    by: dict[int, dict[str, list[float]]] = {}
    for run in res.runs:
        for e in run.evals.get(node) or []:
            cell = by.setdefault(int(e["step"]), {})
            for key, score in _problem_scores(e.get("families", {}).get(fam, {})).items():
                cell.setdefault(key, []).append(score)
    out: dict[int, float] = {}
    for at, problems in sorted(by.items()):
        se = _sem([statistics.fmean(v) for v in problems.values()])
        if se is not None:
            out[at] = se
    return out


def _change_text(fam: str, ends: list[tuple[float, float]], se: tuple[float, str] | None = None) -> str:
    """``fam 0.14 -> 0.45, up 0.31`` (means over seeds), in words a reader needs no legend for, with the change's
    standard error when there is one (``± 0.040 SE`` over problems, ``± 0.040 SE (seeds)`` over seeds)."""
    if not ends:
        return f"{fam}: -"
    a, b = statistics.fmean(x for x, _ in ends), statistics.fmean(y for _, y in ends)
    d = b - a
    change = "no change" if abs(d) < 0.0005 else f"{'up' if d > 0 else 'down'} {abs(d):.3f}"
    spread = f" ± {se[0]:.3f}" + (" SE" if se[1] == "problems" else " SE (seeds)") if se is not None else ""
    return f"{fam}: {a:.3f} -> {b:.3f}, {change}{spread}"


def glance_table(results: list[ConfigResult]) -> str:
    """The short table of what to look at: per configuration and node, held-out exact accuracy on the family the
    node lacks and on its own family, first to last evaluation ("" when no node evaluated two families)."""
    roles = lacking_and_own(results)
    if not roles:
        return ""
    body = []
    for res in results:
        for node, (lacking, own) in roles.items():
            body.append(
                (
                    res.name,
                    f"node {node}",
                    _change_text(lacking, _family_ends(res, lacking, node, "accuracy"), change_se(res, lacking, node)),
                    _change_text(own, _family_ends(res, own, node, "accuracy"), change_se(res, own, node)),
                )
            )
    head = ("configuration", "node", "the family it lacks", "its own family")
    return md_table(head, body, numeric_from=len(head))


def plot_family_panels(results: list[ConfigResult], path: Path, title: str) -> Path:
    """:func:`family_panels_figure`, saved as ``path``."""
    import matplotlib.pyplot as plt

    fig = family_panels_figure(results, title)
    fig.savefig(path)
    plt.close(fig)
    return path


def family_panels_figure(results: list[ConfigResult], title: str) -> Any:
    """Held-out exact accuracy per family (one panel each), a line per (configuration, node): the colour is the
    configuration, the line style the node, and the legend shows them that way (a colour patch per configuration,
    a long black sample of each node's line style); the title says what to look at."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    curves = {res.name: res.family_curves() for res in results}
    families = sorted({fam for c in curves.values() for fam, _ in c})
    nodes = sorted({node for c in curves.values() for _, node in c})
    fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 4.6), dpi=110, squeeze=False)
    styles: list[Any] = ["-", "--", ":", "-."]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, fam in zip(axes[0], families, strict=True):
        for ci, (_name, c) in enumerate(curves.items()):
            for (f, node), (steps, vals) in c.items():
                if f == fam:
                    ax.plot(steps, vals, marker="o", markersize=3, linestyle=styles[node % len(styles)],
                            color=colors[ci % len(colors)])  # fmt: skip
        ax.set_title(f"{fam}: held-out exact")
        ax.set_xlabel("learner step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    handles: list[Any] = [Patch(color=colors[ci % len(colors)], label=name) for ci, name in enumerate(curves)]
    handles += [Line2D([], [], color="black", linestyle=styles[n % len(styles)], label=f"node {n}") for n in nodes]
    axes[0][0].legend(handles=handles, loc="best", fontsize="small", handlelength=3.5)
    roles = lacking_and_own(results)
    look = (
        "does each node rise on the family it lacks, and keep its own?"
        if roles
        else "does held-out exact accuracy rise over the steps?"
    )
    fig.suptitle(f"{title}: {look}\n(held-out exact per family; colour: configuration, line style: node)")
    fig.tight_layout()
    return fig


def peer_level(results: list[ConfigResult], roles: dict[int, tuple[str, str]], node: int) -> float | None:
    """What ``node``'s peers know of the family it lacks: the first held-out exact accuracy on it of the nodes whose
    own family it is, mean over them, configurations and seeds (None when no node has it as its own)."""
    lacking = roles[node][0]
    vals = [
        float(ev[0]["families"][lacking]["accuracy"])
        for res in results
        for run in res.runs
        for other, ev in run.evals.items()
        if other != node and roles.get(other, ("", ""))[1] == lacking and ev
        and ev[0].get("families", {}).get(lacking, {}).get("accuracy") is not None
    ]  # fmt: skip
    return statistics.fmean(vals) if vals else None


def plot_lacking_panels(results: list[ConfigResult], path: Path, title: str) -> Path | None:
    """:func:`lacking_panels_figure`, saved as ``path`` (None, and nothing written, when no node lacks a family)."""
    import matplotlib.pyplot as plt

    fig = lacking_panels_figure(results, title)
    if fig is None:
        return None
    fig.savefig(path)
    plt.close(fig)
    return path


def lacking_panels_figure(results: list[ConfigResult], title: str) -> Any:
    """The transfer picture: one panel per node, the held-out exact accuracy of the family it lacks over the steps, a
    line per configuration with a band of one standard error over problems; None when no node lacks a family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roles = lacking_and_own(results)
    if not roles:
        return None
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(roles), figsize=(5.5 * len(roles), 4.6), dpi=110, squeeze=False)
    for ax, (node, (lacking, own)) in zip(axes[0], roles.items(), strict=True):
        for ci, res in enumerate(results):
            steps, vals = res.family_curves().get((lacking, node), ([], []))
            if not steps:
                continue
            color = colors[ci % len(colors)]
            ax.plot(steps, vals, marker="o", markersize=3, color=color, label=res.name)
            se = level_se(res, lacking, node)
            if all(step in se for step in steps):
                lo = [v - se[step] for step, v in zip(steps, vals, strict=True)]
                hi = [v + se[step] for step, v in zip(steps, vals, strict=True)]
                ax.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
        level = peer_level(results, roles, node)
        if level is not None:
            ax.axhline(level, color="grey", linestyle="--", linewidth=1, label="its peer's level at the start")
        ax.set_title(f"node {node}: {lacking}, the family it lacks ({own} is its own)", fontsize="medium")
        ax.set_xlabel("learner step")
        ax.set_ylabel("held-out exact")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle(f"{title}: does each node learn the family only its peer knows?\n"
                 "(held-out exact on the family the node lacks; band: one standard error over problems)")  # fmt: skip
    fig.tight_layout()
    return fig


def write_report(out: str | Path, *, title: str = "experiment", order: list[str] | None = None,
                 results: list[ConfigResult] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Write ``results.csv``, ``results.md``, ``report.html`` and the plots (``rewards.png``; with per-family
    evaluations ``families.png``, and ``lacking.png`` where nodes lack a family) into ``out``; return the table rows.
    ``results``: what :func:`collect` read of ``out`` already (a caller that shows it too reads the run once)."""
    out = Path(out)
    results = collect(out, order) if results is None else results
    rows: list[dict[str, Any]] = []
    baseline = None
    for res in results:
        row = res.row(baseline)
        if baseline is None:
            baseline = row["cumulative_reward"] or None
            row["ratio_vs_baseline"] = 1.0 if baseline else float("nan")
        rows.append(row)
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    reward = (
        "training reward of each node's own rollouts (reward_mean, with the families' partial credit) summed over "
        "nodes and steps, mean ± std over seeds; cumulative exact = the same for completions whose answer is exactly "
        "right (exact_mean)"
        if has_partial_credit(rows)
        else "training reward of each node's own rollouts (reward_mean: 1 for an exactly right answer, else 0; "
        "these families give no partial credit) summed over nodes and steps, mean ± std over seeds"
    )
    glance = glance_table(results)
    if glance:
        glance = (
            "## What to look at\n\nHeld-out exact accuracy (problems no node trains on) from the first to the last "
            "evaluation, mean over seeds. Each node starts weaker on one family, the one it lacks, and stronger on "
            "its own; a configuration helps when the family it lacks rises and its own does not fall. ± is one "
            "standard error of the change: over the evaluated problems (one seed), or over seeds.\n\n"
            + glance
            + "\n## Full table\n\n"
        )
    md = (
        f"# {title}\n\n{glance}Cumulative reward = {reward}. Held-out exact = mean over nodes of exact-match "
        "accuracy on problems of the held-out split, which no node trains on, at the first and the last "
        "evaluation; its gain is the learning measure (mean ± std over seeds), to be read against the majority "
        "baseline (always giving the most common gold answer of the held-out items) and pass@8 (a fall is "
        "sharpening, not new skill).\n\n"
    )
    families = family_table(results) if any(r.family_curves() for r in results) else ""
    if families:
        families = (
            "\n\nPer node and family (held-out exact at the first and the last evaluation, mean over seeds; a node "
            "warm-started on some families only shows here what it learned on the others):\n\n" + families
        )
    (out / "results.md").write_text(md + markdown_table(rows) + families)
    write_html_report(out, results, rows, title)
    if rows:
        plot_curves(results, out / "rewards.png", title)
        if families:
            plot_family_panels(results, out / "families.png", title)
            plot_lacking_panels(results, out / "lacking.png", title)
    logger.info("wrote results for %d configurations into %s", len(rows), out)
    return rows
