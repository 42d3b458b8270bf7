"""What a laboratory run's traces were and where its held-out skill sits (the transfer diagnosis, docs/transfer.md).

Two readings of a ``swarm-sim`` run directory (``ARM/seedN/nodeK/{rollouts,eval}.jsonl``) of the laboratory
families (``node.arith``):

* **verbatim**: of each node's right completions (its rollouts from ``--from-step`` on), the share that is the
  family's generator trace word for word (``node.arith.lab_completion``). A peer whose right completions are the
  generator's traces sends what a ``labels.trace`` ceiling would have, on the problems it solves.
* **by structure**: each node's held-out exact at its last evaluation, per problem shape: the operands' digit counts
  and how many columns carry (``lab_add``) or borrow (``lab_sub``). Tells a node that learned a family's hard columns
  from one that learned only its easy problems.

    python benchmarks/transfer_traces.py runs/tdev-channels --family lab_sub --nodes 0,1
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from node.arith import LabConfig, lab_completion, lab_entry

_TERM = re.compile(r"[+-]\d+")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def columns(terms: list[int], op: str) -> int:
    """How many columns of ``terms`` combined by ``op`` carry (``+``) or borrow (``-``), as ``write_trace`` works."""
    digits = [str(t)[::-1] for t in terms]
    carry = count = 0
    for i in range(max(map(len, digits))):
        col = [int(d[i]) if i < len(d) else 0 for d in digits]
        value = (sum(col) + carry) if op == "+" else (col[0] - sum(col[1:]) - carry)
        carry = value // 10 if op == "+" else int(value < 0)
        count += carry > 0
    return count


def shape(terms: list[int], op: str) -> str:
    """``3-2 b1``: the operands' digit counts (largest first) and the columns that borrow (``b``) or carry (``c``)."""
    sizes = "-".join(str(n) for n in sorted((len(str(t)) for t in terms), reverse=True))
    return f"{sizes} {'c' if op == '+' else 'b'}{columns(terms, op)}"


def terms_of_key(key: str, family: str) -> tuple[list[int], str]:
    """The operands of a held-out item from its canonical key (``expr:sum[+264,-55]``: ``[264, 55]``, ``-``)."""
    signed = [int(t) for t in _TERM.findall(key)]
    if family == "lab_sub":
        return [max(signed), -min(signed)], "-"
    return sorted(signed, reverse=True), "+"


def verbatim(node_dir: Path, from_step: int = 0) -> dict[str, tuple[int, int]]:
    """Per family: (right completions, of them the generator's trace word for word) in the node's own rollouts."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in read_jsonl(node_dir / "rollouts.jsonl"):
        task = row["task"]
        if row["step"] < from_step or not task["family"].startswith("lab_"):
            continue
        known = LabConfig.__dataclass_fields__
        cfg = LabConfig(**{k: v for k, v in task.get("config", {}).items() if k in known})
        meta = lab_entry(task["family"], cfg, task["seed"], task["index"])["metadata"]
        target = lab_completion(list(meta["terms"]), meta["op"])
        for text, reward in zip(row["completions"], row["rewards"], strict=True):
            if reward >= 1.0:
                out[task["family"]][0] += 1
                out[task["family"]][1] += text == target
    return {f: (n, same) for f, (n, same) in out.items()}


def by_shape(node_dir: Path, family: str) -> dict[str, tuple[int, float]]:
    """Per problem shape: (held-out items, mean share of their samples right) at the node's last evaluation."""
    evals = read_jsonl(node_dir / "eval.jsonl")
    if not evals or family not in evals[-1]["families"]:
        return {}
    cells: dict[str, list[float]] = defaultdict(list)
    for item in evals[-1]["families"][family].get("items", []):
        terms, op = terms_of_key(item["key"], family)
        cells[shape(terms, op)].append(item["samples_right"] / item["n_samples"])
    return {k: (len(v), sum(v) / len(v)) for k, v in sorted(cells.items())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--family", default="lab_sub", help="the family read by structure")
    ap.add_argument("--nodes", default="0,1")
    ap.add_argument("--from-step", type=int, default=0, help="rollouts read for the verbatim share from this step")
    args = ap.parse_args(argv)
    nodes = [int(n) for n in args.nodes.split(",")]
    for arm in sorted(p for p in args.run_dir.iterdir() if p.is_dir() and any(p.glob("seed*/node*"))):
        for seed_dir in sorted(p for p in arm.glob("seed*") if p.is_dir()):
            print(f"\n### {arm.name} {seed_dir.name}\n")
            for n in nodes:
                counts = verbatim(seed_dir / f"node{n}", args.from_step)
                cells = ", ".join(f"{f} {same}/{right}" for f, (right, same) in sorted(counts.items()))
                print(f"node {n}: right completions that are the generator's trace word for word: {cells or '-'}")
            tables = {n: by_shape(seed_dir / f"node{n}", args.family) for n in nodes}
            shapes = sorted({s for t in tables.values() for s in t})
            print(f"\n{args.family} held-out exact at the last evaluation, by shape:\n")
            print("| shape | items | " + " | ".join(f"node {n}" for n in nodes) + " |")
            print("|---|---|" + "---|" * len(nodes))
            for s in shapes:
                count = next(t[s][0] for t in tables.values() if s in t)
                vals = " | ".join(f"{tables[n][s][1]:.2f}" if s in tables[n] else "-" for n in nodes)
                print(f"| {s} | {count} | {vals} |")
