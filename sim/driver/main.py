"""``swarm-sim experiment CONFIG``: run what a registered experiment is missing, pair by pair, then write its report.

Flow: the YAML (with ``--quick`` and ``--set``) -> its registration hash -> refuse if the existing result JSON was
made under another registration (unless an amendment names it) -> the shared start (if any) -> every (arm, seed)
pair not finished (a per-seed experiment evaluates each seed's start first), each rewriting the report as it
lands -> the report (``<results>.md`` / ``.json`` / ``.png``).
``--analyze`` only re-reads; a result JSON alone (no run directory) re-analyses to the same numbers, and
``--legacy OLD.json`` reads a pre-driver result in (``sim.driver.legacy``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from sim.driver import analysis, pairs, provenance, report
from sim.driver.start import run_start, seed_start, seed_starts_on_disk, shared_start, start_key
from sim.registration import registration_hash


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="swarm-sim experiment", description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path, help="a registered experiment (configs/sim/*.yaml with registration:)")
    ap.add_argument("--seeds", default=None, help="seeds to run now, e.g. 0-9 or 0,2,5 (default: the registered)")
    ap.add_argument("--workers", type=int, default=None, help="(arm, seed) pairs at once (default: the YAML's)")
    ap.add_argument("--only", default="", help="comma-separated arms to run (the report reads every finished one)")
    ap.add_argument("--work", type=Path, default=None, help="run directory (default runs/<results>)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="where the report goes")
    ap.add_argument("--set", action="append", default=[], help="experiment override, e.g. steps=20")
    ap.add_argument("--quick", action="store_true", help="the YAML's quick overrides (seconds; a test)")
    ap.add_argument("--analyze", action="store_true", help="only re-read the runs and the result JSON")
    rebuilt = ("per-seed starts: where this machine builds another warm start than a seed's saved one, retire that "
               "seed's finished pairs (kept in the JSON's 'retired') and run every arm of it again")  # fmt: skip
    ap.add_argument("--restart-rebuilt", action="store_true", help=rebuilt)
    ap.add_argument("--legacy", type=Path, default=None, help="with --analyze: a pre-driver result JSON to read in")
    args = ap.parse_args(argv)
    args.command = "swarm-sim experiment " + " ".join(sys.argv[1:] if argv is None else argv)
    return args


def load(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The validated experiment and the mapping its registration hash is computed on."""
    from protocol.config import _set_path, parse_override, read_yaml, validate_config
    from sim.config import SimConfig, apply_quick
    from sim.driver.stats import parse_seeds

    mapping = read_yaml(args.config)
    mapping = apply_quick(mapping) if args.quick else mapping
    for text in args.set:
        _set_path(mapping, *parse_override(text))
    sim = validate_config(SimConfig, mapping, str(args.config))
    if sim.registration is None:
        raise SystemExit(f"{args.config} has no registration: block (see docs/development.md)")
    seeds = parse_seeds(args.seeds) if args.seeds else sim.registration.seeds
    update: dict[str, Any] = {"seeds": seeds} | ({"workers": args.workers} if args.workers else {})
    return sim.model_copy(update=update), mapping


