"""The per-seed start (``sim.driver.start``): with ``per_seed`` warm starts, each seed's initial models are evaluated
once for all its arms, kept in the result JSON by seed, and give every arm's pair of that seed the same step-0
numbers (and final numbers) a pair evaluating its own start gives; a resumed run reuses a saved seed's start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sim.config import SimConfig, load_sim_config
from sim.driver.main import main
from sim.driver.pairs import seed_sim
from sim.driver.records import pair_record, read_evals
from sim.driver.start import sharing_arms
from sim.initial import without_start_eval

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "sim" / "controls-het.yaml"
#: The heterogeneous controls with their warm starts drawn per seed (as issue 67's transfer registrations draw them).
PER_SEED = ["registration.per_seed=[node.model.builtin.seed]", "node.eval.at_start=true"]


def same_evaluation(a: dict, b: dict) -> bool:
    """Two ``eval.jsonl`` records of the same model on the same items: equal but for when and how long."""
    return {k: v for k, v in a.items() if k not in ("time", "eval_s")} == {
        k: v for k, v in b.items() if k not in ("time", "eval_s")
    }


def test_arms_that_share_the_seeds_start_run_without_their_own() -> None:
    sim = load_sim_config(str(CONFIG), PER_SEED, quick=True)
    mapping = sim.model_dump(mode="json", exclude_unset=True)
    other = {"name": "other", "node": {"model": {"builtin": {"hidden_size": 48}}}}  # another initial model
    mapping["configurations"].append(other)
    sim = seed_sim(SimConfig.model_validate(mapping), 3)
    assert sharing_arms(sim, 3, ["alone", "receiver", "other"]) == ["alone", "receiver"]
    run = without_start_eval(sim, {"alone": [0, 1], "receiver": [0, 1]})
    for i in range(sim.nodes):
        assert not run.node_config("alone", i, 3).eval.at_start and not run.node_config("receiver", i, 3).eval.at_start
        assert run.node_config("other", i, 3).eval.at_start  # evaluates its own start
        assert run.node_config("alone", i, 3).model == sim.node_config("alone", i, 3).model  # the seed's warm start
    assert run.registration is None


@pytest.mark.timeout(1200)
def test_per_seed_start_gives_the_numbers_of_per_pair_starts_and_resumes(tmp_path: Path, capsys) -> None:
    from sim.runner import run_experiment

    cache = f"node.model.cache_dir={tmp_path / 'cache'}"
    work, out = tmp_path / "work", tmp_path / "out"
    common = [str(CONFIG), "--quick", "--workers", "1", "--work", str(work), "--out", str(out)]
    common += [x for o in [cache, *PER_SEED] for x in ("--set", o)]
    assert main([*common, "--seeds", "0-1", "--only", "alone,receiver"]) == 0
    data = json.loads((out / "controls_het_quick.json").read_text())
    starts = data["seed_starts"]
    assert set(starts) == {"0", "1"} and starts["0"]["digests"] != starts["1"]["digests"]  # drawn per seed
    for arm in ("alone", "receiver"):
        for seed in ("0", "1"):
            assert data["pairs"][arm][seed]["per_node"]["0"] == starts[seed]["per_node"]
            assert data["pairs"][arm][seed]["steps"]["0"] == starts[seed]["record"]
            assert read_evals(work / arm / f"seed{seed}" / "node0")[0]["step"] > 0  # the pair did not evaluate it

    # the same pairs, each evaluating its own start (eval.at_start: true, as before): the same numbers, start and end,
    # and the same evaluation records (lengths, formats, answers: the generations themselves agree)
    sim = load_sim_config(str(CONFIG), [cache, *PER_SEED], quick=True).model_copy(update={"workers": 1})
    for seed in (0, 1):
        run_experiment(seed_sim(sim, seed), tmp_path / "per-pair", pairs=[("alone", seed), ("receiver", seed)])
        for arm in ("alone", "receiver"):
            own_dir = tmp_path / "per-pair" / arm / f"seed{seed}"
            own = pair_record(own_dir, sim.nodes, sim.registration)
            assert set(own["per_node"]) == {"0", "2"}
            assert own["per_node"] == data["pairs"][arm][str(seed)]["per_node"], (arm, seed)
            assert own["steps"] == data["pairs"][arm][str(seed)]["steps"], (arm, seed)
            for i in range(sim.nodes):
                first, *_, last = read_evals(own_dir / f"node{i}")
                assert same_evaluation(first, read_evals(work / "start" / f"seed{seed}" / f"node{i}")[0])
                assert same_evaluation(last, read_evals(work / arm / f"seed{seed}" / f"node{i}")[-1])

    # a later session without the run directory: a saved seed's start is not evaluated again for its new pairs
    shutil.rmtree(work)
    capsys.readouterr()
    assert main([*common, "--seeds", "1", "--only", "alone,receiver,labels"]) == 0
    err = capsys.readouterr().err
    assert "1 pairs to run" in err and "start evaluated" not in err and not (work / "start").exists()
    again = json.loads((out / "controls_het_quick.json").read_text())
    assert again["seed_starts"] == starts and again["pairs"]["alone"] == data["pairs"]["alone"]
    assert again["pairs"]["labels"]["1"]["per_node"]["0"] == starts["1"]["per_node"]


def test_a_finished_pair_whose_seeds_start_is_not_evaluated_is_left_out_not_a_crash(tmp_path: Path, capsys) -> None:
    """A run interrupted after some pairs of a seed finished, resumed with other arms (``--only``): the report written
    before that seed's start is known leaves those pairs out (and says so) instead of failing the run; with the start
    (from disk, ``seed_starts_on_disk``) they are in."""
    from sim.driver.pairs import collect
    from sim.driver.start import seed_starts_on_disk

    sim = load_sim_config(str(CONFIG), PER_SEED, quick=True).model_copy(update={"seeds": [4]})
    ev = {"families": {f: {"accuracy": 0.5, "pass_at_8": 0.75} for f in ("lab_add", "lab_sub")}}
    for i in range(sim.nodes):
        for where, step in ((tmp_path / "alone" / "seed4", sim.steps), (tmp_path / "start" / "seed4", 0)):
            (where / f"node{i}").mkdir(parents=True, exist_ok=True)
            (where / f"node{i}" / "eval.jsonl").write_text(json.dumps({**ev, "step": step}) + "\n")
    assert collect(tmp_path, sim, {}, None, {}) == {}
    assert "alone seed 4: finished, but its start is not evaluated yet" in capsys.readouterr().err
    starts = seed_starts_on_disk(sim, tmp_path, {})
    data = collect(tmp_path, sim, {}, None, starts)
    assert set(data) == {"alone"} and set(data["alone"][4]["steps"]) == {"0", str(sim.steps)}


@pytest.mark.timeout(1200)
def test_a_seed_whose_start_this_machine_does_not_rebuild_stops_the_run_or_is_run_again_whole(tmp_path: Path) -> None:
    """Another machine builds another warm start from the same recipe (its floating point differs): a pair run from
    it would not pair with the seed's finished ones. The run stops and says so; with ``--restart-rebuilt`` the seed's
    finished pairs are retired (kept in the JSON, out of every number) and every arm of it runs from the new start."""
    from sim.driver.machine import cpu_model
    from sim.driver.start import StartMismatch

    cache = f"node.model.cache_dir={tmp_path / 'cache'}"
    work, out = tmp_path / "work", tmp_path / "out"
    where = [str(CONFIG), "--quick", "--work", str(work), "--out", str(out)]
    where += [x for o in [cache, *PER_SEED] for x in ("--set", o)]
    common = [*where, "--workers", "1", "--seeds", "0"]
    assert main([*common, "--only", "alone"]) == 0
    path = out / "controls_het_quick.json"
    first = json.loads(path.read_text())
    built = first["seed_starts"]["0"]["digests"]
    other = {**first, "seed_starts": {"0": {**first["seed_starts"]["0"], "digests": ["0" * 16, "1" * 16]}}}
    path.write_text(json.dumps(other))  # as if the saved start had been built on another machine

    with pytest.raises(StartMismatch, match="not the ones the saved start was evaluated on"):
        main([*common, "--only", "receiver"])
    assert not (work / "receiver" / "seed0" / "node0").exists()  # nothing ran from the unpaired start

    assert main([*common, "--only", "alone,receiver", "--restart-rebuilt"]) == 0
    again = json.loads(path.read_text())
    assert again["seed_starts"]["0"]["digests"] == built  # the start this machine builds, evaluated anew
    assert again["seed_starts"]["0"]["built_on"] == cpu_model()  # the processor those digests hold on
    (entry,) = again["retired"]["0"]
    assert set(entry["pairs"]) == {"alone"} and entry["start"]["digests"] == ["0" * 16, "1" * 16]
    assert "not the ones" in entry["reason"]
    assert set(again["pairs"]) == {"alone", "receiver"} and set(again["pairs"]["alone"]) == {"0"}
    # one machine, one build: the re-run pair reproduces the retired one to the last digit
    assert again["pairs"]["alone"]["0"]["per_node"] == entry["pairs"]["alone"]["per_node"]
    assert "## Retired pairs" in (out / "controls_het_quick.md").read_text()
    # a re-read keeps the retired pairs as history and out of the numbers
    assert main([*where, "--analyze"]) == 0
    assert json.loads(path.read_text())["retired"] == again["retired"]


@pytest.mark.timeout(600)
def test_a_seed_start_read_from_disk_is_checked_against_what_is_built_not_replaced(tmp_path: Path) -> None:
    """A seed's start kept from disk (``seed_starts_on_disk``: its record, no key, no digests) may be the start its
    finished pairs ran from. A later run that reaches the seed checks the models it builds against that record: the
    same evaluation keeps it (now with its key and digests); another one stops the run (``StartMismatch``) instead of
    evaluating the seed afresh and pairing new pairs from one start with finished ones from another."""
    from sim.driver.start import StartMismatch, run_seed_start

    cache = f"node.model.cache_dir={tmp_path / 'cache'}"
    sim = load_sim_config(str(CONFIG), [cache, *PER_SEED], quick=True).model_copy(update={"workers": 1})
    sim = seed_sim(sim, 2)
    first = run_seed_start(sim, 2, tmp_path / "first", None)
    from_disk = {k: first[k] for k in ("record", "per_node")}
    kept = run_seed_start(sim, 2, tmp_path / "again", from_disk)
    assert kept == {**from_disk, "key": first["key"], "digests": first["digests"], "built_on": first["built_on"]}
    assert (tmp_path / "again" / "start-check" / "seed2" / "node0" / "eval.jsonl").is_file()  # evaluated to compare
    assert not (tmp_path / "again" / "start").exists()  # not evaluated as a new start

    acc = from_disk["record"]["accuracy"]
    other = {**from_disk, "record": {**from_disk["record"], "accuracy": {**acc, "all": acc["all"] + 0.01}}}
    with pytest.raises(StartMismatch, match="evaluate to"):
        run_seed_start(sim, 2, tmp_path / "other", other)


def test_models_built_side_by_side_are_the_ones_built_one_by_one(tmp_path: Path) -> None:
    """``build_models``: a seed's uncached laboratory models are built in parallel processes, once a recipe, to the
    same weights loading builds one by one (the build runs on one thread whatever the process); one process, fewer
    than two to build, or models whose build runs on the caller's threads (``builtin:tiny``), build nothing ahead."""
    from node.config import NodeConfig
    from node.model.policy import builtin_cached
    from sim.driver.start import build_models, initial_digests

    small = {"sft_steps": 2, "hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
             "num_kv_heads": 1, "tokenizer_items": 40}  # fmt: skip

    def nodes(cache: Path) -> list[NodeConfig]:
        model = {"name": "builtin:lab", "device": "cpu", "cache_dir": str(cache)}
        return [NodeConfig.model_validate({"model": {**model, "builtin": {**small, "seed": s}}}) for s in (1, 2, 1)]

    side = nodes(tmp_path / "side")
    build_models(side, 1)
    build_models(side[:1], 2)
    assert not any(builtin_cached(c.model) for c in side)
    tiny = [NodeConfig.model_validate({"model": {"cache_dir": str(tmp_path / "tiny"), "builtin": {"seed": s}}})
            for s in (1, 2)]  # fmt: skip
    build_models(tiny, 2)
    assert tiny[0].model.name == "builtin:tiny" and not any(builtin_cached(c.model) for c in tiny)
    build_models(side, 2)
    assert all(builtin_cached(c.model) for c in side)
    built = [d for d in (tmp_path / "side").glob("lab-*") if d.is_dir()]
    assert len(built) == 2  # seeds 1 and 2: the repeated recipe built once
    one_by_one = nodes(tmp_path / "seq")
    digests = initial_digests(one_by_one)  # loading builds them here, in this process
    assert digests == initial_digests(side) and digests[0] != digests[1] and digests[0] == digests[2]


