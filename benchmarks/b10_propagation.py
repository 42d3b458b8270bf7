"""B10 propagation: does a weak node learn from a strong peer a skill it would not learn alone?

One family F. Three real ``swarm-node join`` processes over hivemind on 127.0.0.1 (``sim.multiproc``), the same
three in both configurations:

* node 0, the **strong peer**: SmolLM2-135M given F's skill by a short supervised warm start on F's training split
  (``model.warm_start``; built once, cached offline, its recipe in the cache directory). It stands in for a bigger
  model on a GPU, or a node that has trained longer.
* node 1, the **weak node**: SmolLM2-135M with only a format warm start on an unrelated family (B8's starting point:
  it states answers as ``<answer>...</answer>``, so what moves is the answer, not the format).
* node 2, a **cross-tokenizer receiver**: the built-in tiny model (another tokenizer; it re-tokenizes peers' text).

Configurations: ``alone`` (every node trains on its own groups only, 4 local / 0 external) and ``share`` (2 local /
2 external: half of each batch from peers, the SAPO paper's 4/4 at this batch size); ``receiver`` (``--configs``)
is ``share`` with peers' completions credited by the receiver (``sapo.peer_advantage: receiver``: a peer's right
answer is worth ``1 - b``, ``b`` the receiver's own solve rate, its wrong ones nothing) and all-right groups
published (``sapo.publish_solved``); ``stronger`` is ``receiver`` taking a peer's group only when it is solved more
often than the receiver's own rate (``sapo.peer_groups: stronger``, so the strong node stops training on the weaker
nodes' right answers); ``labels`` is ``alone`` plus 16 of each node's own gold labels a step (bare
``<answer>x</answer>``, credited ``1 - b``), the control that tells a peer's part from gold labels a node can write
itself, and ``answers`` is ``receiver`` on peers' answers only (``sapo.peer_text: answer``). The strong node keeps
publishing in all. Every node evaluates on the same
held-out items of F (problems no node trained on).

    python benchmarks/b10_propagation.py run --seeds 0 1 2          # resumable: finished (config, seed) pairs are kept
    python benchmarks/b10_propagation.py run --configs alone share receiver   # the default is alone and share
    python benchmarks/b10_propagation.py run --seeds 0 --quick      # 2 steps, the tiny model only: a smoke run
    python benchmarks/b10_propagation.py report
    python benchmarks/b10_propagation.py run --population homogeneous   # three format-warm SmolLM2 nodes (SAPO row)

The report (``benchmarks/results/b10_propagation.md``, plot beside it): per node, configuration and seed, held-out
exact accuracy (sampled, greedy, pass@8) before and after; each node's gain with the peer against its gain alone
(mean ± sd over seeds); the peer tokens' share of its batches and their mean importance weight; who it trained on.
Target: the weak node's gain with the peer >= 2x its gain alone, beyond the spread.

``--population homogeneous`` runs the same two configurations with three identical nodes (the weak node's model):
the paper's homogeneous SAPO row at a budget this machine affords (``b10_homogeneous.md``). Its report pools the
three nodes, and where it has no ``alone`` runs of its own it takes B10's weak node alone, which is the same run as
its node 1 alone (``borrow_alone``). Three SmolLM2 nodes peak at 7-8.3 GB each: on 24 GB they need swap.

A report keeps the rows of the earlier report (``<stem>.json``) for runs its work directory does not hold, so runs
done on other machines, or lost with a machine's cache, stay in it as more seeds land.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.b8_learning import CANDIDATES, families_of, mean_sd  # noqa: E402
from benchmarks.common.machine import machine_info  # noqa: E402
from benchmarks.common.multirun import (  # noqa: E402
    experiment_cli,
    peer_names,
    prebuild,
    prepare,
    read_evals,
    report_rows,
    roles_of,
    run_pending,
    write_results,
)

RESULTS = ROOT / "benchmarks" / "results"
WORK = Path(os.environ.get("RL_SWARM_BENCH_DIR", Path.home() / ".cache" / "rl-swarm" / "bench")) / "b10_propagation"
#: Node index -> (role, what it is), by population; ``--quick`` runs two tiny-model nodes.
POPULATIONS = {
    "propagation": {
        0: ("strong", "SmolLM2-135M warm-started on the family's training split"),
        1: ("weak", "SmolLM2-135M with a format warm start on another family"),
        2: ("tiny", "the built-in model, another tokenizer"),
    },
    "homogeneous": {i: (f"smol-{i}", "SmolLM2-135M with a format warm start on another family") for i in range(3)},
    "quick": {0: ("tiny-a", "the built-in model"), 1: ("tiny-b", "the built-in model")},
}
#: Receiver credit (``sapo.peer_advantage: receiver``), with all-right groups published.
RECEIVER = {"local_groups": 2, "external_groups": 2, "peer_advantage": "receiver", "publish_solved": True}
#: Configuration -> (description, its ``sapo`` settings).
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "alone": ("4 own / 0 peers' groups a step", {"local_groups": 4, "external_groups": 0}),
    "share": (
        "2 own / 2 peers' groups a step, SAPO's group-relative credit",
        {"local_groups": 2, "external_groups": 2, "peer_advantage": "group", "publish_solved": False},
    ),
    "receiver": (
        "2 own / 2 peers' groups a step; peers' solved completions credited against the receiver's own solve rate "
        "(sapo.peer_advantage: receiver), all-right groups published",
        RECEIVER,
    ),
    "stronger": (
        "as receiver, but a peer's group only when it solves the task more often than the receiver does "
        "(sapo.peer_groups: stronger)",
        {**RECEIVER, "peer_groups": "stronger"},
    ),
    "labels": (
        "4 own / 0 peers' groups a step plus 16 of the node's own gold labels (bare <answer>x</answer>) of the "
        "family, credited 1 - b like receiver's peer answers: the control receiver's gain must beat (issue 54)",
        {"local_groups": 4, "external_groups": 0},
    ),
    "answers": (
        "as receiver, with every peer completion stripped to its <answer> tag (sapo.peer_text: answer): labels "
        "only, from peers",
        {**RECEIVER, "peer_text": "answer"},
    ),
}
#: Node settings beyond ``sapo`` a configuration needs, given the task family names.
EXTRA: dict[str, Any] = {"labels": lambda names: {"labels": {"families": names, "per_step": 16}}}


def population(args: argparse.Namespace) -> str:
    return "quick" if args.quick else args.population


def work_dir(args: argparse.Namespace) -> Path:
    return args.work if population(args) == "propagation" else args.work / population(args)


def sim_mapping(args: argparse.Namespace) -> dict[str, Any]:
    """The experiment as a ``swarm-sim`` configuration (multiprocess mode), written to the work dir."""
    family = families_of([args.family])
    smol = {"name": "smollm2-135m", "device": args.device}
    tiny_model = {"name": "builtin:tiny"}
    if args.device != "cpu":  # float32 as on the CPU: bf16 weights without fp32 master copies drop small updates
        smol["dtype"] = "float32"
        tiny_model = {**tiny_model, "device": args.device, "dtype": "float32"}
    strong_warm = {"families": family, "examples": args.strong_examples}
    format_warm = {"families": families_of([args.format_family]), "examples": args.format_examples}
    strong = {"model": {**smol, "warm_start": strong_warm}, "rollout": {"engine": args.engine}}
    weak = {"model": {**smol, "warm_start": format_warm}, "rollout": {"engine": args.engine}}
    tiny = {"model": tiny_model, "rollout": {"engine": "transformers"}}
    overrides = {
        "propagation": {0: strong, 1: weak, 2: tiny},
        "homogeneous": {0: weak, 1: weak, 2: weak},
        "quick": {0: tiny, 1: tiny},  # the plumbing, not the result
    }[population(args)]
    nodes = len(overrides)
    return {
        "name": f"b10-{population(args)}",
        "mode": "multiprocess",
        "nodes": nodes,
        "steps": 2 if args.quick else args.steps,
        "seeds": list(args.seeds),
        "torch_threads": 1,
        "node": {
            "swarm_id": "b10-propagation",
            "tasks": {"families": family},
            "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": args.max_new_tokens},
            "eval": {
                "every_steps": 1 if args.quick else args.eval_every,
                "items_per_family": 4 if args.quick else args.items, "samples": 8, "greedy": True,
            },
            "checkpoint": {"every": 10, "keep": 1},
        },
        "configurations": [
            {"name": name, "description": CONFIGS[name][0],
             "node": {"sapo": CONFIGS[name][1], **(EXTRA[name]([f["name"] for f in family]) if name in EXTRA else {})}}
            for name in args.configs
        ],
        "heterogeneity": {"node_overrides": overrides},
        "multiprocess": {"startup_timeout_s": 1800, "run_timeout_s": 86_400,
                         **({"linger_s": 60} if args.quick else {})},  # a tiny node 0 outpaces node 1's start
    }  # fmt: skip


def run(args: argparse.Namespace) -> None:
    """Run every (configuration, seed) not finished yet; an interrupted pair resumes from its checkpoints."""
    roles = {str(i): list(r) for i, r in POPULATIONS[population(args)].items()}
    work = work_dir(args)
    sim = prepare(work, sim_mapping(args), roles)
    prebuild(sim)
    run_pending(sim, work, list(args.configs), args.seeds, args.jobs)


def _metric_means(node_dir: Path, until: float = float("inf")) -> dict[str, float]:
    """Means over the node's steps (up to ``until``) of what peers' data weighed in its updates (steps with a
    learner update)."""
    rows = [json.loads(x) for x in (node_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r.get("step", 0) <= until]
    trained = [r for r in rows if "external_token_share" in r]
    ext = [r for r in trained if r.get("external_token_share", 0) > 0]
    senders: dict[str, int] = {}
    for r in rows:
        for k, v in (r.get("external_by_sender") or {}).items():
            senders[k] = senders.get(k, 0) + v
    return {
        "peer_token_share": statistics.fmean(r["external_token_share"] for r in trained) if trained else 0.0,
        "peer_is_weight": statistics.fmean(r["external_is_weight_mean"] for r in ext) if ext else float("nan"),
        "own_exact": statistics.fmean(r["exact_mean"] for r in rows) if rows else float("nan"),
        "senders": senders,
    }


def collect(work: Path, until: float = float("inf")) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The experiment and one row per (configuration, seed, node) with two or more evaluations (those at steps up to
    ``until``: a budget cut short, as on a lent GPU, is reported at a step every run reached)."""
    import yaml

    mapping = yaml.safe_load((work / "experiment.yaml").read_text())
    names = {i: r[0] for i, r in roles_of(work, mapping["nodes"]).items()}
    fam = mapping["node"]["tasks"]["families"][0]["name"]
    rows = []
    for name in CONFIGS:
        for seed_dir in sorted((work / name).glob("seed*")):
            seed = int(seed_dir.name.removeprefix("seed"))
            peers = peer_names(seed_dir, names)
            for i in range(mapping["nodes"]):
                evals = read_evals(seed_dir / f"node{i}", until)
                if len(evals) < 2:
                    continue
                first, last = evals[0]["families"][fam], evals[-1]["families"][fam]
                m = _metric_means(seed_dir / f"node{i}", until)
                m["senders"] = {peers.get(k, k[:8]): v for k, v in m["senders"].items()}
                rows.append({"config": name, "seed": seed, "node": i, "role": names[i],
                             "steps": evals[-1]["step"], "curve": [(e["step"], e["families"][fam]) for e in evals],
                             "before": first, "after": last, **m})  # fmt: skip
    return mapping, rows


