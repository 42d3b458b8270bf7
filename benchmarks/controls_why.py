"""What a peer's completion carries that a label does not, token by token (the sharing comparison's "why").

In the heterogeneous setting of ``benchmarks/controls.py`` each node half-knows one family (its lacking family) and
its peer knows it. This script takes the two nodes at their start (the same warm starts as the comparison) and, for
each node's lacking family, on training-side problems:

1. the **teacher** (the peer) samples G completions a problem; its right ones are what a receiver-credited node
   trains on;
2. under the **learner** (the node lacking the family), every token of those right completions gets its surprisal
   (-log p, nats), split into the echo line, the working lines, and the ``<answer>`` tag; a working line is a
   *carry/borrow line* when it takes a carry or borrow from the column before or makes one for the next
   (two-term problems, as in that setting: a third operand on a line is the carry);
3. the learner's own samples of the same problems are compared line by line with the trace writer's working: the
   first line that differs is where its skill ends (a carry/borrow line, a plain line, or the format);
4. the bare label (``<answer>x</answer>``, what the ``labels`` and ``answers`` arms train on) gets its surprisal
   under the learner too.

So the table says how many nats of the peer's completion sit in the working rather than the answer, which lines
carry them, and whether those are the lines where the learner's own working breaks.

    python benchmarks/controls_why.py                 # 64 problems a family, G = 8 (minutes on 2 cores)
    python benchmarks/controls_why.py --problems 8    # a quick look

Writes ``benchmarks/results/controls_why.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402
from benchmarks.common.multirun import write_results  # noqa: E402

LACKING = {0: "lab_sub", 1: "lab_add"}


def line_kind(line: str) -> str:
    """``carry`` when a working line takes a carry or borrow from the column before (a third operand before ``=``
    in a two-term problem) or makes one for the next (a column value of 10 or more, or below 0), else ``plain``."""
    head, _, rest = line.partition("=")
    value = rest.split(" ", 1)[0]
    takes = len(re.split(r"[+-]", head.lstrip("-"))) >= 3
    try:
        makes = not 0 <= int(value) <= 9
    except ValueError:
        return "plain"  # a malformed line (the learner's own, never the trace writer's)
    return "carry" if takes or makes else "plain"


def segments(text: str) -> list[tuple[str, str]]:
    """The completion split into (kind, text) pieces, concatenating back to ``text``: ``echo`` (the think tag and
    the question's line), ``carry`` / ``plain`` working lines (with their newline), ``answer`` (from ``</think>``
    on)."""
    out: list[tuple[str, str]] = []
    body, sep, tail = text.partition("</think>")
    lines = body.split("\n")
    for i, line in enumerate(lines):
        piece = line + ("\n" if i < len(lines) - 1 else "")
        out.append(("echo" if i == 0 else line_kind(line), piece))
    if sep:
        out.append(("answer", sep + tail))
    return out


def token_surprisal(policy: Any, prompt: str, completion: str) -> list[tuple[str, float]]:
    """Each completion token's text and surprisal (nats) under ``policy``, EOS last."""
    import torch

    p_ids = policy.encode(prompt)
    c_ids = [*policy.encode(completion), policy.eos_token_ids[0]]
    ids = torch.tensor([p_ids + c_ids])
    with torch.no_grad():
        logp = torch.log_softmax(policy.model(ids).logits[0, :-1].float(), dim=-1)
    targets = ids[0, 1:]
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[len(p_ids) - 1 :]
    toks = [policy.tokenizer.decode([t]) for t in c_ids]
    return list(zip(toks, (-lp).tolist(), strict=True))


def by_segment(text: str, tokens: list[tuple[str, float]]) -> dict[str, float]:
    """Nats per segment kind: tokens are assigned to segments by character offsets (EOS goes to ``answer``)."""
    bounds = []
    pos = 0
    for kind, piece in segments(text):
        bounds.append((pos + len(piece), kind))
        pos += len(piece)
    out: dict[str, float] = {}
    offset = 0
    for tok, nats in tokens[:-1]:
        kind = next((k for end, k in bounds if offset < end), "answer")
        out[kind] = out.get(kind, 0.0) + nats
        offset += len(tok)
    out["answer"] = out.get("answer", 0.0) + tokens[-1][1]
    return out


def first_wrong_line(own: str, gold: str) -> str:
    """Where ``own`` first departs from the trace writer's ``gold`` working: the kind of gold line it gets wrong
    (``echo``, ``carry``, ``plain``, ``answer``), ``format`` when it has no think block, ``none`` when it
    matches through the answer."""
    if "</think>" not in own:
        return "format"
    g, o = segments(gold), segments(own)
    for i, (kind, piece) in enumerate(g):
        if i >= len(o) or o[i][1] != piece:
            return kind
    return "none"


