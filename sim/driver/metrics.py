"""Metric hooks: how a registered metric turns one pair's record into one number at one evaluation step.

A hook is a plain function ``(record, registration, spec, step) -> float`` registered in :data:`METRICS` under the
name a registration's ``metrics.<name>.hook`` gives. Adding an experiment with a derived metric is one function
here and one line in the table, never code in the YAML.

Knows nothing about arms, seeds or intervals.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from sim.registration import MetricSpec, Registration
from sim.report.gains import closed_fraction, has_gap

Hook = Callable[[dict[str, Any], Registration, MetricSpec, str], float]


def exact(record: dict[str, Any], reg: Registration, spec: MetricSpec, step: str) -> float:
    """The mean of ``spec.key`` over the part's (node, family) cells (``records.aggregate``)."""
    return record["steps"][step][spec.key][spec.part]


def gap_closed(record: dict[str, Any], reg: Registration, spec: MetricSpec, step: str) -> float:
    """How much of the gap to its peers a node closed on the family it lacks, mean over the measured nodes of
    ``(end - start) / (peer level - start)``: ``start`` and ``end`` the node's ``spec.key`` on its ``lacking``
    family at step 0 and ``step``, the peer level the mean step-0 ``spec.key`` of the other nodes whose ``known``
    family it is (each seed's own start when the warm start is drawn per seed). 0 at step 0 by construction.
    Undefined (NaN) for a node whose peers start no better than it does (there is no gap: an untrained quick
    model, say, or a seed whose specialist's warm start failed); the mean is NaN then too, never a division by zero,
    unless ``spec.no_gap`` is ``left_out``: then it is the mean over the nodes with a gap (NaN if none has one)."""
    start, now = record["per_node"]["0"], record["per_node"][step]
    measured = set(reg.measured) if reg.measured is not None else None
    gaps = []
    for i, fam in sorted(reg.parts["lacking"].items()):
        if measured is not None and i not in measured:
            continue
        peers = [start[str(j)][fam][spec.key] for j, f in reg.parts["known"].items() if f == fam and j != i]
        s, peer = start[str(i)][fam][spec.key], statistics.fmean(peers)
        if has_gap(s, peer) or spec.no_gap == "undefined":
            gaps.append(closed_fraction(s, peer, now[str(i)][fam][spec.key]))
    return statistics.fmean(gaps) if gaps else math.nan


def over_baseline(record: dict[str, Any], reg: Registration, spec: MetricSpec, step: str) -> float:
    """Exact accuracy minus the majority-answer baseline of the same problems, over the part's cells (above 0: some
    skill beyond always giving the most common answer)."""
    now = record["steps"][step]
    return now["accuracy"][spec.part] - now["majority_baseline"][spec.part]


#: Hook name -> function (a registration's ``metrics.<name>.hook``).
METRICS: dict[str, Hook] = {"exact": exact, "gap_closed": gap_closed, "over_baseline": over_baseline}
#: What a hook needs of the registration: the parts it reads.
NEEDS_PARTS = {"gap_closed": ("lacking", "known")}


def check_hooks(reg: Registration) -> None:
    """Every metric names a known hook and the registration declares the parts it reads (one clear line if not)."""
    for name, spec in reg.metrics.items():
        if spec.hook not in METRICS:
            raise SystemExit(f"metric {name!r}: unknown hook {spec.hook!r}; known: {sorted(METRICS)}")
        missing = [p for p in NEEDS_PARTS.get(spec.hook, ()) if p not in reg.parts]
        if missing:
            raise SystemExit(f"metric {name!r} ({spec.hook}) needs registration parts {missing}")


def value(record: dict[str, Any], reg: Registration, name: str, step: str) -> float:
    """Metric ``name`` of one pair at evaluation step ``step`` (less its value at step 0 for a ``gain``)."""
    spec = reg.metrics[name]
    now = METRICS[spec.hook](record, reg, spec, step)
    return now - METRICS[spec.hook](record, reg, spec, "0") if spec.gain else now
