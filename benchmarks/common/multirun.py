"""Shared by the real-process experiment drivers (B10, B6's real-model section): one experiment = a ``swarm-sim``
multiprocess configuration in a work directory, run as (configuration, seed) pairs of real ``swarm-node join``
processes, resumable and optionally side by side.

* :func:`prepare` writes ``experiment.yaml`` (refusing a work directory that holds another experiment, merging the
  seeds of one that holds this one) and ``roles.json`` (node index -> role and description);
* :func:`prebuild` builds every node's model once, before any node starts;
* :func:`run_pending` runs the pairs not finished yet, seed by seed;
* :func:`write_results` writes a report beside its data, keeping the hand-written reading of an earlier one;
  :func:`report_rows` keeps an earlier report's rows of runs the work directory no longer holds.

Imports the node and the simulator only inside the functions, so a report needs neither torch nor hivemind loaded.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

READING = "## Reading"


def write_results(out: Path, stem: str, text: str, data: dict[str, Any]) -> None:
    """Print a generated report and write it as ``<stem>.md``, with its raw data as ``<stem>.json``.

    A hand-written section that an earlier ``<stem>.md`` carries from a ``## Reading`` heading on (what the numbers
    mean, written after looking at the runs) is kept after the regenerated text, so re-running ``report`` as more
    seeds land does not erase it; the reading is the author's to update."""
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{stem}.md"
    old = md.read_text() if md.is_file() else ""
    at = old.find(f"\n{READING}")
    reading = old[at:] if at >= 0 else ""
    md.write_text(text.rstrip("\n") + "\n" + reading if reading else text)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1))


def read_evals(node_dir: Path, until: float = float("inf")) -> list[dict[str, Any]]:
    """A node's held-out evaluations (``eval.jsonl``) up to step ``until``, oldest first; [] when it has none."""
    path = node_dir / "eval.jsonl"
    if not path.is_file():
        return []
    evals = (json.loads(x) for x in path.read_text().splitlines() if x.strip())
    return [e for e in evals if e["step"] <= until]


