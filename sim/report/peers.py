"""What peers' completions weigh in a learner's update, per family (the transfer diagnosis, docs/transfer.md).

Reads a ``swarm-sim run`` directory (e.g. of ``configs/sim/transfer-dev*.yaml``) and prints, per configuration, for each
node's lacking family: the held-out (dev) exact at each evaluation, and over windows of steps the learner's peer
diagnostics (``node.learn.learner.PeerTokenStats``): verified-right peer completions reaching the learner a step,
their tokens' mean importance weight and share weighted below 1/2, their mean log-probability under the receiver,
and (guided) the mean gradient weight the shaping gives a token.

    python benchmarks/transfer_dev.py runs/transfer-dev --lacking 0=lab_sub,1=lab_add --window 20
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

FIELDS = ("completions", "is_weight", "weight_low_frac", "logp", "shaping_weight")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def node_rows(node_dir: Path, family: str, window: int) -> tuple[list[str], list[str]]:
    evals = [f"{e['step']}: {e['families'][family]['accuracy']:.3f}" for e in read_jsonl(node_dir / "eval.jsonl")]
    steps = read_jsonl(node_dir / "metrics.jsonl")
    rows = []
    for lo in range(0, len(steps), window):
        chunk = steps[lo : lo + window]
        vals = {f: [m.get(f"peer_{f}_{family}", 0.0 if f == "completions" else None) for m in chunk] for f in FIELDS}
        cells = []
        for f in FIELDS:
            xs = [x for x in vals[f] if x is not None]
            cells.append(f"{statistics.fmean(xs):.3f}" if xs else "-")
        rows.append(f"| {lo + 1}-{lo + len(chunk)} | " + " | ".join(cells) + " |")
    return evals, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--lacking", default="0=lab_sub,1=lab_add")
    ap.add_argument("--window", type=int, default=20)
    args = ap.parse_args()
    lacking = {int(k): v for k, v in (p.split("=") for p in args.lacking.split(","))}
    for arm in sorted(p for p in args.run_dir.iterdir() if p.is_dir()):
        for seed_dir in sorted(arm.glob("seed*")):
            for node, family in lacking.items():
                evals, rows = node_rows(seed_dir / f"node{node}", family, args.window)
                print(f"\n### {arm.name} {seed_dir.name} node {node}, lacking {family}: dev exact {', '.join(evals)}\n")
                print("| steps | right peer completions / step | IS weight | share < 1/2 | logp / token | shaping wt |")
                print("|---|---|---|---|---|---|")
                print("\n".join(rows))


if __name__ == "__main__":
    main()
