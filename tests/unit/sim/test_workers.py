"""``workers``: pairs run in parallel processes give the same records as the sequential loop.

The laboratory specialists experiment in its quick form (two specialised real-policy nodes, three configurations),
once with ``workers: 1`` and once with ``workers: 2``: every node's rewards, training losses and held-out
evaluation items must be identical, and the parallel run returns the run directories in the sequential order,
telling its caller of each pair as it finishes (``on_pair``: the driver keeps it in the report then)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.config import load_sim_config
from sim.driver.records import pair_done
from sim.report.noise import without_run_noise
from sim.runner import run_experiment

CONFIG = "configs/sim/lab-specialists.yaml"


def _records(run: Path) -> dict[str, list[dict]]:
    """Every node's metrics and evaluation lines, without the run-noise fields (``sim.report.noise``)."""
    out: dict[str, list[dict]] = {}
    for f in sorted(run.glob("*/seed*/node*/*.jsonl")):
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        out[str(f.relative_to(run))] = without_run_noise(rows)
    return out


@pytest.mark.timeout(900)
def test_parallel_pairs_give_the_sequential_records(tmp_path: Path) -> None:
    cache = f"node.model.cache_dir={tmp_path / 'cache'}"
    two = "configurations=[{name: alone}, {name: sharing}]"  # the default sapo mix: peers' groups in both
    seq = load_sim_config(CONFIG, [cache, "seeds=[0, 1]", two], quick=True)
    par = seq.model_copy(update={"workers": 2})
    run_experiment(seq, tmp_path / "seq")
    finished: list[tuple[tuple[str, int], bool]] = []  # each pair as the main process hears of it, and whether done

    def on_pair(pair: tuple[str, int]) -> None:
        finished.append((pair, pair_done(tmp_path / "par" / pair[0] / f"seed{pair[1]}", par.nodes, par.steps)))

    dirs = run_experiment(par, tmp_path / "par", on_pair=on_pair)
    assert sorted(finished) == [((name, seed), True) for name in ("alone", "sharing") for seed in (0, 1)]
    assert [Path(d).relative_to(tmp_path / "par").as_posix() for d in dirs] == [
        "alone/seed0", "alone/seed1", "sharing/seed0", "sharing/seed1"
    ]  # fmt: skip
    a, b = _records(tmp_path / "seq"), _records(tmp_path / "par")
    assert set(a) == set(b) and len(a) >= 8  # metrics + eval of 2 nodes x 2 pairs at least
    for name in a:
        assert a[name] == b[name], name
    # the records are not trivially equal: rewards were written and differ between seeds
    rewards = [r.get("reward_mean") for r in a["alone/seed0/node1/metrics.jsonl"]]
    assert rewards and all(x is not None for x in rewards)
    assert a["alone/seed0/node1/metrics.jsonl"] != a["alone/seed1/node1/metrics.jsonl"]


def test_pairs_start_seed_by_seed_and_heaviest_first() -> None:
    """The parallel runner's order: a pair that also trains on 8 peers' groups a step costs more than one alone,
    a guided node (which also rolls out on its peers' prompts) more than receiver credit, and labels add their rows."""
    from sim.runner import pair_cost, pair_order

    sim = load_sim_config("configs/sim/transfer-het.yaml")
    cost = {name: pair_cost(sim, name, 0) for name in ("alone", "labels", "receiver", "guided")}
    assert cost["alone"] < cost["labels"] < cost["receiver"] < cost["guided"]
    assert cost["labels"] < pair_cost(sim, "peer-trace", 0)  # its trace step's 32 rows of working a step
    demo = load_sim_config("configs/sim/demo.yaml")
    assert pair_order(demo, [(v.name, 0) for v in demo.configurations])[0] == ("peer-trace", 0)
    # several seeds: whole seeds first, so an interrupted run leaves complete seeds to analyse paired
    two = pair_order(sim, [(name, seed) for name in ("alone", "guided") for seed in (1, 0)])
    assert two == [("guided", 0), ("alone", 0), ("guided", 1), ("alone", 1)]


def test_each_pair_is_reported_as_it_finishes_while_the_others_run(tmp_path: Path) -> None:
    """``_run_parallel`` calls ``on_pair`` in the caller's process as each pair's future completes, not once all
    have: with a stand-in pool, the first pair is finished at once and the second only from the first one's report
    (or by a timer after 10 s, so a runner that reported after the loop fails here instead of hanging)."""
    import threading
    from concurrent.futures import Future

    from sim.runner import _run_parallel

    sim = load_sim_config(CONFIG, ["seeds=[0]", "configurations=[{name: alone}, {name: sharing}]"], quick=True)
    futures: dict[str, Future] = {}

    class Pool:
        def submit(self, fn, *args):
            f: Future = Future()
            if fn.__name__ != "_run_pair":
                f.set_result(None)  # a model build
            else:  # (sim_json, variant, seed, out)
                futures[args[1]] = f
                if args[1] == "alone":
                    f.set_result((str(tmp_path / "alone" / "seed0"), 1.0))
            return f

    seen: list[tuple[tuple[str, int], bool]] = []

    def on_pair(pair: tuple[str, int]) -> None:
        seen.append((pair, futures["sharing"].done()))
        if not futures["sharing"].done():
            futures["sharing"].set_result((str(tmp_path / "sharing" / "seed0"), 1.0))

    late = threading.Timer(10.0, lambda: futures["sharing"].done() or futures["sharing"].set_result(("late", 0.0)))
    late.start()
    try:
        dirs = _run_parallel(sim, tmp_path, None, [("alone", 0), ("sharing", 0)], Pool(), None, on_pair)
    finally:
        late.cancel()
    assert seen == [(("alone", 0), False), (("sharing", 0), True)]
    assert [Path(d).relative_to(tmp_path).as_posix() for d in dirs] == ["alone/seed0", "sharing/seed0"]
