"""The shared start: when every seed begins from the same models (``eval.at_start: false``), their step-0
evaluation runs once for every pair, beside the stock model (the configured model without its warm start) on the
same items at the same token budget, and is kept in the result JSON. A later session that rebuilds the models
checks them against it (weight digests, or the evaluation itself) before pairing new pairs with finished ones.

The per-seed start: when the warm start is drawn per seed (``registration.per_seed``), every arm of one seed still
starts from the same models, so each seed's step-0 evaluation runs once for all its arms (kept in the JSON by seed,
with its digests) and the seed's pairs run with their own start evaluation off. An arm whose initial models or
evaluation differ from the first configuration's evaluates its own start, as before.

Imports torch and the node only inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from sim.config import SimConfig
from sim.driver.machine import cpu_model
from sim.driver.records import pair_record, read_evals
from sim.initial import eval_key, evaluate_initial


def shared_start(sim: SimConfig) -> bool:
    """Whether the experiment evaluates its initial models once for every pair (``eval.at_start: false``)."""
    return not sim.node_config(sim.configurations[0].name, 0, sim.seeds[0]).eval.at_start


def seed_start(sim: SimConfig) -> bool:
    """Whether each seed's initial models are evaluated once for all its arms (``per_seed``: drawn per seed)."""
    return bool(sim.registration and sim.registration.per_seed)


def start_key(sim: SimConfig, arm: str | None = None, seed: int | None = None) -> str:
    """What decides the start's numbers (of ``arm``, default the first configuration, in run ``seed``, default the
    first): every node's model and evaluation, and the tasks."""
    arm = sim.configurations[0].name if arm is None else arm
    seed = sim.seeds[0] if seed is None else seed
    parts = [eval_key(sim.node_config(arm, i, seed)) for i in range(sim.nodes)]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _evaluate_nodes(nodes: list[Any], run_dir: Path, done: dict[str, Path]) -> None:
    for i, cfg in enumerate(nodes):
        evaluate_initial(cfg, run_dir / f"node{i}", done)


