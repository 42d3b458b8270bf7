"""B6 MNPO's quick mode runs end to end (so it never rots); the game's metrics are sane."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_b6_mnpo_quick(tmp_path):
    out = tmp_path / "b6.md"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "b6_mnpo.py"),
            "--quick",
            "--out",
            str(out),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    text = out.read_text()
    for method in ("ht_mnpo", "td_mnpo", "ipo", "dpo"):
        assert f"| {method} |" in text
    assert "Machine:" in text and "Date:" in text and "duality gap" in text
    assert (tmp_path / "b6_gap.png").stat().st_size > 0 and (tmp_path / "b6_winrate.png").stat().st_size > 0


def test_duality_gap_is_zero_at_the_nash_of_rock_paper_scissors():
    from node.mnpo.oracles import SyntheticOracle
    from sim.experiments.mnpo_game import duality_gap, win_rate

    m = SyntheticOracle.cyclic_matrix(3)
    assert abs(duality_gap(m, [1 / 3] * 3)) < 1e-12
    assert abs(duality_gap(m, [1.0, 0.0, 0.0]) - 1.0) < 1e-12  # pure rock loses to paper for sure
    assert abs(win_rate(m, [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]) - 1.0) < 1e-12  # r2 beats r0
    assert abs(win_rate(m, [1 / 3] * 3, [0.2, 0.5, 0.3]) - 0.5) < 1e-12
