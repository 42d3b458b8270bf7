"""``swarm-sim`` multiprocess mode: real ``swarm-node join`` processes over hivemind on 127.0.0.1."""

from __future__ import annotations

import pytest

from node.telemetry.metrics import read_jsonl
from sim.config import SimConfig
from sim.multiproc import run_seed_multiprocess
from sim.report.summary import write_report

pytestmark = [pytest.mark.network]


@pytest.mark.timeout(900)
def test_three_processes_share_rollouts(tmp_path):
    cfg = SimConfig.model_validate(
        {
            "name": "mp",
            "mode": "multiprocess",
            "nodes": 3,
            "steps": 12,
            "node": {
                "swarm_id": "sim-mp-test",
                "model": {"device": "cpu"},
                "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16},
                "sapo": {"local_groups": 2, "external_groups": 2},
                "runtime": {"poll_interval_s": 0.5},
                "eval": {"items_per_family": 4},
            },
            "configurations": [{"name": "2-2"}],
            # node 0 stays up after its last step until the others finish: on a loaded machine it can finish first
            "multiprocess": {"startup_timeout_s": 240, "run_timeout_s": 720, "linger_s": 120},
        }
    )
    run_dir = run_seed_multiprocess(cfg, "2-2", 0, tmp_path)
    rows = {i: read_jsonl(run_dir / f"node{i}" / "metrics.jsonl") for i in range(3)}
    for i, r in rows.items():
        assert [x["step"] for x in r] == list(range(1, 13)), (
            f"node{i}: {(run_dir / f'node{i}' / 'stdout.log').read_text()[-2000:]}"
        )
        assert r[-1]["rejected"] == 0
    # the processes ran concurrently and at least two of them trained on peers' groups
    assert sum(1 for r in rows.values() if sum(x["external_groups"] for x in r) > 0) >= 2
    table = write_report(tmp_path, title="mp")
    assert table[0]["nodes"] == 3 and (tmp_path / "results.md").exists()
