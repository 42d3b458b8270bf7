"""B8 learning: does SmolLM2-135M gain held-out *skill* from RL on this swarm's node, not only format?

Three parts, each resumable (run directories live under ``--work``, outside the repository, and a finished seed is
not run again), so a run of several hours can be spread over sessions:

* ``probe``: the stock model on candidate families (few items each): format rate, exact accuracy sampled and
  greedy, pass@8 and the majority-answer baseline. Families where pass@8 is well above the sampled accuracy and
  above the baseline have room to learn; those are the ones to train on. Writes ``b8_learning_probe.md/json``.
* ``run``: one ``swarm-node join --transport memory`` per seed (the real CLI, a single node: B8 is the node alone)
  on the chosen families, with held-out evaluations every ``--eval-every`` steps on the same items.
* ``report``: reads the runs' ``eval.jsonl`` and writes ``b8_learning.md/json``: per seed and family, before and
  after, exact accuracy (sampled; greedy; among answers in the format), the majority baseline, partial-credit
  reward, format rate, pass@1 and pass@8, with the mean and standard deviation over seeds, and a plot over steps.

    python benchmarks/b8_learning.py probe --items 16
    python benchmarks/b8_learning.py run --families basic_arithmetic products --seeds 0 1 2 --steps 100
    python benchmarks/b8_learning.py report
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402
from benchmarks.common.multirun import read_evals, write_results  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WORK = Path(os.environ.get("RL_SWARM_BENCH_DIR", Path.home() / ".cache" / "rl-swarm" / "bench")) / "b8_learning"

#: Small configurations of families a 135M model can sometimes answer, by label (the probe decides which to train
#: on). A label names a family and its settings; two labels of one family cannot be in one run (results are keyed by
#: family).
CANDIDATES: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {"name": "basic_arithmetic", "config": {"max_terms": 2, "max_digits": 1}},
    "products": {"name": "products", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
    "products_2d": {
        "name": "products", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    },
    "chain_sum": {"name": "chain_sum", "config": {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}},
    "chain_sum_2d": {
        "name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    },
    "leg_counting": {
        "name": "leg_counting", "config": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3},
    },
    "gcd": {"name": "gcd", "config": {"min_numbers": 2, "max_numbers": 2, "min_value": 2, "max_value": 30}},
    "letter_counting": {"name": "letter_counting", "config": {"min_words": 1, "max_words": 3}},
    "spell_backward": {"name": "spell_backward", "config": {"min_word_len": 3, "max_word_len": 5}},
    "word_sequence_reversal": {"name": "word_sequence_reversal", "config": {"min_words": 2, "max_words": 3}},
    "number_sorting": {
        "name": "number_sorting",
        "config": {"min_numbers": 3, "max_numbers": 3, "min_decimals": 0, "max_decimals": 0, "min_value": 0,
                   "max_value": 50},
    },
    "count_bits": {"name": "count_bits", "config": {"min_n": 1, "max_n": 64}},
}  # fmt: skip


def families_of(labels: list[str]) -> list[dict[str, Any]]:
    """The task families of some candidate labels; two labels of one family are refused."""
    fams = [CANDIDATES[label] for label in labels]
    names = [f["name"] for f in fams]
    if len(set(names)) != len(names):
        raise SystemExit(f"labels {labels} name one family twice: results are keyed by family, run them apart")
    return fams


def node_config(
    families: list[str],
    *,
    engine: str,
    max_new_tokens: int,
    items: int,
    eval_every: int | None,
    warm: list[str] | None = None,
    warm_examples: int = 512,
) -> dict:
    """The node's config: SmolLM2 alone, 4 prompts x 8 completions a step, the pretrained learning rate; with
    ``warm``, a short supervised warm start on those (other) families first, so the format is known before RL."""
    model: dict[str, Any] = {"name": "smollm2-135m", "device": "cpu"}
    if warm:
        if set(warm) & set(families):
            raise SystemExit(f"warm-start families {warm} overlap the trained ones {families}: warm on others")
        model["warm_start"] = {"families": families_of(warm), "examples": warm_examples}
    return {
        "swarm_id": "b8-learning",
        "model": model,
        "tasks": {"families": families_of(families)},
        "rollout": {
            "engine": engine, "prompts_per_step": 4, "group_size": 8, "max_new_tokens": max_new_tokens,
            "batch_size": 64,
        },
        "learner": {"lr": 1.0e-5, "micro_batch_size": 8},  # the pretrained default, written out
        "sapo": {"local_groups": 4, "external_groups": 0},
        "eval": {"every_steps": eval_every, "items_per_family": items, "samples": 8, "greedy": True},
        "checkpoint": {"every": 10, "keep": 1},
    }  # fmt: skip


def _family_row(fam: str, f: dict[str, Any]) -> dict[str, Any]:
    fmt = f["format_rate"]
    return {
        "family": fam,
        "accuracy": f["accuracy"],
        "greedy": f["greedy_accuracy"],
        "in_format": f["accuracy"] / fmt if fmt else 0.0,  # a wrong format is never exact
        "baseline": f["majority_baseline"],
        "reward": f["reward"],
        "format": fmt,
        "pass1": f["pass_at_1"],
        "pass8": f["pass_at_8"],
        "top_answer": f.get("top_answer"),
        "top_share": f.get("top_answer_share"),
        "length": f["mean_length"],
    }


def probe(args: argparse.Namespace) -> None:
    """Evaluate the stock model on every candidate family (in this process, on the chosen engine)."""
    from node.config import NodeConfig
    from node.eval import Evaluator
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine
    from node.seams import GenerationSettings
    from node.tasks import TaskSource
    from protocol.config import validate_config

    labels = args.families or [k for k in CANDIDATES if not k.endswith("_2d")]
    cfg = validate_config(
        NodeConfig,
        node_config(
            labels, engine=args.engine, max_new_tokens=args.max_new_tokens, items=args.items, eval_every=None,
            warm=args.warm_start, warm_examples=args.warm_examples,
        ),
    )  # fmt: skip
    if args.threads:
        cfg.model.threads = args.threads
    policy = load_policy(cfg.model)
    if args.engine == "vllm":
        from node.rollout.engine_vllm import build_vllm_engine

        engine: Any = build_vllm_engine(cfg, policy)
    else:
        engine = TransformersEngine(policy, batch_size=64, settings=GenerationSettings.of(cfg.rollout))
    t0 = time.perf_counter()
    result = Evaluator(TaskSource(cfg.tasks), policy, engine, cfg.eval, cfg.rollout).evaluate(0)
    label_of = {CANDIDATES[label]["name"]: label for label in labels}
    rows = [{**_family_row(fam, f), "label": label_of[fam]} for fam, f in result["families"].items()]
    warm = cfg.model.warm_start
    warm_names = ", ".join(args.warm_start or [])
    who = "stock SmolLM2-135M-Instruct" if warm is None else f"SmolLM2-135M-Instruct warm-started on {warm_names}"
    lines = [
        f"# B8 learning, family probe: {who} on candidate families",
        "",
        f"Machine: {machine_info()}. {args.items} held-out items per family, 8 samples each at temperature "
        f"{cfg.rollout.temperature} plus one greedy, {args.max_new_tokens} new tokens, engine {args.engine}, "
        f"{time.perf_counter() - t0:.0f} s. Exact = exact match of the answer in `<answer>...</answer>`; "
        "baseline = always giving the family's most common gold answer."
        + (
            ""
            if warm is None
            else f" Warm start (`model.warm_start`): {warm.examples} training-split examples of {warm_names}, "
            f"question -> `<answer>gold</answer>`, lr {warm.lr}, batch {warm.batch_size}."
        ),
        "",
        "| family | config | format | exact (sampled) | exact in format | greedy | pass@8 | baseline | "
        "partial reward | top answer (share) | mean tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | `{json.dumps(CANDIDATES[r['label']]['config'])}` | {r['format']:.2f} | "
            f"{r['accuracy']:.3f} | "
            f"{r['in_format']:.3f} | {r['greedy']:.3f} | {r['pass8']:.3f} | {r['baseline']:.3f} | "
            f"{r['reward']:.3f} | {r['top_answer']!r} ({r['top_share']:.2f}) | {r['length']:.0f} |"
        )
    write_results(args.out, args.stem or "b8_learning_probe", "\n".join(lines) + "\n",
                  {"config": cfg.model_dump(mode="json"), "rows": rows})  # fmt: skip


def _exe() -> list[str]:
    exe = shutil.which("swarm-node")
    return [exe] if exe else [sys.executable, "-m", "node.cli.app"]


def run(args: argparse.Namespace) -> None:
    """Run (or finish) one single-node training run per seed; a seed whose last evaluation is at --steps is done."""
    cfg = node_config(
        args.families, engine=args.engine, max_new_tokens=args.max_new_tokens, items=args.items,
        eval_every=args.eval_every, warm=args.warm_start, warm_examples=args.warm_examples,
    )  # fmt: skip
    args.work.mkdir(parents=True, exist_ok=True)
    config = args.work / "node.yaml"
    if config.is_file() and yaml.safe_load(config.read_text()) != cfg:
        raise SystemExit(f"{config} holds another configuration: use another --work, or remove it to start over")
    config.write_text(yaml.safe_dump(cfg))
    for seed in args.seeds:
        run_dir = args.work / f"seed{seed}"
        evals = read_evals(run_dir)
        if evals and evals[-1]["step"] >= args.steps:
            print(f"seed {seed}: done ({len(evals)} evaluations)", file=sys.stderr)
            continue
        print(f"seed {seed}: training to step {args.steps} in {run_dir}", file=sys.stderr, flush=True)
        cmd = [*_exe(), "join", "--run-dir", str(run_dir), "--transport", "memory", "--config", str(config)]
        cmd += ["--max-steps", str(args.steps), "--set", f"seed={seed}"]
        if args.threads:
            cmd += ["--set", f"model.threads={args.threads}"]
        with (args.work / f"seed{seed}.log").open("a") as log:
            subprocess.run(cmd, check=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def mean_sd(values: list[float], *, signed: bool = False) -> str:
    """``mean ± sd`` over seeds (sd 0 for one value; ``n/a`` for none); ``signed`` writes the mean's sign (gains)."""
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):{'+' if signed else ''}.3f} ± {sd:.3f}"


