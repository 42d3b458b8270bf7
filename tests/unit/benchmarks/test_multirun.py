"""The real-process drivers' run loop: pairs seed by seed, finished pairs skipped, and a failed pair stopping the
pairs running beside it (their nodes are stopped by run_seed_multiprocess's own finally, reached through on_step)."""

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


def test_a_failed_pair_stops_the_pairs_beside_it(tmp_path: Path, monkeypatch) -> None:
    stopped, started = [], threading.Event()

    def fake(s, name, seed, work, on_step):
        if name == "bad":
            started.wait(10)
            raise MultiprocessError("node 0 exited with code 1")
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # a long run: polls on_step about once a second, as the real one does
            try:
                on_step(0)
            except MultiprocessError:
                stopped.append(name)
                raise
            time.sleep(0.05)

    monkeypatch.setattr(sim.multiproc, "run_seed_multiprocess", fake)
    with pytest.raises(MultiprocessError, match="exited with code 1"):
        run_pending(SimpleNamespace(nodes=1, steps=5), tmp_path, ["good", "bad"], [0], jobs=2)
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