def node_roles(args: argparse.Namespace, work: Path, nodes: int) -> dict[int, tuple[str, str]]:
    """Node index -> (role, description): the work directory's, or the population's where it holds none."""
    return roles_of(work, nodes) if (work / "roles.json").is_file() else POPULATIONS[population(args)]


def borrow_alone(mapping: dict[str, Any], rows: list[dict[str, Any]], results: Path) -> list[dict[str, Any]]:
    """For the homogeneous population: the propagation experiment's ``alone`` rows (its report's JSON in
    ``results``) of every node that is the same run here, where ``rows`` lack them. A node alone trains on nothing of
    its peers', so with the same model, settings, budget, index and seed it is the same run whoever its peers are:
    B10's weak node alone is the homogeneous population's node 1 alone, seed for seed. Marked ``borrowed``."""
    path = results / "b10_propagation.json"
    if mapping["name"] != "b10-homogeneous" or not path.is_file():
        return []
    data = json.loads(path.read_text())
    here, there = json.loads(json.dumps(mapping)), data["experiment"]
    alone = {"name": "alone", "description": CONFIGS["alone"][0], "node": {"sapo": CONFIGS["alone"][1]}}
    runs = ("name", "seeds", "configurations", "heterogeneity")  # what may differ: the rest decides a node's run
    if {k: v for k, v in here.items() if k not in runs} != {k: v for k, v in there.items() if k not in runs} or (
        alone not in there["configurations"]
    ):
        return []
    mine, theirs = (m["heterogeneity"]["node_overrides"] for m in (here, there))
    same = {int(i) for i, o in mine.items() if theirs.get(i) == o}
    have = {(r["seed"], r["node"]) for r in rows if r["config"] == "alone"}
    roles = {i: role for i, (role, _) in POPULATIONS["homogeneous"].items()}
    return [{**r, "role": roles[r["node"]], "borrowed": path.stem} for r in data["rows"]
            if r["config"] == "alone" and r["node"] in same and (r["seed"], r["node"]) not in have]  # fmt: skip


