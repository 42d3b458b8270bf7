"""Turn a simulator run directory into a results table (CSV + Markdown) and reward-curve plots (PNG).

Layout read: ``OUT/<configuration>/seed<k>/node<i>/metrics.jsonl`` (one JSON object per learner step, written
by :class:`node.runtime.Node`). Cumulative reward is ``reward_mean`` summed over nodes and steps (the SAPO
paper's "total reward"), per seed, then averaged over seeds with its standard deviation. Knows nothing about
how the nodes were run.
"""

from __future__ import annotations

import csv
import logging
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.metrics import read_jsonl

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
    "final_reward",
    "external_groups",
    "rejected",
    "ratio_vs_baseline",
)


@dataclass
class SeedRun:
    """Per-node metric rows of one (configuration, seed)."""

    seed: int
    nodes: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def cumulative_reward(self) -> float:
        return math.fsum(float(r.get("reward_mean", 0.0)) for rows in self.nodes.values() for r in rows)

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
        return {
            "config": self.name,
            "seeds": len(self.runs),
            "nodes": max((len(r.nodes) for r in self.runs), default=0),
            "steps": steps,
            "cumulative_reward": mean,
            "cumulative_reward_std": statistics.stdev(cums) if len(cums) > 1 else 0.0,
            "final_reward": statistics.fmean(r.final_reward(tail) for r in self.runs) if self.runs else 0.0,
            "external_groups": statistics.fmean(r.external_groups() for r in self.runs) if self.runs else 0.0,
            "rejected": statistics.fmean(r.rejected() for r in self.runs) if self.runs else 0.0,
            "ratio_vs_baseline": (mean / baseline) if baseline else float("nan"),
        }

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


def _mean_spread(r: dict[str, Any]) -> str:
    # One seed has no spread: "± 0.00" would read as a measured, perfectly stable result.
    spread = f" ± {r['cumulative_reward_std']:.2f}" if r["seeds"] > 1 else ""
    return f"{r['cumulative_reward']:.2f}{spread}"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The results rows as a GitHub Markdown table."""
    head = (
        "| config | seeds | nodes | steps | cumulative reward (mean ± std) | ratio vs "
        f"{rows[0]['config'] if rows else 'baseline'} | final reward | external groups | rejected |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['seeds']} | {r['nodes']} | {r['steps']} | "
            f"{_mean_spread(r)} | {_fmt(r['ratio_vs_baseline'])} | "
            f"{r['final_reward']:.3f} | {_fmt(r['external_groups'])} | {_fmt(r['rejected'])} |"
        )
    return "\n".join(lines) + "\n"


def plot_curves(results: list[ConfigResult], path: Path, title: str) -> Path:
    """Reward per step for each configuration: mean over nodes, shaded between the min and max node."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for res in results:
        steps, mean, lo, hi = res.curve()
        if not steps:
            continue
        (line,) = ax.plot(steps, mean, label=res.name, linewidth=1.5)
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("learner step")
    ax.set_ylabel("reward (mean over nodes; band: min-max node)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(out: str | Path, *, title: str = "experiment", order: list[str] | None = None) -> list[dict[str, Any]]:
    """Write ``results.csv``, ``results.md`` and ``rewards.png`` into ``out``; return the table rows."""
    out = Path(out)
    results = collect(out, order)
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
    md = f"# {title}\n\nCumulative reward = reward_mean summed over nodes and steps, mean ± std over seeds.\n\n"
    (out / "results.md").write_text(md + markdown_table(rows))
    if rows:
        plot_curves(results, out / "rewards.png", title)
    logger.info("wrote results for %d configurations into %s", len(rows), out)
    return rows
