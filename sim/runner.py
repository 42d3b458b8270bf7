"""Run a whole experiment: every configuration for every seed, in-process or as real processes.

In-process, identical initial nodes (the same model, tasks and evaluation in several configurations or seeds) have
their step-0 evaluation run once (``sim.initial``, under ``out/start/``) and written into each pair's node
directory; those nodes then skip their own. With ``workers > 1`` one pool of spawned processes does the builds, the
start evaluations and the pairs, and the pairs start seed by seed, heaviest first within a seed (``pair_cost``), so
the last pair to finish is a short one and no core idles at the end. Knows nothing about reports
(``sim.report.summary`` reads what the runs wrote).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.config import SimConfig

logger = logging.getLogger(__name__)


def run_experiment(
    sim: SimConfig,
    out: str | Path,
    progress: Callable[[str], None] | None = None,
    pairs: list[tuple[str, int]] | None = None,
    on_pair: Callable[[tuple[str, int]], object] | None = None,
) -> list[Any]:
    """Run all (configuration, seed) pairs of ``sim`` into ``out`` (or only ``pairs``, e.g. the unfinished ones of a
    resumed benchmark); returns the in-process results (or run dirs). ``on_pair`` runs in this process as each pair
    finishes (with several workers, while the others still run), e.g. to keep the finished ones in a report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[Any] = []
    from sim.report.progress import StepProgress

    todo = pairs if pairs is not None else [(v.name, seed) for v in sim.configurations for seed in sim.seeds]
    n_runs = len(todo)
    parallel = sim.mode == "inprocess" and sim.workers > 1 and n_runs > 1
    if parallel:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # Spawned (no inherited torch state), and one pool for everything: each worker imports torch once.
        with ProcessPoolExecutor(max_workers=sim.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            runs = _shared_starts(sim, out, todo, pool) if sim.policy == "real" else {}
            results.extend(_run_parallel(sim, out, progress, todo, pool, runs, on_pair))
        if sim.mnpo_game is not None:
            from sim.experiments.mnpo_game import run_mnpo_report

            run_mnpo_report(sim, out, progress)
        return results
    runs = _shared_starts(sim, out, todo, None) if sim.mode == "inprocess" and sim.policy == "real" else {}
    for name, seed in todo:
        t0 = time.perf_counter()
        # Per-step progress goes to stderr only when someone watches (``progress`` given: the CLI).
        label = f"[{len(results) + 1}/{n_runs}] {name} seed {seed}"
        bar = StepProgress(label, sim.steps) if progress is not None else None
        on_step = bar.update if bar is not None else None
        if sim.mode == "inprocess":
            from sim.inprocess import run_seed

            run = runs.get((name, seed), sim)
            results.append(asyncio.run(run_seed(run, name, seed, out, on_step=on_step)))
        else:
            from sim.multiproc import run_seed_multiprocess

            results.append(run_seed_multiprocess(sim, name, seed, out, on_step=on_step))
        line = f"{name} seed {seed}: {sim.nodes} nodes x {sim.steps} steps in {time.perf_counter() - t0:.1f}s"
        if bar is not None:
            bar.done(f"{label}: {sim.nodes} nodes x {sim.steps} steps in {time.perf_counter() - t0:.1f}s")
        else:
            logger.info(line)
        if on_pair is not None:
            on_pair((name, seed))
    if sim.mnpo_game is not None:
        from sim.experiments.mnpo_game import run_mnpo_report

        run_mnpo_report(sim, out, progress)
    return results


def pair_cost(sim: SimConfig, name: str, seed: int) -> int:
    """A (configuration, seed) pair's work, in completions a run generates or trains on: per node and step, its own
    and its peers' groups' rows (a guided node also rolls out on its peers' prompts), its label rows and its trace
    step's rows. Only the order matters: the parallel runner starts the heaviest pairs first (longest-processing-time
    scheduling)."""
    total = 0
    for i in range(sim.nodes):
        cfg = sim.node_config(name, i, seed)
        g, sapo = cfg.rollout.group_size, cfg.sapo
        rolled = sapo.local_groups + (sapo.external_groups if sapo.peer_advantage == "guided" else 0)
        labels = cfg.labels.per_step if cfg.labels.families else 0
        # the trace step's rows (learner.trace_batch, else this step's traces): full written working in a second
        # pass with its own optimiser, counted twice against a bare label row
        traces = 2 * (cfg.learner.trace_batch or g * sapo.trace_groups) if cfg.learner.trace_lr else 0
        total += sim.steps * (g * (rolled + sapo.local_groups + sapo.external_groups) + labels + traces)
    return total


def pair_order(sim: SimConfig, pairs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The order the parallel runner starts ``pairs`` in: seed by seed (an interrupted multi-seed run leaves whole
    seeds to analyse, paired), heaviest first within a seed; ties keep the configured order."""
    return sorted(pairs, key=lambda p: (p[1], -pair_cost(sim, *p)))


def _shared_starts(
    sim: SimConfig, out: Path, todo: list[tuple[str, int]], pool: Any | None
) -> dict[tuple[str, int], SimConfig]:
    """Evaluate once every initial node that more than one (configuration, seed) pair of ``todo`` starts from and
    evaluates (``eval.at_start``), write its step-0 line into each such pair's node directory, and return those
    pairs' experiment with the nodes' own start evaluation off (the numbers are the ones it would give: the
    evaluation is deterministic given the model, items and seed)."""
    from sim.initial import eval_key, evaluate_initial, start_record, without_start_eval

    users: dict[str, list[tuple[tuple[str, int], int]]] = {}
    cfgs: dict[str, Any] = {}
    for name, seed in todo:
        for i in range(sim.nodes):
            cfg = sim.node_config(name, i, seed)
            if cfg.eval.at_start:
                key = eval_key(cfg)
                cfgs.setdefault(key, cfg)
                users.setdefault(key, []).append(((name, seed), i))
    shared = {key: used for key, used in users.items() if len(used) > 1}
    if not shared:
        return {}
    where = {key: out / "start" / hashlib.sha256(key.encode()).hexdigest()[:16] for key in shared}
    for path in where.values():  # evaluated afresh: the code that builds a model may have changed since
        shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    if pool is not None:
        jobs = [pool.submit(_evaluate_start, cfgs[k].model_dump(mode="json"), str(where[k]), sim.torch_threads)
                for k in shared]  # fmt: skip
        for job in jobs:
            job.result()
    else:
        for key in shared:
            evaluate_initial(cfgs[key], where[key], {})
    logger.info(
        "%d initial nodes evaluated once for %d pairs in %.0fs", len(shared), len(todo), time.perf_counter() - t0
    )
    skip: dict[tuple[str, int], dict[str, list[int]]] = {}
    for key, used in shared.items():
        line = start_record(where[key]) + "\n"
        for (name, seed), i in used:
            node_dir = out / name / f"seed{seed}" / f"node{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            with (node_dir / "eval.jsonl").open("a") as f:
                f.write(line)
            skip.setdefault((name, seed), {}).setdefault(name, []).append(i)
    return {pair: without_start_eval(sim, nodes) for pair, nodes in skip.items()}


def _evaluate_start(cfg_json: dict[str, Any], run_dir: str, threads: int) -> None:
    """One initial node's step-0 evaluation in a worker process (``sim.initial.evaluate_initial``)."""
    import torch

    from node.cli.logs import setup_cli_logging
    from node.config import NodeConfig
    from sim.initial import evaluate_initial

    setup_cli_logging("INFO")
    torch.set_num_threads(threads)
    evaluate_initial(NodeConfig.model_validate(cfg_json), Path(run_dir), {})


def _run_pair(sim_json: dict[str, Any], variant: str, seed: int, out: str) -> tuple[str, float]:
    """One (configuration, seed) pair in a worker process; returns its run directory and wall seconds."""
    from node.cli.logs import setup_cli_logging
    from sim.inprocess import run_seed

    setup_cli_logging("INFO")  # a spawned process starts with no handlers: its build lines would be lost
    t0 = time.perf_counter()
    result = asyncio.run(run_seed(SimConfig.model_validate(sim_json), variant, seed, out))
    return str(result.run_dir), time.perf_counter() - t0


def build_model(model_json: dict[str, Any], threads: int) -> None:
    """Build (or find cached) one model in a worker process, then free it: the pairs load it from the cache."""
    import torch

    from node.cli.logs import setup_cli_logging
    from node.config import ModelConfig
    from node.model.policy import load_policy

    setup_cli_logging("INFO")
    torch.set_num_threads(threads)
    load_policy(ModelConfig.model_validate(model_json))


def _run_parallel(
    sim: SimConfig,
    out: Path,
    progress: Callable[[str], None] | None,
    pairs: list[tuple[str, int]],
    pool: Any,
    runs: dict[tuple[str, int], SimConfig] | None = None,
    on_pair: Callable[[tuple[str, int]], object] | None = None,
) -> list[Any]:
    """``sim.workers`` pairs at a time in ``pool``'s spawned processes, seed by seed and heaviest first within a
    seed (``pair_cost``). The workers
    rebuild the config from its JSON form, so each pair runs exactly as it would in the sequential loop; the
    results are the pairs' run directories, in the sequential loop's order. ``runs`` gives a pair its own
    experiment (its nodes whose start was evaluated once skip their own). ``on_pair`` runs here as each pair
    finishes."""
    from concurrent.futures import as_completed

    sim_json = sim.model_dump(mode="json")
    done: dict[tuple[str, int], Path] = {}
    models: dict[
        str, dict[str, Any]
    ] = {}  # every distinct model of the experiment, built side by side first (else pairs queue on one build)
    for name, seed in pairs:
        for i in range(sim.nodes):
            model = sim.node_config(name, i, seed).model
            models.setdefault(model.model_dump_json(), model.model_dump(mode="json"))
    if len(models) > 1:
        for built in as_completed([pool.submit(build_model, m, sim.torch_threads) for m in models.values()]):
            built.result()
    own = {p: r.model_dump(mode="json") for p, r in (runs or {}).items()}
    futures = {
        pool.submit(_run_pair, own.get((v, seed), sim_json), v, seed, str(out)): (v, seed)
        for v, seed in pair_order(sim, pairs)
    }
    for fut in as_completed(futures):
        v, seed = futures[fut]
        run_dir, wall = fut.result()  # a pair's exception propagates here, as in the sequential loop
        done[(v, seed)] = Path(run_dir)
        line = f"[{len(done)}/{len(pairs)}] {v} seed {seed}: {sim.nodes} nodes x {sim.steps} steps in {wall:.1f}s"
        (progress or logger.info)(line)
        if on_pair is not None:
            on_pair((v, seed))
    return [done[p] for p in pairs]
