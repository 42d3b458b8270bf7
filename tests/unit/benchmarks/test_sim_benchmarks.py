"""The simulator benchmarks' quick modes run end to end (so they never rot)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_b5_scale_quick(tmp_path):
    out = tmp_path / "b5.md"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "systems" / "b5_scale.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    text = out.read_text()
    assert "| 5 |" in text and "| 40 |" in text and "Machine:" in text and "Reach" in text


def test_sybils_take_at_most_the_newcomer_share(tmp_path):
    """100 fresh sybil identities per round publishing informative groups: honest peers still supply at least
    half of what an honest node trains on from outside (the newcomer budgets of the read and of SAPO)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.systems.sybil import measure

    row = measure(100, 8, 3, tmp_path)
    assert row["external_groups"] > 0
    assert row["min_share"] >= 0.5, row
