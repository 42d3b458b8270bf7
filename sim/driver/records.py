"""What a finished (arm, seed) pair leaves: every node's held-out evaluations, read into one record.

A pair's record keeps, per evaluation step, the registration's parts averaged over the measured nodes
(``steps[step][key][part]``) and every node's own numbers (``per_node[step][node][family][key]``), so a metric
hook can read either. The record is what a result JSON stores, so a report is re-read from the JSON alone.

Knows nothing about arms, intervals or verdicts.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from node.eval import read_results
from sim.registration import Registration

#: What a record keeps per evaluation step: exact accuracy (sampled, and greedy where evaluated), pass@8, and the
#: majority-answer baseline of the same problems (always giving their most common gold answer: what an accuracy must
#: beat to show any skill).
RECORDED = ("accuracy", "pass_at_8", "majority_baseline", "greedy_accuracy")


def read_evals(node_dir: Path) -> list[dict[str, Any]]:
    """A node's held-out evaluations (``eval.jsonl``), oldest first; [] when it has none. A torn last line (a node
    in another process writing it as the driver reads) is skipped, as the node's own reader does."""
    return read_results(node_dir)


def pair_done(run_dir: Path, nodes: int, steps: int) -> bool:
    """Every node evaluated at the last step (the in-process simulator writes evaluations as they happen)."""
    return all((e := read_evals(run_dir / f"node{i}")) and e[-1]["step"] >= steps for i in range(nodes))


def _value(ev: dict[str, Any], fam: str, key: str) -> float:
    v = ev["families"][fam].get(key)
    return math.nan if v is None else float(v)  # pass@8 of an evaluation with fewer samples


def aggregate(per_node: dict[str, dict[str, dict[str, float]]], reg: Registration, key: str) -> dict[str, float]:
    """One step's ``key`` per part: ``all`` (every family of every measured node) and each registered part (its
    node's family, over the measured nodes it names), each the mean of its cells."""
    measured = [str(i) for i in reg.measured] if reg.measured is not None else sorted(per_node, key=int)
    out = {"all": statistics.fmean(v[key] for i in measured for _, v in sorted(per_node[i].items()))}
    for part, fams in reg.parts.items():
        cells = [per_node[str(i)][f][key] for i, f in sorted(fams.items()) if str(i) in measured]
        if cells:
            out[part] = statistics.fmean(cells)
    return out


def pair_record(run_dir: Path, nodes: int, reg: Registration) -> dict[str, Any]:
    """A finished pair's record: {"steps": {step: {key: {part: v}}}, "per_node": {step: {node: {fam: {key: v}}}}}."""
    evals = {i: {e["step"]: e for e in read_evals(run_dir / f"node{i}")} for i in range(nodes)}
    per_node = {
        str(step): {str(i): {f: {k: _value(evals[i][step], f, k) for k in RECORDED}
                             for f in sorted(evals[i][step]["families"])} for i in range(nodes)}
        for step in sorted(evals[0])
    }  # fmt: skip
    steps = {s: {k: aggregate(nodes_, reg, k) for k in RECORDED} for s, nodes_ in per_node.items()}
    return {"steps": steps, "per_node": per_node}
