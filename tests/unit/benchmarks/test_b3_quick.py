"""B3 benchmark in quick mode: it runs end to end, writes its table, and our loss matches TRL's."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_b3_quick_writes_table(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "systems" / "b3_learner.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (tmp_path / "b3_learner.md").read_text()
    assert "machine:" in table and "GPU" in table and "date:" in table
    rows = [line for line in table.splitlines() if line.startswith(("| grpo", "| dapo", "| dr_grpo"))]
    assert len(rows) == 3
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        loss_diff, param_diff = float(cells[-2]), float(cells[-1])
        assert loss_diff < 1e-5 and param_diff < 1e-5, row
