"""The report of a registered experiment: its registration and history, the per-arm table, the paired differences,
the per-seed readout, the registered verdict, and a plot of the primary metric over steps.

Reads only what ``analysis`` computed and the records; writes nothing but the returned text and the plot.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from sim.config import SimConfig
from sim.driver.metrics import value
from sim.driver.stats import mean_sd
from sim.registration import Registration


def header(sim: SimConfig, reg: Registration, prov: dict[str, Any], machine: str, command: str) -> list[str]:
    """Title, registration and its history, and the set-up in one line."""
    n = sim.node_config(next(iter(reg.arms)), 0, sim.seeds[0])
    at = prov.get("registered")
    where = (
        f"registered at commit {at['commit']} on {at['date']} ({at['where']})"
        if at
        else "registered in no commit (a quick run)"
    )
    lines = [
        f"# {sim.name}: {reg.question.split('?')[0]}?" if "?" in reg.question else f"# {sim.name}",
        "",
        reg.question,
        "",
        f"- {where}; first result at commit {prov.get('first_result') or '(none yet)'}; registration "
        f"`{prov['hash']}` (`{prov['config']}`)",
        f"- {machine}",
        f"- command: `{command}`",
        f"- {sim.nodes} nodes x {sim.steps} steps, {n.rollout.prompts_per_step} prompts x {n.rollout.group_size} a "
        f"step, lr {n.learner.lr:g} (arms may set their own); held-out {reg.side.upper()} side, "
        f"{n.eval.items_per_family} problems a family x {n.eval.samples} samples; readout at step "
        f"{reg.readout if reg.readout != 'final' else sim.steps}",
        "- warm start drawn per seed (" + ", ".join(reg.per_seed) + ")" if reg.per_seed else
        "- every seed starts from the same models; a seed varies the task draws and every sample after that",
        "- metrics (the first is primary): " + "; ".join(f"**{k}** {m.text or m.hook}" for k, m in reg.metrics.items()),
        f"- analysis: paired by {reg.analysis.paired}, mean and "
        f"{'95% t-interval' if reg.analysis.interval == 't95' else 'mean ± 2 sd'}; target: {reg.target.text}",
    ]  # fmt: skip
    if reg.amendments:
        lines += ["", "Amendments:", ""]
        lines += [f"- {a.date}: {a.change}" + (f" (replaced registration `{a.before}`)" if a.before else "")
                  for a in reg.amendments]  # fmt: skip
    return [*lines, ""]


def stock_lines(start: dict[str, Any], sim: SimConfig) -> list[str]:
    """The shared start per part beside the stock model's line (same items, same token budget)."""
    n = sim.node_config(sim.configurations[0].name, 0, sim.seeds[0])
    rec = start["record"]
    at_start = ", ".join(f"{part} exact {rec['accuracy'][part]:.3f} (pass@8 {rec['pass_at_8'][part]:.3f})"
                         for part in rec["accuracy"])  # fmt: skip
    if n.model.warm_start is None:  # a built-in recipe: its own build is the start; there is no other stock model
        return ["## The start", "", f"Evaluated once for every pair (the initial models are fixed): {at_start}", ""]
    lines = [
        "## The start, and the stock model at the same budget",
        "",
        f"Evaluated once for every pair (the warm starts are fixed); the stock model is `{start['stock_model']}` "
        f"without its warm start, on the same items, {n.eval.max_new_tokens or n.rollout.max_new_tokens} new tokens. "
        "An arm's end above the warm-started start but below the stock line is recovery, not new skill.",
        "",
        "| family | stock exact | stock pass@8 |",
        "|---|---:|---:|",
    ]
    for fam, v in sorted(start["stock"].items()):
        p8 = v["pass_at_8"]
        lines.append(f"| {fam} | {v['accuracy']:.3f} | {'n/a' if p8 is None else f'{p8:.3f}'} |")
    return [*lines, "", f"Warm-started start, averaged over nodes: {at_start}", ""]


