"""B5 scale: per-node cost of the swarm as it grows, N = 10, 100, 1,000, 10,000 in-process nodes (scripted policy).

Each size runs ``configs/sim/scale.yaml`` (cheap scripted policy, the real runtime, channel, validation, and the
memory transport with the real sharded layout and bounded reads of ``protocol.layout``) for a few rounds; after
``--warmup`` rounds it reports, per node per learner step, the bytes the node read from the network (index entries
plus new records), the new records it fetched and the CPU seconds it spent (generate, publish, poll + validate +
re-score, sample, train). It also measures how many of the other nodes fetched a record within k rounds of its
publication and compares that with the arithmetic of ``protocol/SPEC.md`` 7.5 (``protocol.layout.expected_reach``).
Target: per-node cost at N = 10,000 at most 1.5x the cost at N = 10.

    python benchmarks/systems/b5_scale.py            # N = 10, 100, 1000, 10000
    python benchmarks/systems/b5_scale.py --quick    # N = 5, 40 (a smoke run for the tests)

Writes ``benchmarks/results/b5_scale.md`` (or ``--out``) with machine info and the date.
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


def live_polls(window_seconds: float, fetch_past_windows: int, round_seconds: float) -> int:
    """Polls (one per round) during which a record is still in the polled windows: it is published at a uniform
    time inside its window and polled until ``fetch_past_windows`` windows after it end (rounded)."""
    return max(1, round((fetch_past_windows + 0.5) * window_seconds / round_seconds))


def measure(n: int, rounds: int, warmup: int, workdir: Path) -> dict:
    """Run ``n`` scripted nodes for ``rounds`` rounds; steady-state per-node-step costs after ``warmup`` rounds."""
    from protocol.layout import ShardParams, expected_reach
    from sim.config import load_sim_config
    from sim.inprocess import protocol_config, run_seed

    cfg = load_sim_config(str(ROOT / "configs" / "sim" / "scale.yaml"), [f"nodes={n}", f"steps={rounds}"])
    t0 = time.perf_counter()

    def progress(done: int) -> None:  # one line per round, so a run in the background shows where it is
        print(f"N={n}: round {done}/{rounds}, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    res = asyncio.run(
        run_seed(
            cfg,
            cfg.configurations[0].name,
            cfg.seeds[0],
            workdir / f"n{n}",
            on_step=progress,
            track_reach=True,
            reach_round=warmup,
        )
    )
    wall = time.perf_counter() - t0
    before = res.rounds[warmup - 1] if warmup > 0 else {"cpu_s": 0.0, "bytes_fetched": 0, "records_fetched": 0}
    after = res.rounds[-1]
    steps = sum(r["steps"] for r in res.rounds[warmup:])
    pcfg = protocol_config(cfg.node_config(cfg.configurations[0].name, 0, cfg.seeds[0]))
    params = ShardParams.from_config(pcfg)
    live = live_polls(pcfg.window_seconds, pcfg.fetch_past_windows, cfg.round_seconds)
    predicted = {k: expected_reach(n, params, k, live_polls=live) for k in res.reach}
    return {
        "n": n,
        "rounds": rounds,
        "steps": steps,
        "bytes_per_step": (after["bytes_fetched"] - before["bytes_fetched"]) / steps,
        "records_per_step": (after["records_fetched"] - before["records_fetched"]) / steps,
        "cpu_ms_per_step": 1000 * (after["cpu_s"] - before["cpu_s"]) / steps,
        "reach": res.reach,
        "predicted": predicted,
        "level": params.level_for(n),
        "wall_s": wall,
    }


def render(rows: list[dict], quick: bool, warmup: int) -> str:
    base = rows[0]
    lines = [
        "# B5 scale: per-node cost vs swarm size (scripted policy, in-process, sharded memory transport)",
        "",
        f"Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Machine: {machine_info(with_torch=False)}  ",
        f"Mode: {'quick' if quick else 'full'}; config `configs/sim/scale.yaml` (protocol defaults: 1 shard per "
        "window per poll, 12 senders read whole, 10 records per poll of which 4 for unknown senders, 6 followed); "
        f"costs averaged over the rounds after {warmup} warm-up rounds. Target: per-node cost at the largest N "
        "<= 1.5x the cost at the smallest.  ",
        "Bytes = index entries + new records read from the network per node per step; records = new records "
        "fetched; CPU = the node's whole step (generate, publish, poll, validate, re-score, sample, train).",
        "",
        "| N | level read | rounds | bytes / node / step | records / node / step | CPU ms / node / step "
        "| bytes ratio | records ratio | CPU ratio | wall s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']} | {r['level']} | {r['rounds']} | {r['bytes_per_step']:.0f} | {r['records_per_step']:.1f} "
            f"| {r['cpu_ms_per_step']:.2f} | {r['bytes_per_step'] / base['bytes_per_step']:.2f} "
            f"| {r['records_per_step'] / base['records_per_step']:.2f} "
            f"| {r['cpu_ms_per_step'] / base['cpu_ms_per_step']:.2f} | {r['wall_s']:.0f} |"
        )
    last = rows[-1]
    ratios = [
        last["bytes_per_step"] / base["bytes_per_step"],
        last["records_per_step"] / base["records_per_step"],
        last["cpu_ms_per_step"] / base["cpu_ms_per_step"],
    ]
    flat = max(ratios) <= 1.5
    lines += [
        "",
        f"Result: {'PASS' if flat else 'FAIL'} -- worst per-node cost ratio N={last['n']} / N={base['n']}: "
        f"{max(ratios):.2f}x (target <= 1.5x).",
        "",
        "## Reach: share of the other nodes that fetched a record within k rounds (measured / SPEC 7.5 arithmetic)",
        "",
        "| N | " + " | ".join(f"k={k}" for k in sorted(rows[0]["reach"])) + " |",
        "|---:|" + "---:|" * len(rows[0]["reach"]),
    ]
    for r in rows:
        cells = [
            f"{r['reach'][k]:.4f} / {r['predicted'][k]:.4f}" if k in r["reach"] else "-"
            for k in sorted(rows[0]["reach"])
        ]
        lines.append(f"| {r['n']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Every node fetches a bounded sample, so a record reaches a bounded number of nodes per round (about its",
        "followers plus the budget's share of random readers), not a fixed share of the swarm: up to 12 senders a",
        "swarm is read whole every poll; beyond that the share falls as 1/N while each node still gets a full batch.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = parser(__doc__.split("\n\n")[0], "N = 5 and 40, 4 rounds (a smoke run)", RESULTS / "b5_scale.md")
    ap.add_argument("--sizes", type=int, nargs="+", help="swarm sizes (default 10 100 1000 10000)")
    ap.add_argument("--warmup", type=int, default=2, help="rounds excluded from the averages")
    ap.add_argument("--rounds", type=int, help="rounds per size (default 6; 5 for N >= 10000)")
    args = ap.parse_args()
    sizes = args.sizes or ([5, 40] if args.quick else [10, 100, 1000, 10000])
    rows = []
    with tempfile.TemporaryDirectory(prefix="b5-") as tmp:
        for n in sizes:
            rounds = args.rounds or (4 if args.quick else 5 if n >= 10000 else 6)
            rows.append(measure(n, rounds, min(args.warmup, rounds - 1), Path(tmp)))
            print(f"N={n}: {rows[-1]}", file=sys.stderr, flush=True)
    text = render(rows, args.quick, args.warmup)
    return write_table(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
