"""Sybil share: how much of an honest node's external training data comes from honest peers under a sybil flood.

Three honest nodes (scripted policy, in-process, the real runtime, channel, sharded memory transport and SAPO
sampler) run for a while; from round ``--start`` on, ``S`` throwaway identities per round each publish one valid
record of *informative* groups (right and wrong answers, so re-scoring keeps them). Reported per S: the share of the
external groups the honest nodes trained on (from round ``--start`` on) that came from honest peers (minimum over
the honest nodes, and the mean). Target (issue: hostile swarms): at least 0.5 under 1,000 sybils.

    python benchmarks/systems/sybil.py            # S = 10, 100, 1000
    python benchmarks/systems/sybil.py --quick    # S = 10, 100, fewer rounds (a smoke run for the tests)

Writes ``benchmarks/results/sybil.md`` (or ``--out``) with machine info and the date.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common.machine import machine_info  # noqa: E402
from benchmarks.systems.harness import RESULTS, parser, write_table  # noqa: E402


def sim_config(sybils: int, steps: int, start: int):
    from sim.config import SimConfig

    return SimConfig.model_validate(
        {
            "name": "sybil",
            "policy": "scripted",
            "nodes": 3,
            "steps": steps,
            "seeds": [0],
            "node": {
                "swarm_id": "sim-sybil",
                "tasks": {"families": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}]},
                "rollout": {"prompts_per_step": 4, "group_size": 4},
                "sapo": {"local_groups": 4, "external_groups": 4, "peer_advantage": "group", "publish_solved": False},
            },
            "adversaries": [{"type": "sybil", "count": sybils, "start": start}],
            "configurations": [{"name": "4-4"}],
        }
    )


def measure(sybils: int, steps: int, start: int, workdir: Path) -> dict:
    from sim.inprocess import run_seed

    cfg = sim_config(sybils, steps, start)
    t0 = time.perf_counter()
    res = asyncio.run(run_seed(cfg, "4-4", 0, workdir / f"s{sybils}"))
    honest = set(res.honest)
    shares = []
    total = 0
    for counts in res.external_sources:
        n = sum(counts.values())
        total += n
        shares.append(sum(v for s, v in counts.items() if s in honest) / n if n else 1.0)
    return {
        "sybils": sybils,
        "min_share": min(shares),
        "mean_share": sum(shares) / len(shares),
        "external_groups": total,
        "wall_s": time.perf_counter() - t0,
    }


def render(rows: list[dict], steps: int, start: int, quick: bool) -> str:
    lines = [
        "# Sybil share: honest peers' share of an honest node's external training data",
        "",
        f"Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Machine: {machine_info(with_torch=False)}  ",
        f"Mode: {'quick' if quick else 'full'}; 3 honest nodes, scripted policy, SAPO 4/4, {steps} rounds; from round "
        f"{start} on, S fresh identities per round each publish one valid informative record. Defences: the sharded "
        "read's newcomer budget (4 of 10 records per poll for senders a node does not follow; it follows the peers "
        "whose groups proved useful) and SAPO's newcomer share (1 of 4 external slots for senders with informative "
        "groups at fewer than 3 of our steps). Target: honest share >= 0.5 at S = 1000.",
        "",
        "| sybils per round | honest share (min over nodes) | honest share (mean) | external groups trained | wall s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['sybils']} | {r['min_share']:.3f} | {r['mean_share']:.3f} | {r['external_groups']} "
            f"| {r['wall_s']:.0f} |"
        )
    ok = all(r["min_share"] >= 0.5 for r in rows)
    lines += ["", f"Result: {'PASS' if ok else 'FAIL'} -- honest share >= 0.5 at every S measured."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = parser(__doc__.split("\n\n")[0], "S = 10 and 100, 10 rounds", RESULTS / "sybil.md")
    ap.add_argument("--sizes", type=int, nargs="+", help="sybils per round (default 10 100 1000)")
    ap.add_argument("--steps", type=int, help="rounds (default 16; quick 10)")
    ap.add_argument("--start", type=int, default=4, help="round the sybils arrive")
    args = ap.parse_args()
    sizes = args.sizes or ([10, 100] if args.quick else [10, 100, 1000])
    steps = args.steps or (10 if args.quick else 16)
    with tempfile.TemporaryDirectory(prefix="sybil-") as tmp:
        rows = [measure(s, steps, args.start, Path(tmp)) for s in sizes]
    text = render(rows, steps, args.start, args.quick)
    return write_table(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
