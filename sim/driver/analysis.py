"""The registered analysis: per-arm numbers, paired differences with 95% t-intervals, and the verdict read off
them by the registration's target rule.

Works on ``data[arm][seed]`` = a pair's record (``records``) and nothing else, so a result JSON re-analyses without
the runs. Knows nothing about running or writing.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from sim.driver.metrics import value
from sim.driver.stats import interval
from sim.registration import START, Condition, Registration

Data = dict[str, dict[int, dict[str, Any]]]


def arm_summary(data: Data, reg: Registration, readout: str) -> dict[str, Any]:
    """arm -> {"seeds": [...], metric: {"start": [...], "end": [...]}} over the arm's finished seeds."""
    out: dict[str, Any] = {}
    for arm, pairs in data.items():
        seeds = sorted(pairs)
        out[arm] = {"seeds": seeds}
        for m in reg.metrics:
            out[arm][m] = {at: [value(pairs[k], reg, m, step) for k in seeds]
                           for at, step in (("start", "0"), ("end", readout))}  # fmt: skip
    return out


def compare(arms: dict[str, Any], reg: Registration, arm: str, control: str) -> dict[str, Any] | None:
    """Arm minus control at the readout, paired by seed, per metric: the differences, their mean and 95% interval,
    and ``beats`` (``yes``: the lower end above 0; ``worse``: the upper end below 0; else ``no``). The control
    ``start`` is the arm's own step-0 value (the gain over its start). None when they share fewer than two seeds."""
    if arm not in arms or (control not in arms and control != START):
        return None
    a = arms[arm]
    c = {"seeds": a["seeds"], **{m: {"end": a[m]["start"]} for m in reg.metrics}} if control == START else arms[control]
    seeds = sorted(set(a["seeds"]) & set(c["seeds"]))
    if len(seeds) < 2:
        return None
    row: dict[str, Any] = {"arm": arm, "control": control, "seeds": seeds}
    for m in reg.metrics:
        ea, ec = dict(zip(a["seeds"], a[m]["end"], strict=True)), dict(zip(c["seeds"], c[m]["end"], strict=True))
        d = [ea[k] - ec[k] for k in seeds]
        mean, lo, hi = interval(d, reg.analysis.interval)
        beats = "yes" if lo > 0 else ("worse" if hi < 0 else "no")
        row[m] = {"diff": d, "mean": mean, "lo": lo, "hi": hi, "beats": beats}
    return row


def better_of(arms: dict[str, Any], names: list[str], metric: str) -> str | None:
    """The arm among ``names`` with the higher mean of ``metric`` at the readout (None if none has run). An arm whose
    mean is undefined (NaN) counts as the better: a control that cannot be read fails the comparison, whatever the
    order of ``names``."""
    ran = [n for n in names if n in arms]
    means = {n: statistics.fmean(arms[n][metric]["end"]) for n in ran}
    return max(ran, key=lambda n: (math.isnan(means[n]), means[n])) if ran else None


def control_of(arms: dict[str, Any], names: list[str], metric: str) -> tuple[str | None, str]:
    """The control a ``beats`` condition naming ``names`` reads (the pair's own start, else :func:`better_of`), and
    how a report names the choice (`` (the better of a, b)`` where there were several)."""
    ctl = START if names == [START] else better_of(arms, names, metric)
    return ctl, f" (the better of {', '.join(names)})" if len(names) > 1 else ""


def _condition(arms: dict[str, Any], reg: Registration, cand: str, c: Condition) -> tuple[bool, str]:
    """Whether ``c`` holds for candidate ``cand``, and the line that says so."""
    metric, subject = c.metric or reg.primary, c.arm or cand
    if subject not in arms:
        return False, f"{subject} has not run"
    if c.beats is not None:
        names = [c.beats] if isinstance(c.beats, str) else c.beats
        ctl, which = control_of(arms, names, metric)
        row = compare(arms, reg, subject, ctl) if ctl else None
        if row is None:
            return False, f"{subject} vs {'/'.join(names)}: fewer than two paired seeds"
        r = row[metric]
        ok = r["lo"] > c.above
        return ok, (f"{metric}: {subject} - {ctl}{which} = {r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}], "
                    f"lower end {'>' if ok else '<='} {c.above:+g}")  # fmt: skip
    mean = statistics.fmean(arms[subject][metric]["end"])
    of = ""
    if c.share_of is not None:
        if c.share_of not in arms or statistics.fmean(arms[c.share_of][metric]["end"]) == 0:
            return False, f"{metric}: {c.share_of} has not run or is 0 (no share of it)"
        mean, of = mean / statistics.fmean(arms[c.share_of][metric]["end"]), f" / {c.share_of}'s mean ="
    if c.at_least is not None:
        ok, bound = mean >= c.at_least, f">= {c.at_least:g}"
    else:
        assert c.at_most is not None  # the model allows exactly one of beats, at_least, at_most
        ok, bound = mean <= c.at_most, f"<= {c.at_most:g}"
    return ok, f"{metric}: {subject} mean{of} {mean:.3f} {'' if ok else 'not '}{bound}"


def verdict(arms: dict[str, Any], reg: Registration) -> dict[str, Any]:
    """The target read off the numbers: which candidates meet every condition, each condition's line, and whether
    every arm has every registered seed (else the verdict is an interim one); ``beside``: the same rule read for the
    target's ``beside`` arms, outside the verdict."""
    checks = {a: [_condition(arms, reg, a, c) for c in reg.target.all] for a in reg.target.arms if a in arms}
    met = [a for a, cs in checks.items() if all(ok for ok, _ in cs)]
    judged = [a for a, spec in reg.arms.items()  # references, ceilings and the arms read beside it aside
              if spec.role in ("treatment", "control") and a not in reg.target.beside]  # fmt: skip
    beside = {a: [_condition(arms, reg, a, c) for c in reg.target.all] for a in reg.target.beside if a in arms}
    complete = all(set(reg.seeds) <= set(arms.get(a, {}).get("seeds", [])) for a in judged)
    head = f"**Target met** by {', '.join(met)}" if met else "**Target not met**"
    text = f"{head}: {reg.target.text}" if reg.target.text else head
    if not complete:
        text += " (interim: not every arm has every registered seed)"
    out = {"met": bool(met), "by": met, "complete": complete, "text": text,
           "checks": {a: [{"ok": ok, "line": line} for ok, line in cs] for a, cs in checks.items()}}  # fmt: skip
    if beside:
        out["beside"] = {a: {"met": all(ok for ok, _ in cs), "complete": set(reg.seeds) <= set(arms[a]["seeds"]),
                             "checks": [{"ok": ok, "line": line} for ok, line in cs]}
                         for a, cs in beside.items()}  # fmt: skip
    return out


def analyse(data: Data, reg: Registration, readout: str) -> dict[str, Any]:
    """The registered analysis of ``data``: arms, the registered comparisons, the verdict."""
    arms = arm_summary(data, reg, readout)
    wanted = list(dict.fromkeys(tuple(p) for p in reg.comparisons))
    rows = [r for a, c in wanted if (r := compare(arms, reg, a, c)) is not None]
    return {"arms": arms, "comparisons": rows, "verdict": verdict(arms, reg) if data else None}


def baseline(data: Data, reg: Registration, readout: str) -> dict[str, float] | None:
    """The registration's baseline field at the readout (the problems are the same in every pair), from any pair
    that recorded it."""
    for pairs in data.values():
        for rec in pairs.values():
            b = rec["steps"][readout].get(reg.baseline) if reg.baseline else None
            if b and not any(math.isnan(v) for v in b.values()):
                return b
    return None
