"""The capability gate's quick mode builds both laboratory twins (traces, bare answers) and evaluates them."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(600)
def test_lab_gate_quick() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "lab_gate.py"), "--quick", "--threads", "1"],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "lab_" in line]
    assert {r.split(" | ")[0] for r in rows} == {"| traces", "| bare answers", "| RL start (default recipe, 4 steps)"}
    assert {r.split(" | ")[2] for r in rows} == {"lab_add", "lab_sub"}
    assert "Result: gate" in done.stdout
