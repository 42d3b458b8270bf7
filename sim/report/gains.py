"""How far each node of a transfer arm moved on the family it lacks, against how far its peer was ahead.

The registered metric, gap closed ``(end - start) / (peer - start)``, is a ratio per node, averaged. When the gain
``end - start`` is about the same for every node whatever its peer's lead, the ratio is set by the lead: a node
beside a weak peer passes it (a ratio above 1) and one beside a strong peer closes a little of a wide gap, and the
mean ratio moves with the draw of warm starts, not with the objective. This reads, per (seed, node) of one arm of a
per-seed experiment (``swarm-sim experiment``): its start and its peer's level on its lacking family (the seed's
start evaluation, ``seed_starts`` in the results JSON), its end (its held-out evaluation at the last step, on disk
or in the JSON's finished pairs), and, as a
training-side diagnostic only (it is the node's recent solve rate of its own training prompts, not held-out), how
that solve rate moved in each half of the run: equal halves mean the gain is still rising at the last step.

    python benchmarks/transfer_gains.py configs/sim/transfer-het.yaml --arm peer-trace --work runs/transfer_het
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from sim.report.traces import read_jsonl


def has_gap(start: float, peer: float) -> bool:
    """The peer starts above the node (not so for an untrained model, or where the peer's warm start failed). The one
    rule this diagnostic and the registered ``gap_closed`` hook (``sim.driver.metrics``) share."""
    return peer > start


def closed_fraction(start: float, peer: float, end: float) -> float:
    """``(end - start) / (peer - start)``: how much of the gap to its peer a node closed; NaN where it has none."""
    return (end - start) / (peer - start) if has_gap(start, peer) else math.nan


@dataclass(frozen=True)
class NodeGain:
    seed: int
    node: int
    family: str
    start: float
    peer: float
    end: float
    first_half: float | None  # training-side solve rate's change over the first half of the steps
    second_half: float | None

    @property
    def width(self) -> float:
        return self.peer - self.start

    @property
    def gain(self) -> float:
        return self.end - self.start

    @property
    def has_gap(self) -> bool:
        """The peer starts above the node (:func:`has_gap`)."""
        return has_gap(self.start, self.peer)

    @property
    def closed(self) -> float:
        """NaN where there is no gap (:func:`closed_fraction`, the registered metric's rule)."""
        return closed_fraction(self.start, self.peer, self.end)


def _solve_rate_halves(metrics: Path, family: str, steps: int) -> tuple[float | None, float | None]:
    """The change of ``receiver_baseline_<family>`` (the node's recent solve rate) over each half of the run, from
    the mean of its first, middle and last tenth of the steps."""
    key = f"receiver_baseline_{family}"
    rate = {int(r["step"]): float(r[key]) for r in read_jsonl(metrics) if "step" in r and key in r}
    tenth = max(1, steps // 10)

    def around(lo: int) -> float | None:
        values = [rate[s] for s in range(lo, lo + tenth) if s in rate]
        return statistics.fmean(values) if values else None

    a, b, c = around(1), around(steps // 2 - tenth // 2), around(steps - tenth + 1)
    if a is None or b is None or c is None:
        return None, None
    return b - a, c - b


def _end(results: dict, run: Path, arm: str, seed: str, node: int, family: str, steps: int) -> float | None:
    """The node's held-out accuracy on ``family`` at step ``steps`` (the run's last): from its evaluation on disk,
    else from the finished pair the results JSON keeps (``pairs[arm][seed].per_node[steps]``; a later machine has
    no run directory); None for a pair still running (earlier evaluations only) or not run."""
    evals = [e for e in read_jsonl(run / "eval.jsonl") if family in e.get("families", {}) and
             int(e.get("step", -1)) == steps]  # fmt: skip
    if evals:
        return float(evals[-1]["families"][family]["accuracy"])
    pair = ((results.get("pairs") or {}).get(arm) or {}).get(seed) or {}
    kept = ((pair.get("per_node") or {}).get(str(steps)) or {}).get(str(node), {}).get(family)
    return float(kept["accuracy"]) if kept else None


def node_gains(results: dict, work: Path, arm: str, lacking: dict[int, str], steps: int) -> list[NodeGain]:
    """Every (seed, node) of ``arm`` with a start in ``results['seed_starts']`` and its evaluation at step ``steps``
    (the run's last) on disk or in the JSON's finished pairs: a pair still running is left out. The training-side
    halves need the run directory (None without it)."""
    out: list[NodeGain] = []
    starts = results.get("seed_starts") or {}
    for seed in sorted(starts, key=int):
        per_node = starts[seed].get("per_node") or {}
        for node, family in sorted(lacking.items()):
            peer = next((p for p in lacking if p != node), None)
            run = work / arm / f"seed{seed}" / f"node{node}"
            end = _end(results, run, arm, seed, node, family, steps)
            if peer is None or end is None or str(node) not in per_node or str(peer) not in per_node:
                continue
            first, second = _solve_rate_halves(run / "metrics.jsonl", family, steps)
            out.append(NodeGain(int(seed), node, family, per_node[str(node)][family]["accuracy"],
                                per_node[str(peer)][family]["accuracy"], end, first, second))  # fmt: skip
    return out


def _corr(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return math.nan
    return statistics.correlation(xs, ys)


def summary(rows: list[NodeGain]) -> dict[str, float]:
    """Mean gain and gap width (with their standard deviations), their correlation, and the two ways to average,
    over the nodes with a gap. A node its peer does not lead at the start is left out whatever the registration's
    ``no_gap`` (under ``undefined`` the registered number of its seed is NaN instead: this is a diagnostic)."""
    left_out = sum(not r.has_gap for r in rows)
    rows = [r for r in rows if r.has_gap]
    if not rows:
        return {"nodes": 0, "left_out": left_out}
    gains, widths = [r.gain for r in rows], [r.width for r in rows]
    halves = [r for r in rows if r.first_half is not None]
    return {
        "nodes": len(rows),
        "left_out": left_out,
        "gain": statistics.fmean(gains),
        "gain_sd": statistics.stdev(gains) if len(rows) > 1 else math.nan,
        "width": statistics.fmean(widths),
        "width_sd": statistics.stdev(widths) if len(rows) > 1 else math.nan,
        "corr_gain_width": _corr(widths, gains),
        "corr_closed_peer": _corr([r.peer for r in rows], [r.closed for r in rows]),
        "mean_of_ratios": statistics.fmean(r.closed for r in rows),
        "ratio_of_means": statistics.fmean(gains) / statistics.fmean(widths),
        "passed_peer": sum(r.end > r.peer for r in rows),
        "first_half": statistics.fmean(r.first_half for r in halves) if halves else math.nan,  # type: ignore[misc]
        "second_half": statistics.fmean(r.second_half for r in halves) if halves else math.nan,  # type: ignore[misc]
    }


def lines(rows: list[NodeGain], arm: str) -> list[str]:
    head = "| seed | node | family | start | peer | end | gain | gap width | closed |"
    out = [f"### {arm}: gain on the lacking family against the peer's lead", "", head, "|---" * 9 + "|"]
    out += [f"| {r.seed} | {r.node} | {r.family} | {r.start:.3f} | {r.peer:.3f} | {r.end:.3f} | {r.gain:+.3f} | "
            f"{r.width:.3f} | {f'{r.closed:.2f}' if r.has_gap else 'no gap'} |" for r in rows]  # fmt: skip
    s = summary(rows)
    gone = f" ({s['left_out']} without a gap at the start left out)" if s["left_out"] else ""
    if not s["nodes"]:
        return [*out, "", f"no node with a gap at the start{gone}."]
    out += ["", f"{s['nodes']} nodes{gone}: gain {s['gain']:+.3f} (sd {s['gain_sd']:.3f}), gap width {s['width']:.3f} "
            f"(sd {s['width_sd']:.3f}); correlation of gain with width {s['corr_gain_width']:+.2f}, of gap closed "
            f"with the peer's level {s['corr_closed_peer']:+.2f}; gap closed as the mean of ratios "
            f"{s['mean_of_ratios']:.3f}, as the ratio of means {s['ratio_of_means']:.3f}; {s['passed_peer']} "
            f"node(s) end above their peer's level."]  # fmt: skip
    if not math.isnan(s["first_half"]):
        out[-1] += (
            f" Training-side solve rate (not held-out; a diagnostic of the curve's shape only): "
            f"{s['first_half']:+.3f} over the first half of the steps, {s['second_half']:+.3f} over the second."
        )
    return out


def main(argv: list[str] | None = None) -> None:
    import yaml  # the experiment's YAML is read as data: its registration's lacking part, results name and steps

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", type=Path, help="the experiment's YAML (its registration names the lacking families)")
    ap.add_argument("--arm", action="append", required=True, help="an arm (repeat for more)")
    ap.add_argument("--work", type=Path, help="the run directory (default runs/<registered results name>)")
    ap.add_argument("--results", type=Path, help="the results JSON (default benchmarks/results/<registered name>)")
    args = ap.parse_args(argv)
    raw = yaml.safe_load(args.config.read_text()) or {}
    reg = raw.get("registration") or {}
    lacking = (reg.get("parts") or {}).get("lacking")
    if not lacking or not reg.get("results"):
        raise SystemExit(f"{args.config}: its registration names no results or no 'lacking' part")
    results = json.loads((args.results or Path("benchmarks/results") / f"{reg['results']}.json").read_text())
    work = args.work or Path("runs") / reg["results"]  # the driver's default
    for arm in args.arm:
        rows = node_gains(results, work, arm, {int(k): v for k, v in lacking.items()}, int(raw["steps"]))
        none = f"{arm}: no node with a start and an evaluation at its last step"
        print("\n".join(lines(rows, arm) if rows else [none]))
        print()
