"""The tables of docs/benchmarks.md and the README's Results, written from the committed result JSON (never typed by
hand).

Every registered experiment (a ``configs/sim/*.yaml`` with a ``registration:`` block) whose result JSON is committed
under ``benchmarks/results/`` gets one section between the markers below in docs/benchmarks.md (where it was
registered, its verdict, the per-arm table of the primary metric and the paired comparisons) and one row in the
README's Results: the question, the answer the registered verdict gives (yes: met; partly: not met, but some of the
candidate's conditions hold; no), the headline number with its 95% t-interval, and a link to the section.

    python benchmarks/tables.py            # rewrite the generated parts of docs/benchmarks.md and README.md
    python benchmarks/tables.py --check    # exit 1 if the committed tables differ from what this writes (a test)

It lives with the driver whose results it reads; ``benchmarks/tables.py`` is its command line.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
BEGIN = "<!-- tables: written by `python benchmarks/tables.py` from benchmarks/results/*.json; do not edit -->"
END = "<!-- end of tables -->"
README_BEGIN = "<!-- results: written by `python benchmarks/tables.py` from benchmarks/results/*.json; do not edit -->"
README_END = "<!-- end of results -->"
GAP_BEGIN = "<!-- gap closed: written by `python benchmarks/tables.py` from benchmarks/results/*.json; do not edit -->"
GAP_END = "<!-- end of gap closed -->"


def registered() -> list[tuple[Path, Any, dict[str, Any]]]:
    """(YAML, registration, result JSON) of every registered experiment with a committed result, by file name. A
    result with no finished pair yet (only its starts saved: no verdict) has nothing to tabulate and is left out."""
    from sim.config import load_sim_config

    out = []
    for path in sorted((ROOT / "configs" / "sim").glob("*.yaml")):
        reg = load_sim_config(str(path)).registration
        result = ROOT / "benchmarks" / "results" / f"{reg.results}.json" if reg else None
        if result is not None and result.is_file():
            data = json.loads(result.read_text())
            if data.get("verdict") is not None:
                out.append((path, reg, data))
    return out


def section(path: Path, reg: Any, res: dict[str, Any]) -> list[str]:
    """One experiment's table: the per-arm primary metric and every paired comparison, from its JSON."""
    from sim.driver.stats import mean_sd

    p, prov = reg.primary, res["registration"]
    at = prov.get("registered") or {}
    lines = [
        f"### {heading(res, reg)}",
        "",
        f"`swarm-sim experiment {path.relative_to(ROOT)}` -> `benchmarks/results/{reg.results}.md`; registered at "
        f"commit {at.get('commit', '?')} on {at.get('date', '?')}, first result at commit "
        f"{prov.get('first_result') or '?'}; {len(reg.amendments)} amendment(s). {res['verdict']['text']}",
        "",
        f"| arm | role | seeds | {p} start | {p} end | paired diff against |",
        "|---|---|---:|---:|---:|---|",
    ]
    for arm, a in res["arms"].items():
        diffs = "; ".join(f"{c['control']} {c[p]['mean']:+.3f} [{c[p]['lo']:+.3f}, {c[p]['hi']:+.3f}]"
                          for c in res["comparisons"] if c["arm"] == arm)  # fmt: skip
        lines.append(f"| {arm} | {reg.arms[arm].role} | {len(a['seeds'])} | {mean_sd(a[p]['start'])} | "
                     f"{mean_sd(a[p]['end'])} | {diffs} |")  # fmt: skip
    return [*lines, ""]


def heading(res: dict[str, Any], reg: Any) -> str:
    return f"{res['name']}: {reg.question.split('?')[0]}?"


def doc_link(res: dict[str, Any], reg: Any) -> str:
    """A Markdown link from the README to the experiment's section of docs/benchmarks.md."""
    return f"[{res['name']}](docs/benchmarks.md#{anchor(heading(res, reg))})"


