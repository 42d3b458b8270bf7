"""B5 scale: per-node cost of the swarm as it grows, N = 10, 100, 1000 in-process nodes (scripted policy).

Each size runs ``configs/sim/scale.yaml`` (cheap scripted policy, the real runtime, channel, validation and
memory transport) for a few rounds; after ``--warmup`` rounds (the time windows fill up) it reports, per node
per learner step, the record bytes the node fetched from the network and the CPU seconds it spent (generate,
publish, sync = fetch + dedup + validate + re-score, sample, train). Target (BENCHMARKS.md): flat in N,
at most 1.5x from N = 10 to N = 1000.

    python benchmarks/b5_scale.py            # N = 10, 100, 1000
    python benchmarks/b5_scale.py --quick    # N = 5, 20 (a smoke run for the tests)

Writes ``benchmarks/results/b5_scale.md`` (or ``--out``) with machine info and the date.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import machine_info  # noqa: E402


def measure(n: int, rounds: int, warmup: int, workdir: Path, fetch_cap: int | None = None) -> dict[str, float]:
    """Run ``n`` scripted nodes for ``rounds`` rounds; steady-state per-node-step costs after ``warmup`` rounds."""
    from sim.config import load_sim_config
    from sim.inprocess import run_seed

    sets = [f"nodes={n}", f"steps={rounds}", f"network.fetch_cap={'null' if fetch_cap is None else fetch_cap}"]
    cfg = load_sim_config(str(ROOT / "configs" / "sim" / "scale.yaml"), sets)
    t0 = time.perf_counter()
    res = asyncio.run(run_seed(cfg, cfg.configurations[0].name, cfg.seeds[0], workdir / f"n{n}-{fetch_cap}"))
    wall = time.perf_counter() - t0
    before = res.rounds[warmup - 1] if warmup > 0 else {"cpu_s": 0.0, "bytes_fetched": 0, "records_fetched": 0}
    after = res.rounds[-1]
    steps = sum(r["steps"] for r in res.rounds[warmup:])
    return {
        "n": n,
        "fetch_cap": fetch_cap,
        "rounds": rounds,
        "steps": steps,
        "bytes_per_step": (after["bytes_fetched"] - before["bytes_fetched"]) / steps,
        "records_per_step": (after["records_fetched"] - before["records_fetched"]) / steps,
        "cpu_ms_per_step": 1000 * (after["cpu_s"] - before["cpu_s"]) / steps,
        "wall_s": wall,
    }


def render(rows: list[dict], quick: bool, warmup: int) -> str:
    lines = [
        "# B5 scale: per-node cost vs swarm size (scripted policy, in-process, memory transport)",
        "",
        f"Date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}  ",
        f"Machine: {machine_info(with_torch=False)}  ",
        f"Mode: {'quick' if quick else 'full'}; config `configs/sim/scale.yaml`; costs averaged over the rounds "
        f"after {warmup} warm-up rounds. Target: per-node cost at the largest N <= 1.5x the cost at the smallest.",
        "`fetch cap` = the simulator's model of a bounded fetch (`network.fetch_cap`: a poll returns at most that many",
        "records, a random subset); `-` = the protocol as implemented (a poll returns every recent record).",
        "",
        "| fetch cap | N | rounds | bytes fetched / node / step | records fetched / node / step | CPU ms / node / step "
        "| bytes ratio | CPU ratio | wall s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for cap in dict.fromkeys(r["fetch_cap"] for r in rows):
        group = [r for r in rows if r["fetch_cap"] == cap]
        base = group[0]
        for r in group:
            lines.append(
                f"| {cap or '-'} | {r['n']} | {r['rounds']} | {r['bytes_per_step']:.0f} | {r['records_per_step']:.1f} "
                f"| {r['cpu_ms_per_step']:.2f} | {r['bytes_per_step'] / base['bytes_per_step']:.2f} "
                f"| {r['cpu_ms_per_step'] / base['cpu_ms_per_step']:.2f} | {r['wall_s']:.1f} |"
            )
        last = group[-1]
        flat = (
            last["bytes_per_step"] / base["bytes_per_step"] <= 1.5
            and last["cpu_ms_per_step"] / base["cpu_ms_per_step"] <= 1.5
        )
        verdicts.append((cap, flat))
    lines.append("")
    for cap, flat in verdicts:
        what = "the protocol as implemented" if cap is None else f"with fetch cap {cap}"
        lines.append(
            f"Result ({what}): {'PASS' if flat else 'FAIL'} -- per-node cost {'flat' if flat else 'grows'} in N.  "
        )
    if any(cap is not None for cap, _ in verdicts):
        lines += [
            "",
            "With a fetch cap the bytes are flat; the CPU that still grows is the in-process memory network's own",
            "fetch (counted as the polling node's CPU): `MemoryNetwork._fetch` scans every stored entry of the",
            "requested windows and checks reachability for each (O(N) per poll; ~1M `can_reach` calls for 400 nodes",
            "x 3 rounds in a profile). A sharded or capped transport would read only the shards it asks for.",
        ]
    if any(cap is None and not flat for cap, flat in verdicts):
        lines += [
            "",
            "Why: every poll fetches every record stored under the recent window keys, from every sender, and the",
            "channel hashes (and, for new ones, validates and re-scores) all of them, so a node's cost per step grows",
            "linearly with the number of publishers. Fix: bound the fetch -- shard each window key by",
            "hash(sender) mod S and have each poll read a few random shards (or ask the transport for at most K",
            "records/senders per window), so a node sees a bounded random sample of the swarm per step.",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 5 and 20, 3 rounds (a smoke run)")
    ap.add_argument("--sizes", type=int, nargs="+", help="swarm sizes (default 10 100 1000)")
    ap.add_argument("--rounds", type=int, help="rounds per size (default 6; 4 for N >= 1000)")
    ap.add_argument("--warmup", type=int, default=2, help="rounds excluded from the averages")
    ap.add_argument("--fetch-caps", default="none,8", help="comma list of fetch caps to compare ('none' = off)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "b5_scale.md")
    args = ap.parse_args()
    sizes = args.sizes or ([5, 20] if args.quick else [10, 100, 1000])
    caps = [None if c.strip() in ("none", "") else int(c) for c in args.fetch_caps.split(",")]
    if args.quick:
        caps = [None if c is None else min(c, 8) for c in caps]
    rows = []
    with tempfile.TemporaryDirectory(prefix="b5-") as tmp:
        for cap in caps:
            for n in sizes:
                rounds = args.rounds or (3 if args.quick or n >= 1000 else 6)
                rows.append(measure(n, rounds, min(args.warmup, rounds - 1), Path(tmp), cap))
                print(f"N={n} fetch_cap={cap}: {rows[-1]}", file=sys.stderr, flush=True)
    text = render(rows, args.quick, min(args.warmup, 2))
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
