"""The single-node benchmark's quick mode runs the real CLI end to end and writes its table."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_single_node_quick(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "single_node.py"), "--quick", "--out", str(tmp_path)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    text = (tmp_path / "single_node_quick.md").read_text()
    row = [line for line in text.splitlines() if line.startswith("| 1 |")]
    assert row, text
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert cells[1] == "12"  # all 12 steps ran and were logged
    assert 0.0 <= float(cells[2]) <= 1.0 and 0.0 <= float(cells[3]) <= 1.0
