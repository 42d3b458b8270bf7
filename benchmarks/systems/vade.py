"""VADE vs uniform prompt selection in the in-process simulator: reward per generated token, informative groups.

Runs every configuration of ``configs/sim/vade.yaml`` (uniform, VADE, VADE + DART) for every seed through
``sim.inprocess.run_seed`` and reads each node's ``rollouts.jsonl`` (own groups: rewards) and ``metrics.jsonl``
(generated tokens). Reported per configuration, summed over nodes and steps, median over seeds:

* reward per generated token = sum of own completions' rewards / own generated tokens,
* informative share = own groups whose rewards are not all equal (non-zero GRPO advantage) / own groups,
* reward per step in the last quarter of the run (mean over nodes): how far the policy got.

The ratio column is against ``uniform`` in the same run.

    python benchmarks/systems/vade.py            # full: the YAML as written
    python benchmarks/systems/vade.py --quick    # smoke run (the YAML's quick section)

Writes ``benchmarks/results/vade.md`` (or ``--out``) with machine info and the date.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.systems.harness import RESULTS, parser, report  # noqa: E402


def summarize(run_dir: Path) -> dict[str, float]:
    """Totals over the nodes of one (configuration, seed) run directory."""
    reward = tokens = groups = informative = 0.0
    late: list[float] = []
    for node_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        rows = [json.loads(x) for x in (node_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        tokens += sum(r.get("gen_tokens", 0) for r in rows)
        steps = len(rows)
        late += [r["reward_mean"] for r in rows[steps - max(1, steps // 4) :]]
        for line in (node_dir / "rollouts.jsonl").read_text().splitlines():
            g = json.loads(line)
            reward += sum(g["rewards"])
            groups += 1
            informative += len(set(g["rewards"])) > 1
    return {
        "reward_per_token": reward / tokens if tokens else 0.0,
        "informative": informative / groups if groups else 0.0,
        "late_reward": statistics.fmean(late) if late else 0.0,
        "tokens": tokens,
    }


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__.split("\n")[0], "smoke run (the config's quick section)", RESULTS, "directory of vade.md")
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "sim" / "vade.yaml")
    ap.add_argument("--runs", type=Path, default=None, help="where run directories go (default: a temp dir)")
    args = ap.parse_args(argv)

    from sim.config import load_sim_config
    from sim.inprocess import run_seed
    from sim.report.progress import StepProgress

    sim = load_sim_config(str(args.config), quick=args.quick)
    runs = args.runs or Path(tempfile.mkdtemp(prefix="vade-"))
    names = [v.name for v in sim.configurations]
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for seed in sim.seeds:
        for name in names:
            bar = StepProgress(f"{name} seed {seed}", sim.steps)
            res = asyncio.run(run_seed(sim, name, seed, runs, on_step=bar.update))
            bar.done()
            results[name].append(summarize(res.run_dir))

    med = statistics.median
    base = med(r["reward_per_token"] for r in results[names[0]]) or 1e-12
    header = (
        "| configuration | reward / generated token | vs uniform | informative groups | reward/step, last quarter "
        "| generated tokens |\n|---|---:|---:|---:|---:|---:|"
    )
    lines = []
    for n in names:
        rs = results[n]
        rpt = med(r["reward_per_token"] for r in rs)
        lines.append(
            f"| {n} | {rpt:.5f} | {rpt / base:.2f}x | {med(r['informative'] for r in rs):.3f} "
            f"| {med(r['late_reward'] for r in rs):.3f} | {med(r['tokens'] for r in rs):.0f} |"
        )
    table = "\n".join([header, *lines])
    print(table)
    config = args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config
    facts = [
        f"config: {config}{' (quick)' if args.quick else ''}; policy {sim.policy}, {sim.nodes} nodes, "
        f"{sim.steps} steps, seeds {list(sim.seeds)}; medians over seeds, sums over nodes"
    ]
    return report(args.out / "vade.md", "VADE vs uniform prompt selection (simulator)", facts, table)


if __name__ == "__main__":
    sys.exit(main())