def test_with_several_workers_each_pair_is_kept_as_it_finishes(tmp_path: Path, monkeypatch) -> None:
    """``run_pending`` with ``workers > 1`` runs a seed's pairs side by side and calls ``after_each`` (the report's
    rewrite) after the seed's start and again as each of its pairs finishes, while the others still run, so a
    session that ends mid-seed keeps every finished pair in the JSON. The start and the pairs are stand-ins: the
    order is tested."""
    import sim.driver.start as start_mod
    import sim.runner as runner
    from sim.driver import pairs

    sim = load_sim_config(str(CONFIG), PER_SEED, quick=True).model_copy(update={"workers": 2, "seeds": [0, 1]})
    events: list[str] = []
    monkeypatch.setattr(start_mod, "run_seed_start", lambda s, seed, work, saved: events.append(f"start {seed}") or {})

    def side_by_side(s, work, progress=None, pairs=None, on_pair=None):
        for pair in sorted(pairs):
            events.append(f"pair {pair}")
            on_pair(pair)

    monkeypatch.setattr(runner, "run_experiment", side_by_side)
    pairs.run_pending(sim, tmp_path, ["alone", "receiver"], set(), {"commit": "x"},
                      after_each=lambda: events.append("report"), seed_starts={})  # fmt: skip
    assert events == [
        "start 0", "report", "pair ('alone', 0)", "report", "pair ('receiver', 0)", "report",
        "start 1", "report", "pair ('alone', 1)", "report", "pair ('receiver', 1)", "report",
    ]  # fmt: skip


