"""sim.report.peers: the per-family peer diagnostics of a run, averaged over windows of steps."""

import json
from pathlib import Path

from sim.report.peers import node_rows


def test_windows_average_the_learners_peer_fields_and_count_missing_completions_as_zero(tmp_path: Path) -> None:
    steps = [
        {"step": 1, "peer_completions_lab_sub": 10.0, "peer_is_weight_lab_sub": 0.9, "peer_logp_lab_sub": -0.1},
        {"step": 2},  # no peer sample of the family reached the learner this step
        {"step": 3, "peer_completions_lab_sub": 20.0, "peer_is_weight_lab_sub": 0.5, "peer_logp_lab_sub": -0.3},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    evals = [
        {"step": 0, "families": {"lab_sub": {"accuracy": 0.05}}},
        {"step": 3, "families": {"lab_sub": {"accuracy": 0.25}}},
    ]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    ev, rows = node_rows(tmp_path, "lab_sub", window=2)
    assert ev == ["0: 0.050", "3: 0.250"]
    # steps 1-2: completions (10 + 0) / 2; the weight and logp over the steps that had them; no shaping value
    assert rows == ["| 1-2 | 5.000 | 0.900 | - | -0.100 | - |", "| 3-3 | 20.000 | 0.500 | - | -0.300 | - |"]
