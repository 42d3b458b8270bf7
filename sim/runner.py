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


def run_experiment(sim: SimConfig, out: str | Path, progress: Callable[[str], None] | None = None) -> list[Any]:
    """Run all (configuration, seed) pairs of ``sim`` into ``out``; returns the in-process results (or run dirs)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[Any] = []
    from sim.report.progress import StepProgress

    n_runs = len(sim.configurations) * len(sim.seeds)
    for variant in sim.configurations:
        for seed in sim.seeds:
            t0 = time.perf_counter()
            # Per-step progress goes to stderr only when someone watches (``progress`` given: the CLI).
            label = f"[{len(results) + 1}/{n_runs}] {variant.name} seed {seed}"
            bar = StepProgress(label, sim.steps) if progress is not None else None
            on_step = bar.update if bar is not None else None
            if sim.mode == "inprocess":
                from sim.inprocess import run_seed

                results.append(asyncio.run(run_seed(sim, variant.name, seed, out, on_step=on_step)))
            else:
                from sim.multiproc import run_seed_multiprocess

                results.append(run_seed_multiprocess(sim, variant.name, seed, out, on_step=on_step))
            line = (
                f"{variant.name} seed {seed}: {sim.nodes} nodes x {sim.steps} steps in {time.perf_counter() - t0:.1f}s"
            )
            if bar is not None:
                bar.done(f"{label}: {sim.nodes} nodes x {sim.steps} steps in {time.perf_counter() - t0:.1f}s")
            else:
                logger.info(line)
    if sim.mnpo_game is not None:
        from sim.experiments.mnpo_game import run_mnpo_report

        run_mnpo_report(sim, out, progress)
    return results