def test_a_report_that_fails_mid_run_does_not_stop_the_pairs_still_running(tmp_path: Path, monkeypatch, capsys) -> None:
    """With several workers the report is rewritten as each pair finishes, best effort: one that fails is said and
    retried (after the next pair, and once at the end), and one that keeps failing raises after the seed's pairs."""
    import sim.driver.start as start_mod
    import sim.runner as runner
    from sim.driver import pairs

    sim = load_sim_config(str(CONFIG), PER_SEED, quick=True).model_copy(update={"workers": 2, "seeds": [0]})
    monkeypatch.setattr(start_mod, "run_seed_start", lambda s, seed, work, saved: {})
    ran: list[tuple[str, int]] = []

    def side_by_side(s, work, progress=None, pairs=None, on_pair=None):
        for pair in sorted(pairs):
            ran.append(pair)
            on_pair(pair)

    monkeypatch.setattr(runner, "run_experiment", side_by_side)
    calls: list[int] = []

    def flaky() -> None:  # the start's report, then the first pair's fails, then the rest succeed
        calls.append(len(calls))
        if len(calls) == 2:
            raise OSError("No space left on device")

    pairs.run_pending(sim, tmp_path, ["alone", "receiver"], set(), {"commit": "x"}, after_each=flaky, seed_starts={})
    assert ran == [("alone", 0), ("receiver", 0)] and len(calls) == 4  # start, two pairs, and once more at the end
    assert "alone seed 0: finished, but the report was not rewritten (OSError" in capsys.readouterr().err

    def broken() -> None:
        if ran:  # the start's report is written; every one after a pair fails
            raise OSError("No space left on device")

    ran.clear()
    with pytest.raises(OSError):
        pairs.run_pending(sim, tmp_path, ["alone", "receiver"], set(), {"commit": "x"}, after_each=broken,
                          seed_starts={})  # fmt: skip
    assert ran == [("alone", 0), ("receiver", 0)]  # every pair ran before the error surfaced


def test_a_torn_last_evaluation_line_is_not_read(tmp_path: Path) -> None:
    """The driver reads a node's evaluations while, with several workers, another process may be appending one: a
    last line without its end is skipped (the pair is not done yet), the lines before it are read."""
    from sim.driver.records import pair_done

    node = tmp_path / "seed0" / "node0"
    node.mkdir(parents=True)
    (node / "eval.jsonl").write_text('{"step": 0, "families": {}}\n{"step": 150, "fami')
    assert [e["step"] for e in read_evals(node)] == [0]
    assert not pair_done(tmp_path / "seed0", 1, 150)
    (node / "eval.jsonl").write_text('{"step": 0, "families": {}}\n{"step": 150, "families": {}}\n')
    assert [e["step"] for e in read_evals(node)] == [0, 150] and pair_done(tmp_path / "seed0", 1, 150)