def anchor(text: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def answer(reg: Any, res: dict[str, Any]) -> tuple[str, str]:
    """(yes / partly / no, the arm it is about): the registered verdict, read off the JSON; ``interim (arms at
    k-m of n seeds)`` while not every arm has every registered seed, whatever the partial verdict says. ``partly``
    needs a condition of the candidate's own to hold, not one the target sets on a control (``arm: alone``)."""
    v = res["verdict"]
    arm0 = v["by"][0] if v["met"] else reg.target.arms[0]
    if not v.get("complete", True):
        names = dict.fromkeys([*reg.arms, *res["arms"]])  # a registered arm with no finished pair counts as 0
        done = sorted(len(res["arms"].get(a, {}).get("seeds", [])) for a in names) or [0]
        span = str(done[0]) if done[0] == done[-1] else f"{done[0]}-{done[-1]}"
        return f"interim (arms at {span} of {len(reg.seeds)} seeds)", arm0
    if v["met"]:
        return "yes", v["by"][0]

    def own(a: str) -> int:  # the conditions that hold of the candidate itself: "alone closes at most 5%" is not one
        return sum(c["ok"] for c, cond in zip(v["checks"][a], reg.target.all, strict=True) if cond.arm in (None, a))

    arm = max(v["checks"], key=own, default=reg.target.arms[0])
    return ("partly" if arm in v["checks"] and own(arm) else "no"), arm


def headline(reg: Any, res: dict[str, Any], arm: str) -> str:
    """The arm against the control of the target's first ``beats`` (its gain where that is ``start``; the better of
    its controls, as the verdict reads it, where it names several), the registration's primary metric, with the 95%
    t-interval of the per-seed differences; else the level of the first condition's metric (with its interval where
    there are seeds), or that the arm has not run yet."""
    from sim.driver.analysis import control_of
    from sim.driver.stats import t_interval

    beats = next((c for c in reg.target.all if c.beats is not None), None)
    if beats is not None:
        metric = beats.metric or reg.primary
        names = [beats.beats] if isinstance(beats.beats, str) else beats.beats
        control, which = control_of(res["arms"], names, metric)
        row = next((c for c in res["comparisons"] if c["arm"] == arm and c["control"] == control), None)
        if row is not None:
            m, lo, hi = t_interval(row[metric]["diff"])
            return f"{metric} {arm} - {control}{which}: {m:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    metric = reg.target.all[0].metric or reg.primary
    if arm not in res["arms"]:  # an interim registration whose candidate has no finished pair yet
        return f"{metric} {arm}: not run yet"
    ends = res["arms"][arm][metric]["end"]
    m, lo, hi = t_interval(ends)
    span = f" [{lo:.3f}, {hi:.3f}]" if len(ends) > 1 else " (one value: no interval)"
    return f"{metric} {arm}: {m:.3f}{span}"


def readme_table() -> list[str]:
    """The README's Results: one row per registered question."""
    lines = ["| question | answer | number [95% interval] | reading |", "|---|---|---|---|"]
    for _, reg, res in registered():
        word, arm = answer(reg, res)
        link = doc_link(res, reg)
        lines.append(f"| {reg.question.split('?')[0]}? | {word} | {headline(reg, res, arm)} | {link} |")
    return lines


def gap_table() -> list[str]:
    """The README's lead: for every registered experiment whose primary metric is a gap closed (``gap_closed``), each
    arm's share of the gap to its peer's level closed on the family it lacks (mean, 95% t-interval and range over
    seeds) and its change over all its families, arms in order of gap closed."""
    from sim.driver.stats import t_interval

    lines: list[str] = []
    for _, reg, res in registered():
        metric = reg.metrics.get(reg.primary)
        if metric is None or metric.hook != "gap_closed":
            continue
        word, _ = answer(reg, res)
        link = doc_link(res, reg)
        lines += [f"{link} ({reg.setting} setting; {word}): {reg.question.split('?')[0]}?", "",
                  "| arm | role | seeds | gap closed [95% interval] (range) | all families, change |",
                  "|---|---|---:|---|---|"]  # fmt: skip
        # best first; an arm without a finished seed has no row, an undefined gap (NaN: no gap to close) comes last
        means = {
            arm: statistics.fmean(a[reg.primary]["end"]) for arm, a in res["arms"].items() if a[reg.primary]["end"]
        }
        for arm in sorted(means, key=lambda arm: (math.isnan(means[arm]), -means[arm])):
            a = res["arms"][arm]
            ends = a[reg.primary]["end"]
            m, lo, hi = t_interval(ends)
            ci = f" [{lo:+.2f}, {hi:+.2f}]" if len(ends) > 1 else ""
            change = [e - b for b, e in zip(a["all"]["start"], a["all"]["end"], strict=True)] if "all" in a else []
            dm = f"{sum(change) / len(change):+.3f}" if change else "-"
            role = reg.arms[arm].role if arm in reg.arms else "(not registered)"
            lines.append(f"| {arm} | {role} | {len(ends)} | **{m:.2f}**{ci} ({min(ends):.2f} to "
                         f"{max(ends):.2f}) | {dm} |")  # fmt: skip
        lines.append("")
    return lines


def splice(text: str, begin: str, end: str, lines: list[str]) -> str:
    """``text`` with the part between ``begin`` and ``end`` written anew (appended if it has none)."""
    block = "\n".join([begin, *lines, end])
    if begin in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def render(text: str) -> str:
    """``text`` (docs/benchmarks.md) with its generated part written anew."""
    body = ["", "## Registered experiments (generated)", ""]
    for path, reg, res in registered():
        body += section(path, reg, res)
    return splice(text, BEGIN, END, body)


def render_readme(text: str) -> str:
    """``text`` (README.md) with its Results table and its gap-closed lead written anew (the lead only where the
    README has its markers)."""
    text = splice(text, README_BEGIN, README_END, ["", *readme_table(), ""])
    return splice(text, GAP_BEGIN, GAP_END, ["", *gap_table()]) if GAP_BEGIN in text else text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md's tables are not current")
    args = ap.parse_args()
    stale = []
    for path, write in ((DOC, render), (README, render_readme)):
        text = path.read_text()
        new = write(text)
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(
            f"{', '.join(map(str, stale))} differ from the result JSON: run python benchmarks/tables.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
