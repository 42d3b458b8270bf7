"""What differs between two runs of the same seed without the behaviour differing: one rule for every comparison.

Two runs of one configuration and seed must write the same records (metrics, rollouts, evaluations) except for
wall-clock measurements (keys ending in ``_s``, ``time`` or ``seconds``: ``gen_s``, ``tokens_per_s``, ``time``) and
the process's own state (``py_heap_blocks``, which moves with whatever else the interpreter holds, and the
resident memory ``rss_mb``, ``rss_anon_mb``). The determinism
tests and ``benchmarks/compare_runs.py`` drop exactly these keys, at any depth, and compare everything else.
"""

from __future__ import annotations

from typing import Any

WALL_CLOCK_SUFFIXES = ("_s", "time", "seconds")
PROCESS_STATE = frozenset({"py_heap_blocks", "rss_mb", "rss_anon_mb"})


def is_run_noise(key: str) -> bool:
    """Whether a record's field measures the run (its clock, its process) rather than what it did."""
    return key.endswith(WALL_CLOCK_SUFFIXES) or key in PROCESS_STATE


def without_run_noise(value: Any) -> Any:
    """``value`` (a decoded JSON record) with every run-noise key removed, recursively."""
    if isinstance(value, dict):
        return {k: without_run_noise(v) for k, v in value.items() if not is_run_noise(k)}
    if isinstance(value, list):
        return [without_run_noise(v) for v in value]
    return value
