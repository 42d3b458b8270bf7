"""``report.html``: written beside results.md by ``swarm-sim run``, self-contained, escaped, per-node detail."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sim.report.summary import write_report


def _metrics(path: Path, rewards: list[float], evals: list[float] | None = None) -> None:
    path.mkdir(parents=True)
    rows = [{"step": i + 1, "reward_mean": r, "external_groups": 1, "rejected": 0} for i, r in enumerate(rewards)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if evals is not None:
        lines = [
            {"step": 10 * i, "accuracy": a, "greedy_accuracy": a, "families": {}, "time": 0.0}
            for i, a in enumerate(evals)
        ]
        (path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_report_html_is_self_contained_and_escapes_names(tmp_path):
    _metrics(tmp_path / "base" / "seed0" / "node0", [0.1, 0.2, 0.3], evals=[0.25, 0.625])
    _metrics(tmp_path / "base" / "seed0" / "node1", [0.0, 0.1, 0.2])
    _metrics(tmp_path / "x<script>alert(1)" / "seed0" / "node0", [0.4, 0.5, 0.6])
    rows = write_report(tmp_path, title="t <b>", order=["base"])
    html = (tmp_path / "report.html").read_text()
    assert len(rows) == 2
    assert "<script>" not in html and "x&lt;script&gt;alert(1)" in html and "t &lt;b&gt;" in html
    # Nothing is fetched from anywhere: no src/href attributes at all, only the SVG namespace URI.
    assert not re.search(r"\b(src|href)=", html)
    assert set(re.findall(r"https?://[^\s\"']+", html)) <= {"http://www.w3.org/2000/svg"}
    # the curves of all configurations, held-out accuracy (only "base" evaluated), then one per configuration
    assert html.count("<svg") == 4 and "Held-out exact accuracy</h2>" in html
    assert "seed0/node1" in html and "0.625" in html  # per-node rows with the held-out accuracy from eval.jsonl
    assert html.count("<polyline") == 2 + 1 + 3  # two configurations' curves, one held-out curve, three nodes
