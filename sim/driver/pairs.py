"""Running a registered experiment pair by pair, and resuming it.

An (arm, seed) pair is finished when every node evaluated at the last step; the result JSON keeps every finished
pair's record, so a later session without the run directory re-reads it and runs only what is missing. A pair
saved under another arm key (the arm's resolved settings changed, say a default) is not reused. In-process pairs
that did not finish start over (the simulator keeps no checkpoints); real-process pairs resume from their nodes'
checkpoints. With ``per_seed`` paths the experiment is rebuilt for each seed (its warm start drawn from the seed),
and each seed's start is evaluated once for all its arms before its pairs (``sim.driver.start``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.config import SimConfig
from sim.driver.records import pair_done, pair_record

Data = dict[str, dict[int, dict[str, Any]]]


def arm_settings(sim: SimConfig) -> dict[str, dict[str, Any]]:
    """What decides an arm's numbers, per arm: the experiment without its seed list, workers, registration and other
    arms; the arm's own settings; every node's resolved config without its seed (so a changed default counts)."""
    d = sim.model_dump(mode="json")
    arms = {c["name"]: c for c in d.pop("configurations")}
    for k in ("seeds", "workers", "registration"):
        d.pop(k, None)

    def nodes(arm: str) -> list[dict[str, Any]]:
        return [{**sim.node_config(arm, i, 0).model_dump(mode="json"), "seed": None} for i in range(sim.nodes)]

    return {name: {"experiment": d, "arm": arm, "nodes": nodes(name)} for name, arm in arms.items()}


def arm_keys(sim: SimConfig) -> dict[str, str]:
    """An arm's settings hashed: a saved pair is reused only under the same key (or one that differs by fields
    added since, :func:`saved_pairs`), and adding an arm keeps the others' pairs."""
    return {name: settings_key(s) for name, s in arm_settings(sim).items()}


def settings_key(s: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([s["experiment"], s["arm"], s["nodes"]], sort_keys=True).encode()).hexdigest()[:16]