def report(args: argparse.Namespace) -> None:
    """Before/after per seed and family, with mean ± sd over seeds; the over-steps plot."""
    if not (args.work / "node.yaml").is_file():
        raise SystemExit(f"{args.work} holds no runs (no node.yaml): run `b8_learning.py run` first")
    cfg = yaml.safe_load((args.work / "node.yaml").read_text())
    runs = {
        int(d.name.removeprefix("seed")): read_evals(d)
        for d in sorted(args.work.glob("seed*"))
        if d.is_dir() and d.name.removeprefix("seed").isdigit()
    }
    runs = {s: e for s, e in runs.items() if len(e) >= 2}
    if not runs:
        raise SystemExit(f"no run with two evaluations under {args.work}")
    last = max(e[-1]["step"] for e in runs.values())
    unfinished = sorted(s for s, e in runs.items() if e[-1]["step"] < last)
    if unfinished:  # seeds stopped early would be averaged with finished ones
        print(f"leaving out seeds {unfinished}: their last evaluation is before step {last}", file=sys.stderr)
        runs = {s: e for s, e in runs.items() if s not in unfinished}
    keys = ["accuracy", "greedy", "in_format", "pass8", "pass1", "format", "reward", "baseline"]
    rows = []
    for seed, evals in sorted(runs.items()):
        first, last = evals[0], evals[-1]
        for fam in first["families"]:
            b, a = _family_row(fam, first["families"][fam]), _family_row(fam, last["families"][fam])
            rows.append({"seed": seed, "family": fam, "steps": last["step"], "before": b, "after": a})
    lines = [
        "# B8 learning: SmolLM2-135M-Instruct alone, held-out exact accuracy before and after RL",
        "",
        f"Machine: {machine_info()}. Node config (`benchmarks/b8_learning.py`, a `swarm-node join --transport "
        f"memory` per seed): `{json.dumps(cfg, sort_keys=True)}`. Held-out items: questions of the held-out split "
        "(never trained on), the same items at every evaluation. exact: the share of the 8 samples (temperature "
        "1) whose answer is exactly right; in format: the same among answers given as `<answer>...</answer>`; "
        "baseline: always answering the family's most common gold answer; reward: partial credit (not evidence); "
        "top answer: the most common sampled answer after training and its share of the samples (a collapse onto "
        "one answer shows here).",
        "",
        "| seed | family | steps | exact before -> after | greedy | in format | pass@1 | pass@8 | format | reward "
        "| baseline | top answer after |",
        "|---:|---|---:|---|---|---|---|---|---|---|---:|---|",
    ]

    def arrow(r: dict, k: str) -> str:
        return f"{r['before'][k]:.3f} -> {r['after'][k]:.3f}"

    for r in rows:
        lines.append(
            f"| {r['seed']} | {r['family']} | {r['steps']} | {arrow(r, 'accuracy')} | {arrow(r, 'greedy')} | "
            f"{arrow(r, 'in_format')} | {arrow(r, 'pass1')} | {arrow(r, 'pass8')} | {arrow(r, 'format')} | "
            f"{arrow(r, 'reward')} | {r['after']['baseline']:.3f} | {r['after']['top_answer']!r} "
            f"({r['after']['top_share'] or 0:.2f}) |"
        )
    lines += ["", "Gains over seeds (after - before; mean ± sd):", ""]
    lines += ["| family | seeds | " + " | ".join(keys[:-1]) + " |", "|---|---:|" + "---|" * (len(keys) - 1)]
    summary: dict[str, Any] = {}
    for fam in dict.fromkeys(r["family"] for r in rows):
        fr = [r for r in rows if r["family"] == fam]
        gains = {k: [r["after"][k] - r["before"][k] for r in fr] for k in keys[:-1]}
        summary[fam] = {k: v for k, v in gains.items()}
        lines.append(f"| {fam} | {len(fr)} | " + " | ".join(mean_sd(gains[k]) for k in keys[:-1]) + " |")
    for fam, g in summary.items():
        acc = g["accuracy"]
        if len(acc) > 1:
            mean, sd = statistics.fmean(acc), statistics.stdev(acc)
            after = [r["after"] for r in rows if r["family"] == fam]
            above = all(a["accuracy"] > a["baseline"] for a in after)
            p8 = statistics.fmean(g["pass8"])
            lines.append(
                f"- {fam}: exact {'gain' if mean >= 0 else 'loss'} {mean:+.3f}, "
                f"{'beyond' if abs(mean) > 2 * sd else 'within'} 2 sd ({2 * sd:.3f}); "
                f"after {'above' if above else 'not above'} the majority baseline in every seed; pass@8 "
                f"{'did not fall' if p8 >= 0 else 'fell'} ({p8:+.3f})."
            )
    stock = _stock_line(args.stock, cfg)
    if stock:
        lines += [
            "",
            "After training against the stock model on the same items (`b8_learning_probe_stock.md`: its own style, "
            "with working-out, no warm start), mean over seeds:",
            "",
            "| family | exact stock / after | greedy stock / after | pass@8 stock / after |",
            "|---|---|---|---|",
        ]
        for fam, st in stock.items():
            after = [r["after"] for r in rows if r["family"] == fam]
            if after:
                cells = [
                    f"{st[k]:.3f} / {statistics.fmean(a[k] for a in after):.3f}"
                    for k in ("accuracy", "greedy", "pass8")
                ]
                lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    write_results(args.out, "b8_learning", "\n".join(lines) + "\n", {"config": cfg, "runs": runs})
    _plot(runs, args.out / "b8_learning.png", stock)


