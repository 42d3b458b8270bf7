"""B1 gossip benchmark in quick mode (3 peers, small records), so the benchmark never rots."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.network
@pytest.mark.timeout(180)
def test_b1_quick_writes_a_table(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "systems" / "b1_gossip.py"), "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=170)
    finally:
        if proc.poll() is None:  # the benchmark stops its own workers on SIGTERM
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    assert proc.returncode == 0, err[-3000:]
    table = (tmp_path / "b1_gossip.md").read_text()
    assert "| 3 | raw |" in table and "| 3 | hivemind |" in table
    assert "cores" in table and "GPU" in table
    row = next(line for line in table.splitlines() if line.startswith("| 3 | hivemind |"))
    assert row.split("|")[9].strip() == "0", f"records missing: {row}"
