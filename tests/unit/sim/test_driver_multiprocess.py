"""The driver's real-process back-end (``mode: multiprocess``): a registered experiment's pair runs as real
``swarm-node join`` processes over hivemind on 127.0.0.1, lands in the result JSON with the registration hash, resumes
a pair interrupted after its bootstrap node finished, and a later invocation runs nothing new."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from sim.config import apply_quick
from sim.driver.main import main
from sim.multiproc import LISTEN_RE
from sim.registration import registration_hash

pytestmark = [pytest.mark.network]

ROOT = Path(__file__).resolve().parents[3]
#: B6 on real models: ``mode: multiprocess``; its quick overrides run two built-in tiny nodes for two steps.
CONFIG = ROOT / "configs" / "sim" / "b6-real.yaml"


def address(node_dir: Path) -> str:
    """The hivemind address a node process printed (``swarm-node join``'s ``listening on`` line)."""
    m = LISTEN_RE.search((node_dir / "stdout.log").read_text())
    assert m is not None, (node_dir / "stdout.log").read_text()[-2000:]
    return m.group(1)


def bootstrap_peers(node_dir: Path) -> list[str]:
    """The peers a node process was started with (its resolved config)."""
    return yaml.safe_load((node_dir / "config.yaml").read_text())["transport"]["initial_peers"]


@pytest.mark.timeout(600)
def test_real_process_pairs_record_their_registration_and_resume(tmp_path: Path, tiny_cache: Path, capsys) -> None:
    from node.model import tiny

    model = str(tiny.ensure_built(tiny_cache, tiny.SMALL_RECIPE))  # the reduced built-in model, built once per run
    work, out = tmp_path / "work", tmp_path / "out"
    args = [str(CONFIG), "--quick", "--seeds", "0", "--only", "dpo", "--work", str(work), "--out", str(out)]
    args += ["--set", f"node.model.name={model}"]
    assert main(args) == 0
    assert "1 pairs to run" in capsys.readouterr().err
    pair_dir = work / "dpo" / "seed0"
    nodes = [pair_dir / f"node{i}" for i in range(2)]
    # two processes, each with its own address; node 1 joined through node 0's
    assert address(nodes[0]) != address(nodes[1])
    assert bootstrap_peers(nodes[1]) == [address(nodes[0])] and bootstrap_peers(nodes[0]) == []

    mapping = apply_quick(yaml.safe_load(CONFIG.read_text()))
    mapping["node"]["model"]["name"] = model
    h = registration_hash(mapping)
    data = json.loads((out / "b6_real_registered_quick.json").read_text())
    pair = data["pairs"]["dpo"]["0"]
    assert data["registration"]["hash"] == h and pair["registration"] == h and pair["commit"]
    assert set(pair["steps"]) == {"0", "2"} and set(pair["per_node"]["2"]) == {"0", "1"}

    # a session that ended mid-pair: node 0 had finished (checkpoint at the last step), node 1 had written nothing,
    # the JSON never got the pair. The resumed pair starts node 1 alone, as the bootstrap; node 0 is not restarted
    # (it would exit at once, printing no address)
    node0_log = (nodes[0] / "stdout.log").read_text()
    shutil.rmtree(nodes[1])
    (out / "b6_real_registered_quick.json").unlink()
    assert main(args) == 0
    assert "1 pairs to run" in capsys.readouterr().err
    assert (nodes[0] / "stdout.log").read_text() == node0_log
    assert address(nodes[1]) and bootstrap_peers(nodes[1]) == []
    again = json.loads((out / "b6_real_registered_quick.json").read_text())
    assert again["pairs"]["dpo"]["0"]["registration"] == h
    assert again["pairs"]["dpo"]["0"]["per_node"]["2"]["0"] == pair["per_node"]["2"]["0"]  # node 0's, as it was

    # a later invocation runs nothing new: the finished pair on disk, then the JSON alone (no run directory)
    assert main(args) == 0
    assert "0 pairs to run" in capsys.readouterr().err
    shutil.rmtree(work)
    assert main(args) == 0
    assert "0 pairs to run" in capsys.readouterr().err and not (work / "dpo").exists()
    assert json.loads((out / "b6_real_registered_quick.json").read_text())["pairs"] == again["pairs"]
