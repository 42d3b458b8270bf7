"""Run a whole experiment: every configuration for every seed, in-process or as real processes.

Knows nothing about reports (``sim.report.summary`` reads what the runs wrote).
"""

from __future__ import annotations

import asyncio
import logging
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
) -> list[Any]:
    """Run all (configuration, seed) pairs of ``sim`` into ``out`` (or only ``pairs``, e.g. the unfinished ones of a
    resumed benchmark); returns the in-process results (or run dirs)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[Any] = []
    from sim.report.progress import StepProgress

    todo = pairs if pairs is not None else [(v.name, seed) for v in sim.configurations for seed in sim.seeds]
    n_runs = len(todo)
    if sim.mode == "inprocess" and sim.workers > 1 and n_runs > 1:
        results.extend(_run_parallel(sim, out, progress, todo))
        if sim.mnpo_game is not None:
            from sim.experiments.mnpo_game import run_mnpo_report

            run_mnpo_report(sim, out, progress)
        return results
    for name, seed in todo:
        t0 = time.perf_counter()
        # Per-step progress goes to stderr only when someone watches (``progress`` given: the CLI).
        label = f"[{len(results) + 1}/{n_runs}] {name} seed {seed}"
        bar = StepProgress(label, sim.steps) if progress is not None else None
        on_step = bar.update if bar is not None else None
        if sim.mode == "inprocess":
            from sim.inprocess import run_seed

            results.append(asyncio.run(run_seed(sim, name, seed, out, on_step=on_step)))
        else:
            from sim.multiproc import run_seed_multiprocess

            results.append(run_seed_multiprocess(sim, name, seed, out, on_step=on_step))
        line = f"{name} seed {seed}: {sim.nodes} nodes x {sim.steps} steps in {time.perf_counter() - t0:.1f}s"
        if bar is not None:
            bar.done(f"{label}: {sim.nodes} nodes x {sim.steps} steps in {time.perf_counter() - t0:.1f}s")
        else:
            logger.info(line)
    if sim.mnpo_game is not None:
        from sim.experiments.mnpo_game import run_mnpo_report

        run_mnpo_report(sim, out, progress)
    return results


def _run_pair(sim_json: dict[str, Any], variant: str, seed: int, out: str) -> tuple[str, float]:
    """One (configuration, seed) pair in a worker process; returns its run directory and wall seconds."""
    from node.cli.logs import setup_cli_logging
    from sim.inprocess import run_seed

    setup_cli_logging("INFO")  # a spawned process starts with no handlers: its build lines would be lost
    t0 = time.perf_counter()
    result = asyncio.run(run_seed(SimConfig.model_validate(sim_json), variant, seed, out))
    return str(result.run_dir), time.perf_counter() - t0


def _build_model(model_json: dict[str, Any], threads: int) -> None:
    """Build (or find cached) one model in a worker process, then free it: the pairs load it from the cache."""
    import torch

    from node.cli.logs import setup_cli_logging
    from node.config import ModelConfig
    from node.model.policy import load_policy

    setup_cli_logging("INFO")
    torch.set_num_threads(threads)
    load_policy(ModelConfig.model_validate(model_json))


def _run_parallel(
    sim: SimConfig, out: Path, progress: Callable[[str], None] | None, pairs: list[tuple[str, int]]
) -> list[Any]:
    """``sim.workers`` pairs at a time, each in a fresh process (spawned: no inherited torch state). The workers
    rebuild the config from its JSON form, so each pair runs exactly as it would in the sequential loop; the
    results are the pairs' run directories, in the sequential loop's order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    sim_json = sim.model_dump(mode="json")
    done: dict[tuple[str, int], Path] = {}
    ctx = multiprocessing.get_context("spawn")
    models: dict[
        str, dict[str, Any]
    ] = {}  # every distinct model of the experiment, built side by side first (else pairs queue on one build)
    for name, seed in pairs:
        for i in range(sim.nodes):
            model = sim.node_config(name, i, seed).model
            models.setdefault(model.model_dump_json(), model.model_dump(mode="json"))
    with ProcessPoolExecutor(max_workers=min(sim.workers, max(len(pairs), len(models))), mp_context=ctx) as pool:
        if len(models) > 1:
            for built in as_completed([pool.submit(_build_model, m, sim.torch_threads) for m in models.values()]):
                built.result()
        futures = {pool.submit(_run_pair, sim_json, v, seed, str(out)): (v, seed) for v, seed in pairs}
        for fut in as_completed(futures):
            v, seed = futures[fut]
            run_dir, wall = fut.result()  # a pair's exception propagates here, as in the sequential loop
            done[(v, seed)] = Path(run_dir)
            line = f"[{len(done)}/{len(pairs)}] {v} seed {seed}: {sim.nodes} nodes x {sim.steps} steps in {wall:.1f}s"
            (progress or logger.info)(line)
    return [done[p] for p in pairs]
