"""The real-process drivers' run loop: pairs seed by seed, finished pairs skipped, a failed pair leaving the pairs
beside it to finish (its failure raised at the end), and an interrupt stopping them all (their nodes are stopped by
run_seed_multiprocess's own finally, reached through on_step)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import sim.multiproc
from benchmarks.common.multirun import prepare, run_pending, write_results
from sim.multiproc import MultiprocessError


def test_pairs_run_seed_by_seed_and_finished_ones_are_skipped(tmp_path: Path, monkeypatch) -> None:
    done_dir = tmp_path / "share" / "seed0" / "node0"
    done_dir.mkdir(parents=True)
    (done_dir / "eval.jsonl").write_text(json.dumps({"step": 0}) + "\n" + json.dumps({"step": 5}) + "\n")
    ran = []
    monkeypatch.setattr(
        sim.multiproc, "run_seed_multiprocess", lambda s, name, seed, work, on_step: ran.append((name, seed))
    )
    run_pending(SimpleNamespace(nodes=1, steps=5), tmp_path, ["alone", "share"], [0, 1], jobs=1)
    assert ran == [("alone", 0), ("alone", 1), ("share", 1)]


def _long_run(name: str, on_step, stopped: list[str], steps: int) -> None:
    """A run that polls ``on_step`` ``steps`` times, as the real one does once a step; records being stopped."""
    for step in range(steps):
        try:
            on_step(step)
        except MultiprocessError:
            stopped.append(name)
            raise
        time.sleep(0.02)


def test_a_failed_pair_leaves_the_pairs_beside_it_to_finish(tmp_path: Path, monkeypatch) -> None:
    stopped, finished, started = [], [], threading.Event()

    def fake(s, name, seed, work, on_step):
        if name == "bad":
            started.wait(10)
            raise MultiprocessError("node 0 exited with code 1")
        started.set()
        _long_run(name, on_step, stopped, 50)  # outlasts the bad pair's failure
        finished.append((name, seed))

    monkeypatch.setattr(sim.multiproc, "run_seed_multiprocess", fake)
    with pytest.raises(MultiprocessError, match=r"1 of 3 pairs failed .*bad seed 0: node 0 exited with code 1"):
        run_pending(SimpleNamespace(nodes=1, steps=5), tmp_path, ["good", "bad", "late"], [0], jobs=2)
    assert stopped == [] and sorted(finished) == [("good", 0), ("late", 0)]


def test_one_at_a_time_a_failed_pair_does_not_stop_the_next(tmp_path: Path, monkeypatch) -> None:
    ran = []

    def fake(s, name, seed, work, on_step):
        ran.append((name, seed))
        if (name, seed) == ("bad", 0):
            raise MultiprocessError("node 2 did not finish in time")

    monkeypatch.setattr(sim.multiproc, "run_seed_multiprocess", fake)
    with pytest.raises(MultiprocessError, match="1 of 4 pairs failed"):
        run_pending(SimpleNamespace(nodes=1, steps=5), tmp_path, ["bad", "good"], [0, 1], jobs=1)
    assert ran == [("bad", 0), ("good", 0), ("bad", 1), ("good", 1)]


def test_an_interrupt_stops_every_pair(tmp_path: Path, monkeypatch) -> None:
    stopped, started = [], threading.Event()

    def fake(s, name, seed, work, on_step):
        if name == "ctrl_c":
            started.wait(10)
            raise KeyboardInterrupt  # reaches the driver's thread as Ctrl-C does
        started.set()
        _long_run(name, on_step, stopped, 1500)  # 30 s unless stopped

    monkeypatch.setattr(sim.multiproc, "run_seed_multiprocess", fake)
    with pytest.raises(KeyboardInterrupt):
        run_pending(SimpleNamespace(nodes=1, steps=5), tmp_path, ["good", "ctrl_c"], [0], jobs=2)
    assert stopped == ["good"]


def test_a_work_dir_grows_by_seeds_and_configurations_and_refuses_a_changed_one(tmp_path: Path) -> None:
    import yaml

    def mapping(seeds: list[int], *configs: tuple[str, int]) -> dict:
        return {
            "name": "x", "mode": "inprocess", "nodes": 2, "steps": 3, "seeds": seeds,
            "configurations": [{"name": n, "node": {"sapo": {"local_groups": i}}} for n, i in configs],
        }  # fmt: skip

    prepare(tmp_path, mapping([0], ("alone", 4)), {})
    sim = prepare(tmp_path, mapping([1], ("share", 2)), {})
    assert [c.name for c in sim.configurations] == ["alone", "share"] and sim.seeds == [0, 1]
    assert yaml.safe_load((tmp_path / "experiment.yaml").read_text())["seeds"] == [0, 1]
    with pytest.raises(SystemExit, match="configuration 'alone' differs"):
        prepare(tmp_path, mapping([0], ("alone", 3)), {})
    with pytest.raises(SystemExit, match="another experiment"):
        prepare(tmp_path, {**mapping([0], ("alone", 4)), "steps": 9}, {})


def test_a_regenerated_report_keeps_the_hand_reading_and_replaces_the_rest(tmp_path: Path) -> None:
    write_results(tmp_path, "b", "# B\n\n| 1 seed |\n", {"rows": [1]})
    assert (tmp_path / "b.md").read_text() == "# B\n\n| 1 seed |\n"
    reading = "\n## Reading (by hand)\n\nThe gain is within the spread.\n"
    (tmp_path / "b.md").write_text((tmp_path / "b.md").read_text() + reading)
    write_results(tmp_path, "b", "# B\n\n| 3 seeds |\n", {"rows": [1, 2, 3]})
    text = (tmp_path / "b.md").read_text()
    assert text == "# B\n\n| 3 seeds |\n" + reading
    assert json.loads((tmp_path / "b.json").read_text()) == {"rows": [1, 2, 3]}


def test_report_rows_leave_out_a_saved_file_of_another_kind(tmp_path: Path, capsys) -> None:
    from benchmarks.common.multirun import report_rows

    (tmp_path / "experiment.yaml").write_text("name: x\n")
    saved = tmp_path / "old.json"
    saved.write_text(json.dumps({"curves": {}}))  # a hand-made file, no report's experiment and rows
    mapping, rows = report_rows(tmp_path, saved, lambda: ({"name": "x"}, [{"config": "a", "seed": 0}]))
    assert mapping == {"name": "x"} and rows == [{"config": "a", "seed": 0}]
    assert "no report of this kind" in capsys.readouterr().err
