"""``sim.report.noise``: the one rule for what two runs of a seed may differ in."""

from __future__ import annotations

from sim.report.noise import is_run_noise, without_run_noise


def test_clock_and_process_fields_go_at_any_depth_and_nothing_else() -> None:
    row = {
        "step": 3,
        "gen_s": 1.5,
        "tokens_per_s": 80.0,
        "time": 1.7e9,
        "py_heap_blocks": 2_000_000,
        "reward_std": 0.25,  # ends in neither suffix, though it holds "_s": a substring rule dropped these
        "external_sources": 2,
        "frac_reward_zero_std": 0.5,
        "external_by_family": {"chain_sum": 4, "wait_s": 0.1},
        "evals": [{"exact": 1, "seconds": 2.0}],
    }
    assert without_run_noise(row) == {
        "step": 3,
        "reward_std": 0.25,
        "external_sources": 2,
        "frac_reward_zero_std": 0.5,
        "external_by_family": {"chain_sum": 4},
        "evals": [{"exact": 1}],
    }
    assert not is_run_noise("pool_sources") and is_run_noise("opt_s")
    assert is_run_noise("rss_mb") and is_run_noise("rss_anon_mb")  # the node's resident memory between steps