def _flat(x: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted paths of the mappings in ``x`` (node lists by index); any other list is one value."""
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in _flat(val, f"{prefix}{key}.").items()}
    if prefix.endswith("nodes.") and isinstance(x, list):
        return {k: v for i, val in enumerate(x) for k, v in _flat(val, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): x}


def changes(then: dict[str, Any], now: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(fields added since, fields removed or changed) between two arm settings."""
    a, b = _flat(then), _flat(now)
    return [k for k in b if k not in a], [k for k in a if k not in b or a[k] != b[k]]


def saved_pairs(old: dict[str, Any] | None, now: dict[str, dict[str, Any]], name: str, analyze: bool = False) -> Data:
    """The finished pairs of an earlier result JSON whose arm settings are the ones resolved now. An arm whose
    settings differ only by fields added to the code since (at their defaults: a new option that changes nothing
    unless set) keeps its pairs, with a line naming them; one whose settings changed keeps none for a run, since new
    pairs would not pair with them. ``analyze`` keeps them all: re-reading results never needs the code they ran
    with."""
    old = old or {}
    out: Data = {}
    for arm, seeds in old.get("pairs", {}).items():
        then = old.get("arm_settings", {}).get(arm)
        added, changed = changes(then, now[arm]) if then is not None and arm in now else ([], ["(not recorded)"])
        if analyze or (arm in now and old.get("arm_keys", {}).get(arm) == settings_key(now[arm])):
            out[arm] = {int(k): v for k, v in seeds.items()}
        elif not changed:
            out[arm] = {int(k): v for k, v in seeds.items()}
            print(f"{name}: arm {arm}: fields added since its pairs ran, at their defaults, pairs kept: "
                  f"{', '.join(added[:8])}{' ...' if len(added) > 8 else ''}", file=sys.stderr)  # fmt: skip
        else:
            print(f"{name}: arm {arm} was another experiment (differs at {', '.join(changed[:8])}); its pairs are "
                  "not reused", file=sys.stderr)  # fmt: skip
    return out


def collect(work: Path, sim: SimConfig, saved: Data, start: dict[str, Any] | None,
            seed_starts: dict[int, dict[str, Any]] | None = None) -> Data:  # fmt: skip
    """arm -> seed -> record for every finished pair of the run's seeds: on disk (with the marker the driver wrote
    when it started the pair), else saved; and the saved pairs of the other registered seeds, so a run of some
    seeds (``--seeds``) keeps the others' in the JSON. A pair without a step-0 evaluation takes its seed's start
    (per-seed experiments) or the shared ``start``."""
    reg = sim.registration
    assert reg is not None
    data: Data = {}
    for arm in reg.arms:
        pairs = dict(saved.get(arm, {}))
        for seed_dir in sorted((work / arm).glob("seed*")):
            if seed_dir.is_dir() and pair_done(seed_dir, sim.nodes, sim.steps):
                marker = seed_dir.with_suffix(".pair.json")
                meta = json.loads(marker.read_text()) if marker.is_file() else {}
                pairs[int(seed_dir.name[4:])] = {**pair_record(seed_dir, sim.nodes, reg), **meta}
        for seed, rec in sorted(pairs.items()):
            if seed in sim.seeds or (seed in reg.seeds and seed in saved.get(arm, {})):
                first = (seed_starts or {}).get(seed, start)
                if "0" not in rec["steps"] and first is not None:
                    rec = {**rec, "steps": {"0": first["record"], **rec["steps"]}}
                    if "per_node" in rec and "per_node" in first:
                        rec["per_node"] = {"0": first["per_node"], **rec["per_node"]}
                if "0" not in rec["steps"]:  # finished, but its seed's start is not evaluated (yet): no gap to read
                    print(f"{arm} seed {seed}: finished, but its start is not evaluated yet; left out of this report",
                          file=sys.stderr)  # fmt: skip
                    continue
                data.setdefault(arm, {})[seed] = rec
    return data


def seed_sim(sim: SimConfig, seed: int) -> SimConfig:
    """The experiment as run for ``seed``: its ``per_seed`` paths set to the seed (the warm start drawn per seed)."""
    from protocol.config import _set_path

    paths = sim.registration.per_seed if sim.registration else []
    if not paths:
        return sim
    mapping = sim.model_dump(mode="json", exclude_unset=True)
    for path in paths:
        _set_path(mapping, path, seed)
    return SimConfig.model_validate(mapping)


def _minute() -> str:
    """Now (UTC) to the minute: when a pair was started or retired."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")


class Retire:
    """Pairs retired because their seed's start could not be rebuilt (``--restart-rebuilt``): taken out of
    ``saved`` (so they neither pair with new ones nor count) and kept, with the start they ran from and why, in
    ``retired`` (the result JSON's ``retired``: seed -> list of retirements)."""

    def __init__(self, saved: Data, retired: dict[str, list[dict[str, Any]]]):
        self.saved, self.retired = saved, retired

    def seed(self, seed: int, start: dict[str, Any] | None, reason: str) -> list[str]:
        """Retire every saved pair of ``seed``; the arms retired."""
        gone = {arm: pairs.pop(seed) for arm, pairs in self.saved.items() if seed in pairs}
        entry = {"when": _minute(), "reason": reason, "start": start, "pairs": gone}
        self.retired.setdefault(str(seed), []).append(entry)
        return sorted(gone)


def _kept(after_each: Callable[[], object], failed: list[tuple[str, int]]) -> Callable[[tuple[str, int]], None]:
    """``after_each`` as each of several side-by-side pairs finishes, best effort: a report that fails to write (a
    full disk, a plot) is said and retried after the next pair, not allowed to stop the pairs still running (the
    pool would wait for all of them before the error surfaced); ``failed`` collects the pairs it failed after."""

    def keep(pair: tuple[str, int]) -> None:
        try:
            after_each()
        except Exception as e:  # said, and retried after the next pair and once at the end
            failed.append(pair)
            print(f"{pair[0]} seed {pair[1]}: finished, but the report was not rewritten ({type(e).__name__}: {e}); "
                  "retried after the next pair", file=sys.stderr, flush=True)  # fmt: skip

    return keep


def run_pending(sim: SimConfig, work: Path, arms: list[str], have: set[tuple[str, int]], meta: dict[str, Any],
                after_each: Callable[[], object] | None = None,
                seed_starts: dict[int, dict[str, Any]] | None = None,
                retire: Retire | None = None) -> None:  # fmt: skip
    """Run every (arm, seed) pair not finished (on disk or in ``have``), seed by seed, writing a marker with
    ``meta`` (the commit and registration hash) beside each pair as it starts. With one worker ``after_each`` runs
    after each pair (the report is rewritten, so a session that ends mid-run keeps every finished pair); with
    several too, as each pair finishes while the others still run (a finished pair is one whose every node has its
    last evaluation, :func:`sim.driver.records.pair_done`; a pair in flight is not read).

    ``seed_starts`` (per-seed experiments: seed -> its start, updated here) makes each seed with pairs to run
    evaluate its start once, or reuse the one saved, before its pairs; ``after_each`` then runs, so the start is
    kept, and the pairs of arms that share it run with their own start evaluation off. A saved start the models
    built here do not reproduce stops the run (:class:`sim.driver.start.StartMismatch`), unless ``retire`` is given
    (``--restart-rebuilt``): then the seed's finished pairs are retired (:meth:`Retire.seed`), its start is evaluated
    anew and every arm of ``arms`` runs at that seed."""
    from sim.driver.start import StartMismatch, run_seed_start, sharing_arms
    from sim.initial import without_start_eval
    from sim.runner import run_experiment

    per_seed = bool(sim.registration and sim.registration.per_seed)

    def prepare(arm: str, seed: int) -> None:
        run_dir = work / arm / f"seed{seed}"
        if sim.mode == "inprocess":
            shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        stamp = {**meta, "ran": _minute()}
        run_dir.with_suffix(".pair.json").write_text(json.dumps(stamp))

    by_seed: dict[int, list[tuple[str, int]]] = {}  # one group unless the experiment is rebuilt per seed
    for seed in sim.seeds:
        for arm in arms:
            if (arm, seed) in have or pair_done(work / arm / f"seed{seed}", sim.nodes, sim.steps):
                continue
            prepare(arm, seed)
            by_seed.setdefault(seed if per_seed else 0, []).append((arm, seed))
    print(f"{sum(map(len, by_seed.values()))} pairs to run", file=sys.stderr, flush=True)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    for seed, pending in by_seed.items():
        s = seed_sim(sim, seed)
        if per_seed and seed_starts is not None:
            try:
                seed_starts[seed] = run_seed_start(s, seed, work, seed_starts.get(seed))
            except StartMismatch as e:
                if retire is None:
                    raise
                gone = retire.seed(seed, seed_starts.pop(seed, None), str(e))
                line = f"seed {seed}: its saved start is not what this machine builds; retired its finished pairs"
                gone_text = ", ".join(gone) or "no finished pair"
                print(f"{line} ({gone_text}); every arm of it runs again", file=sys.stderr, flush=True)
                seed_starts[seed] = run_seed_start(s, seed, work, None)
                for arm in arms:
                    if (arm, seed) not in pending:
                        prepare(arm, seed)
                        pending.append((arm, seed))
            if after_each is not None:
                after_each()
            shared = sharing_arms(s, seed, sorted({a for a, _ in pending}))
            s = without_start_eval(s, {a: list(range(s.nodes)) for a in shared})
        if s.workers > 1 or after_each is None:  # side by side: each pair is kept as it finishes, the others running
            failed: list[tuple[str, int]] = []
            run_experiment(s, work, progress=progress, pairs=pending,
                           on_pair=_kept(after_each, failed) if after_each is not None else None)  # fmt: skip
            # only _kept fills it; once more, unguarded: a report that cannot be written stops here
            if failed and after_each is not None:
                after_each()
            continue
        for pair in pending:
            run_experiment(s, work, progress=progress, pairs=[pair])
            after_each()