def retired_lines(retired: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The pairs retired because their seed's start could not be rebuilt (``--restart-rebuilt``): named, never read."""
    lines = ["## Retired pairs (not in any number above)", ""]
    lines.append("A seed's finished pairs are retired when a later machine builds another warm start from the same "
                 "recipe (floating point differs between machines): pairs run from it would not pair with them, so "
                 "every arm of that seed ran again from the new start. The retired pairs stay in the JSON "
                 "(`retired`), with the start they ran from.")  # fmt: skip
    lines.append("")
    for seed, entries in sorted(retired.items(), key=lambda kv: int(kv[0])):
        for e in entries:
            arms = ", ".join(sorted(e.get("pairs", {}))) or "no finished pair (only the saved start was replaced)"
            lines.append(f"- seed {seed}, {e.get('when', '?')}: {arms}")
    return [*lines, ""]


def interval(r: dict[str, float], split: bool = True) -> str:
    """``+mean | [lo, hi]``: two cells of the differences table, or with ``split=False`` one (``+mean [lo, hi]``)."""
    return f"{r['mean']:+.3f}{' |' if split else ''} [{r['lo']:+.3f}, {r['hi']:+.3f}]"


def tables(result: dict[str, Any], reg: Registration) -> list[str]:
    """The per-arm table, the paired differences and the per-seed readout (from the analysis alone)."""
    arms, p = result["arms"], reg.primary
    span, cell = ("95% interval", "[95%]") if reg.analysis.interval == "t95" else ("mean ± 2 sd", "[± 2 sd]")
    others = [m for m in reg.metrics if m != p]
    lines = ["## Per arm (mean ± sd over seeds)", "",
             f"| arm | role | seeds | {p} start | {p} end | gain |" + "".join(f" {m} start -> end |" for m in others),
             "|---|---|---:|---:|---:|---:|" + "---:|" * len(others)]  # fmt: skip
    for arm, a in arms.items():
        gain = [e - s for s, e in zip(a[p]["start"], a[p]["end"], strict=True)]
        row = f"| {arm} | {reg.arms[arm].role} | {len(a['seeds'])} | {mean_sd(a[p]['start'])} | "
        row += f"{mean_sd(a[p]['end'])} | {mean_sd(gain)} |"
        row += "".join(f" {mean_sd(a[m]['start'])} -> {mean_sd(a[m]['end'])} |" for m in others)
        lines.append(row)
    if result.get("baseline"):
        parts = ", ".join(f"{k} {v:.3f}" for k, v in result["baseline"].items())
        lines += ["", f"Baseline ({reg.baseline}: always the most common gold answer of the evaluated problems; an "
                  f"exact accuracy at or below it shows no skill): {parts}."]  # fmt: skip
    lines += ["", "## Paired differences at the readout (arm minus control, same seeds)", "",
              f"| arm | control | seeds | {p} diff | {span} | beats it |"
              + "".join(f" {m} diff {cell} |" for m in others),
              "|---|---|---:|---:|---|---|" + "---|" * len(others)]  # fmt: skip
    for c in result["comparisons"]:
        r = c[p]
        row = f"| {c['arm']} | {c['control']} | {len(c['seeds'])} | {interval(r)} | {r['beats']} |"
        row += "".join(f" {interval(c[m], split=False)} |" for m in others)  # one header cell each
        lines.append(row)
    seeds = sorted({k for a in arms.values() for k in a["seeds"]})
    lines += ["", f"## Per seed ({p} at the readout)", "", "| arm | " + " | ".join(f"s{k}" for k in seeds) + " |",
              "|---|" + "---:|" * len(seeds)]  # fmt: skip
    for arm, a in arms.items():
        ends = dict(zip(a["seeds"], a[p]["end"], strict=True))
        lines.append(f"| {arm} | " + " | ".join(f"{ends[k]:.3f}" if k in ends else "" for k in seeds) + " |")
    v = result["verdict"]
    lines += ["", "## Verdict (the registered target)", "", v["text"], ""]
    for arm, checks in v["checks"].items():
        lines += [f"- {arm}: " + "; ".join(("holds: " if c["ok"] else "fails: ") + c["line"] for c in checks)]
    if v.get("beside"):
        lines += ["", "## The same rule, beside the verdict (arms added by amendment; never in the answer)", ""]
        for arm, b in v["beside"].items():
            interim = "" if b.get("complete", True) else " (interim: not every registered seed)"
            lines += [f"- {arm} {'would meet' if b['met'] else 'would not meet'} it{interim}: "
                      + "; ".join(("holds: " if c["ok"] else "fails: ") + c["line"] for c in b["checks"])]  # fmt: skip
    return [*lines, ""]


def plot(data: dict[str, dict[int, dict[str, Any]]], reg: Registration, title: str, path: Path) -> Path:
    """The primary metric at every evaluation step, mean over seeds with the seeds' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arm, pairs in data.items():
        curves: dict[int, list[float]] = {}
        for rec in pairs.values():
            for step in rec["steps"]:
                curves.setdefault(int(step), []).append(value(rec, reg, reg.primary, step))
        xs = sorted(curves)
        ax.plot(xs, [statistics.fmean(curves[x]) for x in xs], marker="o", label=f"{arm} ({len(pairs)} seeds)")
        ax.fill_between(xs, [min(curves[x]) for x in xs], [max(curves[x]) for x in xs], alpha=0.12)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{reg.primary}: {reg.metrics[reg.primary].text or reg.metrics[reg.primary].hook}"[:60])
    ax.set_title(f"{title}: mean over seeds, band = seeds' range")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
