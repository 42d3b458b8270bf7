"""What peers' completions weigh in a learner's update, per family (the transfer diagnosis, docs/transfer.md).

Reads a ``swarm-sim run`` directory (e.g. of ``configs/sim/transfer-dev*.yaml``) and prints, per configuration, for each
node's lacking family: the held-out (dev) exact at each evaluation, and over windows of steps the learner's peer
diagnostics (``node.learn.learner.PeerTokenStats``): verified-right peer completions reaching the learner a step,
their tokens' mean importance weight and share weighted below 1/2, their mean log-probability under the receiver,
and (guided) the mean gradient weight the shaping gives a token. With ``--trace``, the trace step's instead
(``learner.trace_lr``; ``Learner.select_traces``, ``Learner.trace_step``): new distinct verified traces a step, the
rows it trains on a step, its buffer, their negative log-likelihood a token under the node (the family's working is
learnt as this falls) and the anchor's KL a token to the initial policy (the drift on the node's own right working).
An experiment's work directory (``swarm-sim experiment``: ``<arm>/seed<k>/node<i>``) reads the same.

    python benchmarks/transfer_dev.py runs/transfer-dev --lacking 0=lab_sub,1=lab_add --window 20
    python benchmarks/transfer_dev.py runs/transfer_never --trace --window 50
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from node.telemetry.metrics import read_jsonl  # skips a torn last line: a run still going may be writing it

FIELDS = ("completions", "is_weight", "weight_low_frac", "logp", "shaping_weight")
TRACE_FIELDS = ("trace_new", "trace_rows", "trace_buffer", "trace_nll", "trace_anchor_kl")
TRAINED_ONLY = ("trace_nll", "trace_anchor_kl")  # the learner logs 0 for these on a step with no trace row
PEER_HEAD = "| steps | right peer completions / step | IS weight | share < 1/2 | logp / token | shaping wt |"
TRACE_HEAD = (
    "| steps | new distinct traces / step | trace rows / step | buffer | trace NLL / token | anchor KL / token |"
)


def _cell(xs: list[float | None]) -> str:
    have = [x for x in xs if x is not None]
    return f"{statistics.fmean(have):.3f}" if have else "-"


def node_rows(node_dir: Path, family: str, window: int, trace: bool = False) -> tuple[list[str], list[str]]:
    """The node's held-out exact on ``family`` at each evaluation, and one table row per ``window`` steps: the peer
    fields of ``family`` (a step without a peer completion of it counts 0 completions), or with ``trace`` the trace
    step's fields (over the steps that logged them; the NLL and the anchor's KL over the steps with a trace row)."""
    evals = [f"{e['step']}: {e['families'][family]['accuracy']:.3f}" for e in read_jsonl(node_dir / "eval.jsonl")]
    steps = read_jsonl(node_dir / "metrics.jsonl")
    rows = []
    for lo in range(0, len(steps), window):
        chunk = steps[lo : lo + window]
        if trace:  # the NLL and the anchor's KL over the steps that trained on traces (0 is logged otherwise)
            trained = [m for m in chunk if m.get("trace_rows", 0) > 0]
            cells = [_cell([m.get(f) for m in (trained if f in TRAINED_ONLY else chunk)]) for f in TRACE_FIELDS]
        else:
            cells = [_cell([m.get(f"peer_{f}_{family}", 0.0 if f == "completions" else None) for m in chunk])
                     for f in FIELDS]  # fmt: skip
        rows.append(f"| {lo + 1}-{lo + len(chunk)} | " + " | ".join(cells) + " |")
    return evals, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--lacking", default="0=lab_sub,1=lab_add")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--trace", action="store_true", help="the trace step's fields instead of the peer fields")
    args = ap.parse_args()
    lacking = {int(k): v for k, v in (p.split("=") for p in args.lacking.split(","))}
    head = TRACE_HEAD if args.trace else PEER_HEAD
    arms = [p for p in args.run_dir.iterdir() if p.is_dir() and not p.name.startswith("start")]  # not the starts
    for arm in sorted(arms):
        for seed_dir in sorted(p for p in arm.glob("seed*") if p.is_dir()):
            for node, family in lacking.items():
                evals, rows = node_rows(seed_dir / f"node{node}", family, args.window, args.trace)
                print(f"\n### {arm.name} {seed_dir.name} node {node}, lacking {family}: held-out exact "
                      f"{', '.join(evals)}\n")  # fmt: skip
                print(head)
                print("|---" * head.count(" | ") + "|---|")
                print("\n".join(rows))


if __name__ == "__main__":
    main()
