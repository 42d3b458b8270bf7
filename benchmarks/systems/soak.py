"""B9 soak: does a node stay flat over a long run? Memory, open files, pools, caches and disk, sampled every N steps.

Two runs, one after the other, each in this process with the built-in tiny model and a small step (few prompts,
a small group, short completions, no held-out evaluation), so that thousands of steps fit on two shared cores:

* ``alone``: one node, no network (GRPO on its own rollouts; checkpoints every 100 steps, ``keep: 2``);
* ``swarm``: four nodes over one in-process memory network with the real channel, validator, sharded layout and
  SAPO sampler, stepping in turn. The network's clock advances ``--round-s`` per round, so protocol windows turn
  over every few rounds and every per-window structure (replay memory, index writer, shard reader cache, the
  network's own store) is created and pruned hundreds of times. Node 2 runs APRIL + VADE (their buffer and
  posteriors), node 3 runs MNPO side by side (its reference-logprob cache and score tables).

Sampled every ``--every`` steps: process RSS (the four swarm nodes share one process), open file descriptors,
threads, live Python objects, the SAPO pool, the channel's seen-digest map and followed-sender table, the
validator's replay memory, the shard reader's cache, the memory network's store, the node's peer table and
ingest counters, MNPO/VADE/APRIL state, the task caches, and the run dir's files (rollouts, metrics, checkpoints).

The verdict compares the first sample after the warm-up (step ``--every``) with the last, for every probe:
memory must stay within ``--rss-bound`` (default +15%) of that baseline, every cache within its stated cap, and
every file that grows must grow linearly by design (append-only logs: bytes per step reported).

    python benchmarks/systems/soak.py                    # 2,000 steps alone, then 2,000 rounds of the 4-node swarm
    python benchmarks/systems/soak.py --quick            # 30 steps each, sampled every 10 (a smoke run for the tests)

Writes ``benchmarks/results/soak.md`` (or ``--out``) and the raw samples next to it as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems.soak_probe import progress, sample  # noqa: E402
from benchmarks.systems.soak_verdict import VADE_TRACKED, render, verdict  # noqa: E402

#: The small step: 2 prompts x 4 completions of at most 12 tokens, 2 own + 2 peers' groups per update.
STEP = {
    "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 12},
    "sapo": {"local_groups": 2, "external_groups": 2, "max_age_steps": 20},
    "eval": {"every_steps": None, "at_start": False, "at_end": False},
    "checkpoint": {"every": 100, "keep": 2},
    "model": {"threads": 1},
}


def node_config(swarm_id: str, extra: dict[str, Any] | None = None):
    from node.config import NodeConfig

    data: dict[str, Any] = json.loads(json.dumps(STEP))
    data["swarm_id"] = swarm_id
    for k, v in (extra or {}).items():
        data.setdefault(k, {}).update(v)
    return NodeConfig.model_validate(data)


async def run_alone(steps: int, every: int, run_dir: Path) -> list[dict[str, Any]]:
    from node.runtime import Node

    cfg = node_config("soak-alone")
    node = await Node.create(cfg, run_dir, resume=False, live=False)
    rows = []
    t0 = time.perf_counter()
    try:
        rows.append(sample(0, t0, [node], run_dir))
        while node.step < steps:
            await node.step_once()
            if node.step % every == 0:
                rows.append(sample(node.step, t0, [node], run_dir))
                progress("alone", node.step, steps, t0, rows[-1])
    finally:
        await node.close()
    return rows


async def run_swarm(steps: int, every: int, run_dir: Path, round_s: float, nodes_n: int = 4) -> list[dict[str, Any]]:
    from node.runtime import Node, build_parts
    from protocol.channel import Channel
    from protocol.transport.memory import MemoryNetwork, MemoryTransport
    from protocol.validation import RecordValidator
    from sim.inprocess import SimClock, derived_identity

    clock = SimClock(1_700_000_000.0)
    extras: list[dict[str, Any]] = [
        {},
        {},
        {"april": {"enabled": True}, "vade": {"enabled": True, "max_tracked": VADE_TRACKED}},
        {"mnpo": {"schedule": "side_by_side", "prompts_per_window": 2, "responses_per_prompt": 2}},
    ]
    cfgs = [node_config("soak-swarm", extras[i % len(extras)]) for i in range(nodes_n)]
    pcfg = cfgs[0].protocol
    network = MemoryNetwork(seed=0, clock=clock, retention_windows=max(8, pcfg.max_past_windows + 2))
    nodes = []
    try:
        for i, cfg in enumerate(cfgs):
            ident = derived_identity(0, "soak", i)
            transport = MemoryTransport(network, ident.peer_id, protocol=pcfg, swarm=cfg.swarm_id, seed=i)
            validator = RecordValidator.from_config(cfg.swarm_id, pcfg, clock=clock)
            channel = await Channel.create(
                ident, transport, validator, fetch_past_windows=pcfg.fetch_past_windows, timeout_s=pcfg.timeout_s
            )
            parts = await asyncio.to_thread(build_parts, cfg)
            node_dir = run_dir / f"node{i}"
            nodes.append(
                await Node.create(
                    cfg, node_dir, channel=channel, parts=parts, name=ident.peer_id, resume=False, live=False
                )
            )
        rows = []
        t0 = time.perf_counter()
        rows.append(sample(0, t0, nodes, run_dir, network))
        for r in range(1, steps + 1):
            clock.now += round_s
            for node in nodes:
                await node.step_once()
            if r % every == 0:
                rows.append(sample(r, t0, nodes, run_dir, network))
                progress("swarm", r, steps, t0, rows[-1])
        return rows
    finally:
        for node in nodes:
            await node.close()


def save_rss_plot(path: Path, results: dict[str, dict[str, Any]]) -> None:
    """RSS over steps, one line per run (the picture of a leak: a slope that does not bend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, res in results.items():
        ax.plot([r["step"] for r in res["rows"]], [r["rss_mb"] for r in res["rows"]], label=label)
    ax.set_xlabel("step (swarm: round)")
    ax.set_ylabel("process RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000, help="steps of the lone node and rounds of the swarm")
    ap.add_argument("--every", type=int, default=100, help="sample every N steps (the first sample is the baseline)")
    ap.add_argument("--only", choices=["alone", "swarm"], default=None)
    ap.add_argument("--round-s", type=float, default=3.0, help="network clock advance per swarm round (seconds)")
    ap.add_argument("--rss-bound", type=float, default=0.15, help="allowed RSS growth over the baseline (fraction)")
    ap.add_argument(
        "--slope-bound", type=float, default=5.0, help="allowed RSS slope over the second half (MB per 1000 steps)"
    )
    ap.add_argument("--quick", action="store_true", help="30 steps each, sampled every 10 (smoke run, not enforced)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep run dirs here (default: a temporary dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak.md")
    ap.add_argument("--from-json", type=Path, default=None, help="re-render a report from a run's saved samples")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.every = 30, 10
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    results: dict[str, dict[str, Any]] = {}
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        results = {label: _judged(label, rows, rows[-1]["elapsed_s"], args) for label, rows in saved.items()}
        return _report(results, args)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = args.workdir or Path(tmp)
        for label in ("alone", "swarm"):
            if args.only not in (None, label):
                continue
            t0 = time.perf_counter()
            if label == "alone":
                rows = asyncio.run(run_alone(args.steps, args.every, work / "alone"))
            else:
                rows = asyncio.run(run_swarm(args.steps, args.every, work / "swarm", args.round_s))
            results[label] = _judged(label, rows, time.perf_counter() - t0, args)
    # One run of --only: the other run's samples saved by an earlier run (same --out) stay in the report.
    saved_json = args.out.with_suffix(".json")
    if args.only is not None and saved_json.exists():
        for label, rows in json.loads(saved_json.read_text()).items():
            if label not in results:
                results[label] = _judged(label, rows, rows[-1]["elapsed_s"], args) | {"earlier": True}
        results = dict(sorted(results.items()))  # alone, then swarm
    return _report(results, args)


def _judged(label: str, rows: list[dict[str, Any]], wall_s: float, args: argparse.Namespace) -> dict[str, Any]:
    nodes = 1 if label == "alone" else 4
    return {"rows": rows, "wall_s": wall_s, "verdict": verdict(rows, args.rss_bound, nodes, args.slope_bound)}


def _report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> int:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(results, args, STEP))
    args.out.with_suffix(".json").write_text(json.dumps({k: v["rows"] for k, v in results.items()}, indent=1))
    save_rss_plot(args.out.with_suffix(".png"), results)
    print(args.out.read_text())
    bad = [f"{label}:{v['probe']}" for label, res in results.items() for v in res["verdict"] if not v["ok"]]
    if bad:
        print("not flat or over a cap: " + ", ".join(bad), file=sys.stderr)
    # A quick run is a smoke test of the machinery: its caches are still warming up, so verdicts are not enforced.
    return 1 if bad and not args.quick else 0


if __name__ == "__main__":
    raise SystemExit(main())