def report(args: argparse.Namespace) -> None:
    work = work_dir(args)
    stem = args.stem or {
        "propagation": "b10_propagation", "homogeneous": "b10_homogeneous", "quick": "b10_propagation_quick"
    }[population(args)]  # fmt: skip
    until = args.until if args.until is not None else float("inf")
    mapping, rows = report_rows(work, args.out / f"{stem}.json", lambda: collect(work, until))
    rows += borrow_alone(mapping, rows, args.out)
    if args.until is not None:  # an earlier report's rows may run further
        rows = [r for r in rows if r["steps"] <= args.until]
    if not rows:
        raise SystemExit(f"no node with two evaluations under {work}")
    last = max(r["steps"] for r in rows)
    dropped = sorted({(r["config"], r["seed"]) for r in rows if r["steps"] < last})
    if dropped:  # an unfinished run would be averaged with finished ones
        print(f"leaving out unfinished runs {dropped} (before step {last})", file=sys.stderr)
        rows = [r for r in rows if (r["config"], r["seed"]) not in dropped]
    fam = mapping["node"]["tasks"]["families"][0]
    roles = node_roles(args, work, mapping["nodes"])
    keys = [("accuracy", "exact"), ("greedy_accuracy", "greedy"), ("pass_at_8", "pass@8"), ("format_rate", "format")]
    lines = [
        "# B10 propagation: a weak node with and without a strong peer"
        if mapping["name"] == "b10-propagation"
        else f"# B10 {mapping['name'].removeprefix('b10-')}: nodes with and without their peers' rollouts",
        "",
        f"Machine: {args.machine or machine_info()}. Family `{fam['name']}` `{json.dumps(fam['config'])}`; real "
        "`swarm-node join` "
        f"processes over hivemind on 127.0.0.1 (`benchmarks/b10_propagation.py`, experiment in "
        f"`{work.name}/experiment.yaml`). Nodes: "
        + "; ".join(f"{role} = {what}" for role, what in roles.values())
        + ". "
        + "; ".join(f"{name} = {CONFIGS[name][0]}" for name in CONFIGS if any(r["config"] == name for r in rows))
        + ". Held-out items: the family's held-out split, the same at every evaluation; exact = share of 8 samples "
        "exactly right; baseline = the most common gold answer; top answer = the share of all samples giving the "
        "node's most common answer (near 1: collapsed onto one answer).",
        "",
        "| node | config | seed | steps | exact before -> after | greedy | pass@8 | format | top answer | own exact | "
        "peer tokens | peer IS weight | trained on |",
        "|---|---|---:|---:|---|---|---|---|---|---:|---:|---:|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["node"], r["config"], r["seed"])):
        b, a = r["before"], r["after"]
        cells = [f"{b[k]:.3f} -> {a[k]:.3f}" for k, _ in keys]
        top = [x.get("top_answer_share") for x in (b, a)]  # a collapse onto one answer shows here
        cells.append(" -> ".join("-" if t is None else f"{t:.2f}" for t in top))
        senders = ", ".join(f"{k} {v}" for k, v in sorted(r["senders"].items())) or "-"
        lines.append(
            f"| {r['role']} | {r['config']}{'†' if r.get('borrowed') else ''} | {r['seed']} | {r['steps']} | "
            + " | ".join(cells)
            + f" | {r['own_exact']:.3f} | {r['peer_token_share']:.2f} | {r['peer_is_weight']:.3f} | {senders} |"
        )  # fmt: skip
    for source, nodes in _borrowed(rows).items():
        lines += ["", f"† From `{source}.json`, the same runs: node {', '.join(map(str, nodes))} alone there has this "
                  "population's model, settings, budget, index and seed, and a node alone trains on nothing of its "
                  "peers'."]  # fmt: skip
    # identical nodes (the homogeneous population) are pooled too: every node's run is one more sample
    pooled = ["all nodes"] if len({what for _, what in roles.values()}) == 1 and len(roles) > 1 else []
    lines += [
        "",
        f"Gains (after - before), mean ± sd over seeds{' (all nodes: over node runs)' if pooled else ''}; "
        f"majority baseline {rows[0]['after']['majority_baseline']:.3f}:",
        "",
    ]
    lines += ["| node | config | seeds | " + " | ".join(label for _, label in keys) + " |",
              "|---|---|---:|" + "---|" * len(keys)]  # fmt: skip
    gains: dict[tuple[str, str], dict[str, list[float]]] = {}
    groups = [*dict.fromkeys(r["role"] for r in rows), *pooled]
    for role in groups:
        for name in CONFIGS:
            sel = [r for r in rows if role in (r["role"], *pooled) and r["config"] == name]
            if not sel:
                continue
            g = {k: [r["after"][k] - r["before"][k] for r in sel] for k, _ in keys}
            gains[(role, name)] = g
            cells = " | ".join(mean_sd(g[k], signed=True) for k, _ in keys)
            lines.append(f"| {role} | {name} | {len(sel)} | {cells} |")
    lines += [""]
    for role, name in [(role, name) for role in groups for name in CONFIGS]:
        alone, share = gains.get((role, "alone")), gains.get((role, name))
        if name == "alone" or not alone or not share:
            continue
        a, s = alone["accuracy"], share["accuracy"]
        ma, ms = statistics.fmean(a), statistics.fmean(s)
        ratio = f"{ms / ma:.2f}x" if ma > 0 else "n/a: no gain alone"
        unit = "node runs" if role in pooled else "seeds"
        if min(len(a), len(s)) < 2:
            verdict = "not judged (one seed, no spread)"
        else:
            spread = 2 * max(statistics.stdev(a), statistics.stdev(s))
            verdict = f"{'beyond' if abs(ms - ma) > spread else 'within'} 2 sd of the {unit} ({spread:.3f})"
        lines.append(
            f"- {role}, {name}: exact gain {ms:+.3f} against {ma:+.3f} alone ({ratio}); the difference "
            f"{ms - ma:+.3f} is {verdict}."
        )
    write_results(args.out, stem, "\n".join(lines) + "\n", {"experiment": mapping, "rows": rows})
    _plot(rows, args.out / f"{stem}.png")


def _borrowed(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Source report -> the node indices whose rows came from it (:func:`borrow_alone`)."""
    out: dict[str, set[int]] = {}
    for r in rows:
        if r.get("borrowed"):
            out.setdefault(r["borrowed"], set()).add(r["node"])
    return {k: sorted(v) for k, v in out.items()}


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    from benchmarks.common.plots import save_step_panels

    def draw(ax: Any, role: str) -> None:
        for r in [r for r in rows if r["role"] == role]:
            steps = [s for s, _ in r["curve"]]
            color = f"C{list(CONFIGS).index(r['config'])}" if r["config"] in CONFIGS else "C9"
            first = r["seed"] == rows[0]["seed"]
            for key, style, label in (("greedy_accuracy", "-", "greedy"), ("pass_at_8", ":", "pass@8")):
                ax.plot(steps, [f[key] for _, f in r["curve"]], style, color=color, alpha=0.7,
                        label=f"{r['config']} {label}" if first else None)  # fmt: skip
        ax.axhline(rows[0]["after"]["majority_baseline"], color="grey", lw=0.8, label="majority baseline")

    roles = list(dict.fromkeys(r["role"] for r in rows))
    save_step_panels(path, roles, draw, "held-out exact: greedy (solid), pass@8 (dotted)")


def main() -> None:
    quick = "2 steps of two tiny-model nodes (a smoke run)"
    ap, r, rep = experiment_cli(__doc__ or "", WORK, RESULTS, quick, list(CANDIDATES))
    for p in (r, rep):
        p.add_argument(
            "--population", choices=["propagation", "homogeneous"], default="propagation",
            help="strong + weak + tiny (B10), or three identical SmolLM2 nodes (the homogeneous SAPO row)",
        )  # fmt: skip
    rep.add_argument("--until", type=int, help="report evaluations up to this step only")
    r.add_argument("--strong-examples", type=int, default=2048, help="the strong peer's warm-start examples")
    r.add_argument(
        "--configs", nargs="+", choices=list(CONFIGS), default=["alone", "share"],
        help="configurations to run (a work dir grows by the ones it lacks)",
    )  # fmt: skip
    args = ap.parse_args()
    {"run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