def sample(policy: Any, prompts: list[str], n: int, max_new: int, seed: int) -> list[list[str]]:
    import torch

    torch.manual_seed(seed)
    out = []
    for prompt in prompts:
        ids = torch.tensor([policy.encode(prompt)])
        with torch.no_grad():
            gen = policy.model.generate(
                ids.repeat(n, 1), attention_mask=torch.ones_like(ids).repeat(n, 1), do_sample=True, temperature=1.0,
                top_p=1.0, top_k=0, max_new_tokens=max_new, eos_token_id=policy.eos_token_ids,
                pad_token_id=policy.eos_token_ids[0],
            )  # fmt: skip
        texts = []
        for row in gen[:, ids.shape[1] :]:
            toks = [int(t) for t in row]
            for e in policy.eos_token_ids:
                if e in toks:
                    toks = toks[: toks.index(e)]
            texts.append(policy.tokenizer.decode(toks))
        out.append(texts)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--stem", default="controls_why")
    args = ap.parse_args()

    import torch

    from node.arith import completion_for
    from node.model.policy import load_policy
    from node.tasks import TaskSource
    from sim.config import load_sim_config

    torch.set_num_threads(2)
    sim = load_sim_config(str(ROOT / "configs" / "sim" / "controls-het.yaml"), [])
    cfgs = [sim.node_config("alone", i, args.seed) for i in range(2)]
    policies = [load_policy(c.model) for c in cfgs]
    max_new = cfgs[0].rollout.max_new_tokens
    rows: dict[str, Any] = {}
    for learner in (0, 1):
        teacher = 1 - learner
        fam = LACKING[learner]
        tasks = TaskSource(cfgs[learner].tasks.model_copy(update={"families": [
            f for f in cfgs[learner].tasks.families if f.name == fam]}))  # fmt: skip
        rng = random.Random(1000 + learner)
        items: list[Any] = []
        while len(items) < args.problems:  # training-side problems only: what a node trains on
            item = tasks.materialize(tasks.sample(rng, 1)[0])
            if tasks.side(item) == "train":
                items.append(item)
        prompts = [policies[learner].format_prompt(it.question) for it in items]
        t_samples = sample(policies[teacher], prompts, args.group, max_new, args.seed)
        l_samples = sample(policies[learner], prompts, args.group, max_new, args.seed + 1)
        seg: dict[str, list[float]] = {k: [] for k in ("echo", "carry", "plain", "answer", "total", "label")}
        per_line: dict[str, list[float]] = {"carry": [], "plain": []}
        teacher_right = learner_right = 0
        wrong_at: Counter[str] = Counter()
        for item, prompt, ts, ls in zip(items, prompts, t_samples, l_samples, strict=True):
            gold = completion_for(item.metadata, trace=True)
            label = completion_for(item.metadata, trace=False)
            seg["label"].append(sum(n for _, n in token_surprisal(policies[learner], prompt, label)))
            for text in ts:
                if tasks.score(item, text) < 1.0:
                    continue
                teacher_right += 1
                toks = token_surprisal(policies[learner], prompt, text)
                parts = by_segment(text, toks)
                for k in ("echo", "carry", "plain", "answer"):
                    seg[k].append(parts.get(k, 0.0))
                seg["total"].append(sum(n for _, n in toks))
                counts = Counter(k for k, _ in segments(text))
                for k in ("carry", "plain"):
                    if counts[k]:
                        per_line[k].append(parts.get(k, 0.0) / counts[k])
            for text in ls:
                if tasks.score(item, text) >= 1.0:
                    learner_right += 1
                else:
                    wrong_at[first_wrong_line(text, gold)] += 1
        n_t = args.problems * args.group
        rows[f"node{learner}"] = {
            "family": fam,
            "teacher_right_share": teacher_right / n_t,
            "learner_right_share": learner_right / n_t,
            "nats": {k: statistics.fmean(v) if v else None for k, v in seg.items()},
            "nats_per_line": {k: statistics.fmean(v) if v else None for k, v in per_line.items()},
            "learner_first_wrong": dict(wrong_at),
        }
        print(f"node {learner} ({fam}): {rows[f'node{learner}']}", file=sys.stderr, flush=True)
    text = report(rows, args)
    write_results(args.out, args.stem, text, rows)
    return 0


def report(rows: dict[str, Any], args: argparse.Namespace) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines = [
        "# What a peer's completion carries that a label does not (controls, heterogeneous setting, at the start)",
        "",
        f"- {machine_info()}",
        "- command: `python benchmarks/controls_why.py " + " ".join(sys.argv[1:]) + "`",
        f"- the two nodes of `configs/sim/controls-het.yaml` at their warm start (seed {args.seed}); for each node's "
        f"lacking family, {args.problems} TRAIN-side problems x {args.group} samples of the teacher (the peer) and "
        "of the learner (the node); surprisal = -log p under the learner, nats per completion (mean over the "
        "teacher's right completions)",
        "",
        "| learner (lacking family) | teacher right | learner right | nats: whole completion | echo line | "
        "carry/borrow lines | plain lines | `</think>` + answer + EOS | bare label `<answer>x</answer>` + EOS | "
        "nats per carry/borrow line | per plain line |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for node, r in rows.items():
        n = r["nats"]
        lines.append(
            f"| {node} ({r['family']}) | {r['teacher_right_share']:.3f} | {r['learner_right_share']:.3f} | "
            f"{f(n['total'])} | {f(n['echo'])} | {f(n['carry'])} | {f(n['plain'])} | {f(n['answer'])} | "
            f"{f(n['label'])} | {f(r['nats_per_line']['carry'])} | {f(r['nats_per_line']['plain'])} |"
        )
    lines += ["", "Where the learner's own wrong samples first depart from the trace writer's working:", "",
              "| learner | " + " | ".join(("format", "echo", "carry", "plain", "answer", "none")) + " |",
              "|---|" + "---:|" * 6]  # fmt: skip
    for node, r in rows.items():
        w = r["learner_first_wrong"]
        tot = sum(w.values()) or 1
        kinds = ("format", "echo", "carry", "plain", "answer", "none")
        lines.append(f"| {node} | " + " | ".join(f"{w.get(k, 0) / tot:.2f}" for k in kinds) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
