"""Result JSON written before the driver, read into its pair records, so an old experiment re-analyses under its
registration without being run again (``swarm-sim experiment CONFIG --analyze --legacy OLD.json``).

Three shapes, told apart by their keys:

* B7's CLI runs (``benchmarks/b7_generalization.py``): a list of ``{seed, before, after}``, one node's
  ``swarm-node eval --json`` of its initial model and of its final checkpoint;
* B6-real's rows (``benchmarks/b6_real.py``): ``{"experiment", "rows": [{arm, seed, step, nodes: [{before,
  after}]}]}``, each node's evaluation flat (one family, the experiment's);
* the lab gate's builds (``benchmarks/lab_gate.py``): a list of ``{name, recipe, eval}``, one evaluation of a
  built model (step 0; the arm is the registration's arm whose note starts with the build's name).

Knows nothing about intervals or verdicts: it only rebuilds what :func:`sim.driver.records.pair_record` would have.
"""

from __future__ import annotations

from typing import Any

from sim.config import SimConfig
from sim.driver.records import RECORDED, aggregate

Data = dict[str, dict[int, dict[str, Any]]]


def _cells(families: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {f: {k: float("nan") if v.get(k) is None else float(v[k]) for k in RECORDED} for f, v in families.items()}


def _record(per_node: dict[str, dict[str, dict[str, dict[str, float]]]], sim: SimConfig) -> dict[str, Any]:
    reg = sim.registration
    assert reg is not None
    steps = {s: {k: aggregate(nodes, reg, k) for k in RECORDED} for s, nodes in per_node.items()}
    return {"steps": steps, "per_node": per_node}


def import_pairs(old: Any, sim: SimConfig) -> Data:
    """The pairs of a pre-driver result JSON, arm -> seed -> record (see the module docstring for the shapes)."""
    reg = sim.registration
    assert reg is not None
    data: Data = {}
    if isinstance(old, dict) and "rows" in old:  # B6-real
        fam = sim.node["tasks"]["families"][0]["name"]
        for r in old["rows"]:
            per_node = {w: {str(i): _cells({fam: n[when]}) for i, n in enumerate(r["nodes"])}
                        for w, when in (("0", "before"), (str(r["step"]), "after"))}  # fmt: skip
            data.setdefault(r["arm"], {})[r["seed"]] = _record(per_node, sim)
    elif isinstance(old, list) and old and "recipe" in old[0]:  # the lab gate
        for r in old:
            arm = next(a for a, spec in reg.arms.items() if spec.note.startswith(r["name"].split(" (")[0]))
            data[arm] = {reg.seeds[0]: _record({"0": {"0": _cells(r["eval"]["families"])}}, sim)}
    elif isinstance(old, list) and old and "before" in old[0]:  # B7's CLI runs, one node
        (arm,) = reg.arms
        for r in old:
            per_node = {"0": {"0": _cells(r["before"]["families"])},
                        str(r["after"]["step"]): {"0": _cells(r["after"]["families"])}}  # fmt: skip
            data.setdefault(arm, {})[r["seed"]] = _record(per_node, sim)
    else:
        raise SystemExit("--legacy: not a result JSON this driver can read (B7's runs, B6-real's rows, the lab gate)")
    return data