def _stock_line(path: Path, cfg: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The stock model's rows (``probe --stem b8_learning_probe_stock``) by family, if it probed the run's families
    with the same settings and number of items; else nothing."""
    if not path.is_file():
        return {}
    probe = json.loads(path.read_text())
    pc = probe["config"]

    def key(c: dict[str, Any]) -> tuple:
        fams = [(f["name"], f.get("config", {})) for f in c.get("tasks", {}).get("families", [])]
        return fams, c.get("eval", {}).get("items_per_family"), c.get("rollout", {}).get("max_new_tokens")

    same = key(pc) == key(cfg) and bool(key(cfg)[0])
    return {r["family"]: r for r in probe["rows"]} if same else {}


def _plot(runs: dict[int, list[dict[str, Any]]], path: Path, stock: dict[str, dict[str, float]]) -> None:
    from benchmarks.common.plots import save_step_panels

    def draw(ax: Any, fam: str) -> None:
        for seed, evals in sorted(runs.items()):
            steps = [e["step"] for e in evals]
            for key, style in (("accuracy", "-"), ("greedy_accuracy", "--"), ("pass_at_8", ":")):
                ax.plot(steps, [e["families"][fam][key] for e in evals], style, color=f"C{seed}",
                        label=f"seed {seed} {key}")  # fmt: skip
        ax.axhline(evals[0]["families"][fam]["majority_baseline"], color="grey", lw=0.8, label="majority baseline")
        if fam in stock:
            ax.axhline(stock[fam]["greedy"], color="black", ls="--", lw=0.8, label="stock model, greedy")
            ax.axhline(stock[fam]["pass8"], color="black", ls=":", lw=0.8, label="stock model, pass@8")

    families = list(next(iter(runs.values()))[0]["families"])
    save_step_panels(path, families, draw, "held-out exact (solid), greedy (dashed), pass@8 (dotted)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("probe", "run", "report"):
        p = sub.add_parser(name)
        p.add_argument("--work", type=Path, default=WORK)
        p.add_argument("--out", type=Path, default=RESULTS, help="where the tables and the plot go")
        p.add_argument("--engine", choices=["vllm", "transformers"], default="vllm")
        p.add_argument("--max-new-tokens", type=int, default=64)
        p.add_argument("--threads", type=int, default=0, help="model.threads (0: the node's default)")
        p.add_argument("--families", nargs="+", choices=sorted(CANDIDATES))
        p.add_argument("--items", type=int, default=48, help="held-out items per family")
        p.add_argument("--warm-start", nargs="+", choices=sorted(CANDIDATES), help="format warm-start families")
        p.add_argument("--warm-examples", type=int, default=512)
    sub.choices["probe"].add_argument("--stem", help="result file name (default b8_learning_probe)")
    sub.choices["report"].add_argument(
        "--stock", type=Path, default=RESULTS / "b8_learning_probe_stock.json",
        help="the stock model's probe on the same items (left out if it differs)",
    )  # fmt: skip
    sub.choices["run"].add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    sub.choices["run"].add_argument("--steps", type=int, default=100)
    sub.choices["run"].add_argument("--eval-every", type=int, default=25)
    args = ap.parse_args()
    if args.cmd == "run" and not args.families:
        ap.error("run needs --families (choose them with probe)")
    {"probe": probe, "run": run, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