def build_models(nodes: list[Any], procs: int) -> None:
    """Build the nodes' laboratory models that are not cached yet side by side, one process a recipe
    (:func:`sim.runner.build_model`, as the pairs' own models are built), before a start is evaluated from them. The
    laboratory build (its warm start, about 3.5 minutes) runs on one torch thread whatever the caller's setting, so
    it is bitwise the same in any process, and a seed whose nodes draw new warm starts waits for the slowest build
    instead of their sum. Only those: ``builtin:tiny``'s build and a ``model.warm_start`` run on the caller's threads,
    so they are left to loading, one by one, as are fewer than two builds or one process."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from node.model.lab import LAB_NAME
    from node.model.policy import builtin_cached, builtin_dir
    from sim.runner import build_model

    todo: dict[Path, dict[str, Any]] = {}  # one build a recipe: nodes of the same recipe share it
    for cfg in nodes:
        if cfg.model.name == LAB_NAME and cfg.model.warm_start is None and not builtin_cached(cfg.model):
            todo.setdefault(builtin_dir(cfg.model), cfg.model.model_dump(mode="json"))
    if procs < 2 or len(todo) < 2:
        return
    t0 = time.perf_counter()
    with ProcessPoolExecutor(min(procs, len(todo)), mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(build_model, todo.values(), [1] * len(todo)))
    print(f"built {len(todo)} models side by side in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)


def initial_digests(nodes: list[Any]) -> list[str]:
    """Each node's initial weights as the node loads them (built or warm-started here if not cached), hashed."""
    import torch

    from node.model.policy import load_policy

    out = []
    for cfg in nodes:
        model = load_policy(cfg.model).model
        h = hashlib.sha256()
        for name, t in sorted(model.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        out.append(h.hexdigest()[:16])
        del model
    return out


def _start_record(run_dir: Path, sim: SimConfig) -> dict[str, Any]:
    assert sim.registration is not None
    rec = pair_record(run_dir, sim.nodes, sim.registration)
    return {"record": rec["steps"]["0"], "per_node": rec["per_node"]["0"]}


class StartMismatch(SystemExit):
    """The initial models built here are not the ones a saved start was evaluated on (another machine's floating
    point builds another warm start from the same recipe): pairs run from them would not pair with the finished ones.
    Uncaught it stops the run with its message; ``--restart-rebuilt`` retires the seed's finished pairs instead."""


def checked_start(
    saved: dict[str, Any], nodes: list[Any], work: Path, sim: SimConfig, check_dir: str = "start-check"
) -> dict[str, Any]:
    """The saved shared start, once the initial models built here are known to be the ones it was evaluated on: the
    same weight digests, or (a start saved before digests were kept) the same step-0 evaluation, run again here.
    A different start would unpair every pair still to run from the finished ones, so it stops the run
    (:class:`StartMismatch`)."""
    digests = initial_digests(nodes)
    if saved.get("digests") == digests:
        return saved
    again = (
        "Run on the saved start's machine, start the experiment afresh (remove its result JSON), or, with per-seed "
        "starts, --restart-rebuilt (the seed's finished pairs are retired and every arm of it runs again)."
    )
    if saved.get("digests") is not None:
        raise StartMismatch(
            f"the initial models built here (weights {digests}, on {cpu_model()}) are not the ones the saved start "
            f"was evaluated on ({saved['digests']}, built on {saved.get('built_on') or 'an unrecorded processor'}): "
            f"pairs run now would not pair with the finished ones. {again}"
        )
    _evaluate_nodes(nodes, work / check_dir, {})
    record = _start_record(work / check_dir, sim)["record"]
    if record != saved["record"]:
        raise StartMismatch(
            f"the initial models built here evaluate to {record}, not the saved start's {saved['record']}: pairs run "
            f"now would not pair with the finished ones. {again}"
        )
    return {**saved, "digests": digests, "built_on": cpu_model()}  # the digests of this build, on this processor


def run_start(sim: SimConfig, work: Path, saved: dict[str, Any] | None, digests: bool = True) -> dict[str, Any]:
    """Evaluate the shared start and the stock model (or reuse the saved start when its key matches)."""
    import torch

    from node.cli.logs import setup_cli_logging

    setup_cli_logging("INFO")  # a warm start or a model conversion takes minutes: its progress lines show
    torch.set_num_threads(sim.workers * sim.torch_threads)
    arm = sim.configurations[0].name
    nodes = [sim.node_config(arm, i, sim.seeds[0]) for i in range(sim.nodes)]
    if digests:  # (without: --analyze, which reads the evaluations on disk and loads no model)
        build_models(nodes, sim.workers)
    if saved and saved.get("key") == start_key(sim):
        return checked_start(saved, nodes, work, sim)
    t0 = time.perf_counter()
    done: dict[str, Path] = {}
    _evaluate_nodes(nodes, work / "start", done)
    stock_cfg = nodes[0].model_copy(update={"model": nodes[0].model.model_copy(update={"warm_start": None})})
    evaluate_initial(stock_cfg, work / "stock" / "node0", done)
    print(f"shared start evaluated in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    stock = read_evals(work / "stock" / "node0")[0]
    return {
        "key": start_key(sim),
        "digests": initial_digests(nodes) if digests else None,
        "built_on": cpu_model() if digests else None,
        **_start_record(work / "start", sim),
        "stock": {fam: {k: f[k] for k in ("accuracy", "pass_at_8")} for fam, f in stock["families"].items()},
        "stock_model": nodes[0].model.name,
    }


def run_seed_start(sim: SimConfig, seed: int, work: Path, saved: dict[str, Any] | None) -> dict[str, Any]:
    """Evaluate run ``seed``'s start once for all its arms (``sim`` as run for the seed, its warm start drawn from
    it), or reuse the saved one when its key matches (or it has none: read from disk) and the models built here have
    its weights (or, saved without digests, evaluate to its record): otherwise :class:`StartMismatch`."""
    import torch

    from node.cli.logs import setup_cli_logging

    setup_cli_logging("INFO")
    torch.set_num_threads(sim.workers * sim.torch_threads)
    arm = sim.configurations[0].name
    nodes = [sim.node_config(arm, i, seed) for i in range(sim.nodes)]
    build_models(nodes, sim.workers)
    key = start_key(sim, arm, seed)
    # a start read from disk (seed_starts_on_disk) has no key: it is this seed's, and finished pairs may have run
    # from it, so it is checked like a keyed one, never evaluated afresh over them
    if saved and saved.get("key", key) == key:
        return {**checked_start(saved, nodes, work, sim, f"start-check/seed{seed}"), "key": key}
    t0 = time.perf_counter()
    _evaluate_nodes(nodes, work / "start" / f"seed{seed}", {})
    print(f"seed {seed}'s start evaluated in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    built = {"digests": initial_digests(nodes), "built_on": cpu_model()}  # the digests hold on that processor only
    return {"key": key, **built, **_start_record(work / "start" / f"seed{seed}", sim)}


def seed_starts_on_disk(sim: SimConfig, work: Path, have: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """The per-seed starts finished on disk (every node's step-0 evaluation under ``work/start/seed<k>``) that
    ``have`` does not hold: what ``--analyze`` pairs a seed's pairs with before a run has kept them in the JSON
    (read as recorded, without a key or digests: a later run that reaches the seed checks the models it builds against
    that record, :func:`run_seed_start`)."""
    out: dict[int, dict[str, Any]] = {}
    for d in sorted((work / "start").glob("seed*")):
        if not d.name[4:].isdigit() or int(d.name[4:]) in have:
            continue
        if all((d / f"node{i}" / "eval.jsonl").is_file() for i in range(sim.nodes)):
            out[int(d.name[4:])] = _start_record(d, sim)
    return out


def sharing_arms(sim: SimConfig, seed: int, arms: list[str]) -> list[str]:
    """The ``arms`` whose start in run ``seed`` is the first configuration's (same models, tasks and evaluation),
    less those whose nodes wait for peers (``runtime.wait_for_peers`` announces a node by its own start)."""
    key = start_key(sim, None, seed)
    waits = lambda a: any(sim.node_config(a, i, seed).runtime.wait_for_peers for i in range(sim.nodes))  # noqa: E731
    return [a for a in arms if start_key(sim, a, seed) == key and not waits(a)]
