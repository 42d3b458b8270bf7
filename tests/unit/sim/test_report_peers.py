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


def test_the_trace_table_averages_the_trace_steps_fields_over_the_steps_that_logged_them(tmp_path: Path) -> None:
    trace = ("trace_new", "trace_rows", "trace_buffer", "trace_nll", "trace_anchor_kl")
    steps = [
        {"step": 1, **dict(zip(trace, (4.0, 32.0, 4.0, 2.0, 0.01), strict=True))},
        {"step": 2, **dict(zip(trace, (0.0, 0.0, 4.0, 0.0, 0.0), strict=True))},  # no trace row: NLL and KL logged 0
        {"step": 3, **dict(zip(trace, (2.0, 32.0, 6.0, 1.0, 0.03), strict=True))},
        {"step": 4, **dict(zip(trace[:4], (1.0, 16.0, 7.0, 0.5), strict=True))},  # no anchor
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    (tmp_path / "eval.jsonl").write_text(json.dumps({"step": 0, "families": {"lab_sub": {"accuracy": 0.0}}}) + "\n")
    _, rows = node_rows(tmp_path, "lab_sub", window=3, trace=True)
    # counts and the buffer over every step; the NLL and the KL over steps 1 and 3 only (step 2 trained on nothing)
    assert rows == ["| 1-3 | 2.000 | 21.333 | 4.667 | 1.500 | 0.020 |", "| 4-4 | 1.000 | 16.000 | 7.000 | 0.500 | - |"]
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "trace_n')  # a run still writing: its torn last line is not read
    assert node_rows(tmp_path, "lab_sub", window=3, trace=True)[1] == rows