def main(argv: list[str] | None = None) -> int:
    from sim.driver.metrics import check_hooks

    args = parse_args(argv)
    sim, mapping = load(args)
    reg = sim.registration
    check_hooks(reg)
    stem = reg.results + ("_quick" if args.quick else "")
    out_json = args.out / f"{stem}.json"
    old = json.loads(out_json.read_text()) if out_json.is_file() else None
    h = registration_hash(mapping)
    provenance.check_results(old, reg, h, out_json)
    root = args.config.resolve().parent
    prov: dict[str, Any] = {"hash": h, "config": str(args.config)}
    prov["registered"] = provenance.registered_at(reg, args.config.resolve(), h) if not args.quick else None
    settings = pairs.arm_settings(sim)
    keys = {arm: pairs.settings_key(s) for arm, s in settings.items()}
    saved = pairs.saved_pairs(old, settings, out_json.name, analyze=args.analyze)
    if args.analyze:  # re-read pairs keep the keys and settings they were made under
        ran = (old or {}).get("arm_keys", {})
        keys = {**keys, **ran}
        # an arm the old JSON has no settings for (added by amendment, first written by a re-read) takes today's
        # only where they are provably the ones it ran with: the key it recorded is today's
        now = {arm: s for arm, s in settings.items() if ran.get(arm) == pairs.settings_key(s)}
        settings = {**now, **(old or {}).get("arm_settings", {})}
    if args.legacy:  # made by another program: a key no run matches, so a run never reuses them
        if not args.analyze:
            raise SystemExit("--legacy reads results in; it runs nothing: add --analyze")
        from sim.driver.legacy import import_pairs

        made = (provenance.git(args.legacy.resolve().parent, "log", "--diff-filter=A", "--format=%h %cs", "--",
                               args.legacy.name) or "? ?").splitlines()[-1].split()  # fmt: skip
        imported = import_pairs(json.loads(args.legacy.read_text()), sim)
        for seeds in imported.values():
            for rec in seeds.values():
                rec.update(commit=made[0], ran=made[1])  # the commit that first added the old JSON
        saved = {**saved, **imported}
        keys = {**keys, **{arm: f"legacy:{args.legacy.name}" for arm in imported}}
    start = (old or {}).get("shared_start") if shared_start(sim) else None
    start = start if start and (args.analyze or start.get("key") == start_key(sim)) else None
    # per-seed starts: seed -> its start; a run checks each against the models it builds before reusing it
    seed_starts = {int(k): v for k, v in (old or {}).get("seed_starts", {}).items()} if seed_start(sim) else None
    retired: dict[str, list[dict[str, Any]]] = dict((old or {}).get("retired", {}))  # seed -> retirements
    work = args.work or Path("runs") / stem
    if not args.analyze:
        if not args.quick and prov["registered"] is None:
            raise SystemExit(f"{args.config}: no commit holds this registration; commit it before its first run")
        work.mkdir(parents=True, exist_ok=True)
        if seed_starts is not None:  # starts an interrupted run left on disk: its finished pairs' step 0 in reports
            seed_starts.update(seed_starts_on_disk(sim, work, seed_starts))
        arms = [a for a in reg.arms if not args.only or a in args.only.split(",")]
        t0 = time.perf_counter()
        arm_sets = (keys, settings)
        report_now = lambda: write(work, sim, args, prov, arm_sets, saved, start, stem, seed_starts, retired)  # noqa: E731
        if shared_start(sim):
            start = run_start(sim, work, start)
            report_now()  # the start (its digests) is kept from now on
        have = {(a, k) for a, seeds in saved.items() for k in seeds}
        meta = {"commit": provenance.head(root), "registration": h}
        retire = pairs.Retire(saved, retired) if args.restart_rebuilt else None
        pairs.run_pending(sim, work, arms, have, meta, after_each=report_now, seed_starts=seed_starts, retire=retire)
        print(f"ran in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    elif start is None and shared_start(sim) and (work / "stock" / "node0" / "eval.jsonl").is_file():
        start = run_start(sim, work, None, digests=False)  # finished evaluations on disk: read them
    elif seed_starts is not None:  # per-seed starts a run finished but has not kept in the JSON yet (--workers N)
        seed_starts.update(seed_starts_on_disk(sim, work, seed_starts))
    return write(work, sim, args, prov, (keys, settings), saved, start, stem, seed_starts, retired)


def write(work: Path, sim: Any, args: argparse.Namespace, prov: dict[str, Any],
          arms: tuple[dict[str, str], dict[str, Any]], saved: pairs.Data, start: dict[str, Any] | None,
          stem: str, seed_starts: dict[int, dict[str, Any]] | None = None,
          retired: dict[str, list[dict[str, Any]]] | None = None) -> int:  # fmt: skip
    """Read every finished pair (on disk, else saved), analyse, and write the report; 1 when there is nothing."""
    from sim.driver.machine import machine_info

    reg = sim.registration
    data = pairs.collect(work, sim, saved, start, seed_starts)
    if not data and start is None and not seed_starts:
        print("no finished pairs to report", file=sys.stderr)
        return 1
    readout = str(sim.steps if reg.readout == "final" else reg.readout)
    result: dict[str, Any] = {"name": sim.name, "setting": reg.setting, **analysis.analyse(data, reg, readout)}
    result["baseline"] = analysis.baseline(data, reg, readout) if data else None
    out_json = args.out / f"{stem}.json"
    prov = {**prov, "first_result": provenance.first_result(data, out_json)}
    lines = report.header(sim, reg, prov, machine_info(), args.command)
    lines += report.stock_lines(start, sim) if start else []
    lines += report.tables(result, reg) if data else ["No (arm, seed) pair has finished yet.", ""]
    lines += report.retired_lines(retired) if retired else []
    text = "\n".join(lines)
    args.out.mkdir(parents=True, exist_ok=True)
    if data:
        png = report.plot(data, reg, sim.name, args.out / f"{stem}.png")
        text += f"\n![{reg.primary} over steps]({png.name})\n"
    reading = args.out / f"{stem}_reading.md"  # a person's reading of the numbers, kept across rewrites
    if reading.is_file():
        text += "\n" + reading.read_text()
    result["registration"] = {**prov, "amendments": [a.model_dump(mode="json") for a in reg.amendments]}
    result["pairs"] = {a: {str(k): v for k, v in d.items()} for a, d in data.items()}
    keys, settings = arms
    result["arm_keys"] = {arm: keys[arm] for arm in data}
    if settings:  # what the keys hash, so a later run can say what changed (results from before it have none)
        result["arm_settings"] = {arm: settings[arm] for arm in data if arm in settings}
    if start:
        result["shared_start"] = start
    if seed_starts:  # each seed's start (per-seed warm starts), evaluated once for its arms
        result["seed_starts"] = {str(k): v for k, v in sorted(seed_starts.items())}
    if retired:  # pairs whose seed's start another machine could not rebuild (--restart-rebuilt): history, not data
        result["retired"] = retired
    print(text)
    (args.out / f"{stem}.md").write_text(text)
    out_json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
