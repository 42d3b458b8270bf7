"""B7's quick mode runs the real CLI end to end (join, then eval of the checkpoint and of the initial model)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(900)
def test_b7_quick(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "b7_generalization.py"), "--quick", "--out", str(tmp_path)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    text = (tmp_path / "b7_generalization_quick.md").read_text()
    assert "held-out" in text and "cores" in text
    [run] = json.loads((tmp_path / "b7_generalization_quick.json").read_text())
    assert run["before"]["step"] == 0 and run["after"]["step"] == 4
    for res in (run["before"], run["after"]):
        assert 0.0 <= res["accuracy"] <= 1.0
        assert res["families"] and all(f["n"] == 4 for f in res["families"].values())
    families = list(run["after"]["families"])
    assert all(f"| {fam} | 4 |" in text for fam in families)