def merge_experiments(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """One experiment holding both ``old``'s and ``new``'s runs: the same experiment with more seeds or more
    configurations (a configuration of the same name must be the same). ``ValueError`` naming what differs
    otherwise. Compared as JSON, so a mapping read back from a report's JSON (string keys) matches its YAML."""
    a, b = json.loads(json.dumps(old)), json.loads(json.dumps(new))
    grows = ("seeds", "configurations")
    configs = {c["name"]: c for c in a.get("configurations", [])}
    clash = [c["name"] for c in b.get("configurations", []) if configs.setdefault(c["name"], c) != c]
    if clash:
        raise ValueError(f"configuration {clash[0]!r} differs")
    if {k: v for k, v in a.items() if k not in grows} != {k: v for k, v in b.items() if k not in grows}:
        raise ValueError("another experiment")
    seeds = sorted(set(a.get("seeds", [])) | set(b.get("seeds", [])))
    return {**new, "seeds": seeds, "configurations": list(configs.values())}


def report_rows(
    work: Path, saved: Path, collect: Callable[[], tuple[dict[str, Any], list[dict[str, Any]]]], key: str = "config"
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The experiment and its rows for a report: ``collect()``'s (the work directory's runs) grown by the rows of an
    earlier report of the same experiment (``saved``, its JSON) for the (configuration, seed) pairs the work directory
    does not hold: runs done on another machine, or on this one before its work directory was lost (a fresh machine
    starts with none), stay in the report as more seeds land; with no work directory at all, the earlier report's
    runs. A report of another experiment is left out, with a message. ``key``: the rows' configuration field."""
    data = json.loads(saved.read_text()) if saved.is_file() else None
    if data is not None and not {"experiment", "rows"} <= set(data):
        print(
            f"not keeping the rows of {saved}: it is no report of this kind (no experiment and rows)", file=sys.stderr
        )
        data = None
    if (work / "experiment.yaml").is_file():
        mapping, rows = collect()
    elif data is not None:  # a fresh machine: the earlier report's runs only
        mapping, rows = data["experiment"], []
    else:
        script = Path(sys.argv[0]).name
        raise SystemExit(f"{work} holds no experiment (no experiment.yaml): run `{script} run` first")
    if data is None:
        return mapping, rows
    try:
        merged = merge_experiments(data["experiment"], mapping)
    except ValueError as e:
        print(f"not keeping the rows of {saved}: it holds {e}", file=sys.stderr)
        return mapping, rows
    have = {(r[key], r["seed"]) for r in rows}
    kept = [r for r in data["rows"] if (r[key], r["seed"]) not in have]
    if kept:
        pairs = sorted({(r[key], r["seed"]) for r in kept})
        print(f"kept from {saved.name} (not in the work directory): {pairs}", file=sys.stderr)
    return merged, rows + kept


def prepare(work: Path, mapping: dict[str, Any], roles: dict[str, list[str]]) -> Any:
    """Write the experiment (``mapping``, a ``swarm-sim`` configuration) and the nodes' roles to ``work``; returns
    the validated :class:`sim.config.SimConfig`. A work directory holding another experiment is refused; the same
    experiment with more seeds or more configurations (a configuration of the same name must be the same) grows."""
    import yaml

    from sim.config import SimConfig

    work.mkdir(parents=True, exist_ok=True)
    cfg_file = work / "experiment.yaml"
    if cfg_file.is_file():
        try:
            mapping = merge_experiments(yaml.safe_load(cfg_file.read_text()), mapping)
        except ValueError as e:
            raise SystemExit(f"{cfg_file} holds {e}: use another --work, or remove it to start over") from None
    cfg_file.write_text(yaml.safe_dump(mapping, sort_keys=False))
    (work / "roles.json").write_text(json.dumps(roles))
    return SimConfig.model_validate(mapping)


def roles_of(work: Path, nodes: int) -> dict[int, tuple[str, str]]:
    """Node index -> (role, description), from ``roles.json`` (``node<i>`` where it names none)."""
    path = work / "roles.json"
    known = {int(i): tuple(r) for i, r in json.loads(path.read_text()).items()} if path.is_file() else {}
    return {i: known.get(i, (f"node{i}", "")) for i in range(nodes)}


def peer_names(run_dir: Path, roles: dict[int, str]) -> dict[str, str]:
    """Peer id -> role, from each node's identity file in ``run_dir``."""
    from protocol.identity import Identity

    out = {}
    for i, role in roles.items():
        key = run_dir / f"node{i}" / "identity.key"
        if key.is_file():
            out[Identity.load(key).peer_id] = role
    return out


def done(run_dir: Path, nodes: int, steps: int) -> bool:
    """Whether every node of the run evaluated at its last step."""
    return all((e := read_evals(run_dir / f"node{i}")) and e[-1]["step"] >= steps for i in range(nodes))


def prebuild(sim: Any) -> None:
    """Build (or find cached) every node's model here, on all cores, before the nodes start: inside a node a warm
    start would run on the node's one thread and hold up the bootstrap past its start-up timeout, and runs side by
    side would each wait on one build. The models are freed again (a GPU's memory goes to the nodes)."""
    import gc

    import torch

    from node.heap import release_free_memory
    from node.model.policy import load_policy

    _interruptible()  # a build stopped by ``kill`` unwinds and removes its temporary directory
    seen = set()
    for config in sim.configurations:
        for index in range(sim.nodes):
            cfg = sim.node_config(config.name, index, sim.seeds[0])
            key = cfg.model.model_dump_json()
            if key in seen:
                continue
            seen.add(key)
            warm = cfg.model.warm_start
            what = f"its warm start ({warm.examples} examples)" if warm is not None else cfg.model.name
            print(f"node {index}: building or finding {what}", file=sys.stderr, flush=True)
            policy = load_policy(cfg.model)  # builds into the model cache, where the node's own load_policy finds it
            del policy
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    release_free_memory()  # a warm start built here would leave this process holding gigabytes the nodes lack


def _interruptible() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt here, so the nodes are stopped on the way out even when this driver
    was started in the background by a non-interactive shell (which starts it with SIGINT ignored) or is ended by
    ``timeout`` or ``kill``."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def run_pending(sim: Any, work: Path, configs: list[str], seeds: list[int], jobs: int = 1) -> None:
    """Run every (configuration, seed) pair whose nodes have not all evaluated at ``sim.steps``, seed by seed (a
    budget cut short still leaves every configuration of the first seeds); an interrupted pair resumes from its
    checkpoints. ``jobs`` > 1 runs pairs side by side (a GPU machine with cores to spare): each pair's nodes find
    each other only through their own bootstrap, so runs do not mix. A failed pair (a node's crash, a GPU out of
    memory) stops its own nodes only: the other pairs run on, and the failures are raised together at the end, so one
    dead node does not throw away its siblings' progress (on a lent GPU, 8 pairs at steps 10-30). An interrupt
    (Ctrl-C, or SIGINT from ``timeout -s INT``) stops every running pair's nodes and starts no more."""
    from sim.multiproc import MultiprocessError, run_seed_multiprocess

    _interruptible()
    pending = []
    for seed in seeds:
        for name in configs:
            if done(work / name / f"seed{seed}", sim.nodes, sim.steps):
                print(f"{name} seed {seed}: done", file=sys.stderr)
            else:
                pending.append((name, seed))
    stop = threading.Event()
    failed: list[str] = []

    def check(_: int) -> None:
        if stop.is_set():
            raise MultiprocessError("stopped: the driver was interrupted")

    def one(pair: tuple[str, int]) -> None:
        name, seed = pair
        if stop.is_set():
            return
        print(f"{name} seed {seed}: running {sim.nodes} nodes to step {sim.steps}", file=sys.stderr, flush=True)
        try:
            run_seed_multiprocess(sim, name, seed, work, on_step=check)  # its finally stops the nodes
        except MultiprocessError as e:
            if stop.is_set():
                raise
            failed.append(f"{name} seed {seed}: {e}")
            print(f"{name} seed {seed}: failed ({e}); the other pairs go on", file=sys.stderr, flush=True)
            return
        print(f"{name} seed {seed}: finished", file=sys.stderr, flush=True)

    if jobs <= 1:
        for pair in pending:
            one(pair)
    else:
        pool = ThreadPoolExecutor(max_workers=jobs)
        futures = [pool.submit(one, pair) for pair in pending]
        try:
            for future in as_completed(futures):
                future.result()
        except BaseException:
            stop.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    if failed:
        raise MultiprocessError(
            f"{len(failed)} of {len(pending)} pairs failed (rerun to resume them): " + "; ".join(failed)
        )


def experiment_cli(doc: str, work: Path, results: Path, quick_help: str, families: list[str]) -> tuple[Any, Any, Any]:
    """The ``run`` / ``report`` command line shared by the real-process drivers: ``(parser, run, report)``, to which
    a driver adds its own options. Both take ``--work``, ``--out`` and ``--quick``; ``report`` takes ``--stem`` and
    ``--machine``; ``run`` the family, the format warm start, the engine and device, ``--jobs``, the seeds and the
    budget (steps, evaluation cadence and size, completion length)."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "report"):
        p = sub.add_parser(name)
        p.add_argument("--work", type=Path, default=work)
        p.add_argument("--out", type=Path, default=results)
        p.add_argument("--quick", action="store_true", help=quick_help)
    rep = sub.choices["report"]
    rep.add_argument("--stem", help="the results files' name (default: by experiment)")
    rep.add_argument("--machine", help="where the runs ran, when not here (runs fetched from a GPU)")
    r = sub.choices["run"]
    r.add_argument("--family", choices=sorted(families), default="basic_arithmetic")
    r.add_argument("--format-family", choices=sorted(families), default="spell_backward")
    r.add_argument("--format-examples", type=int, default=512, help="the format warm start's examples")
    r.add_argument("--engine", choices=["vllm", "transformers"], default="vllm")
    r.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="the SmolLM2 nodes' device")
    r.add_argument("--jobs", type=int, default=1, help="(configuration, seed) pairs run at once")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--steps", type=int, default=60)
    r.add_argument("--eval-every", type=int, default=20)
    r.add_argument("--items", type=int, default=48)
    r.add_argument("--max-new-tokens", type=int, default=64)
    return ap, r, rep
