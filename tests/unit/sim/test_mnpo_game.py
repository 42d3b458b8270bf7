"""The simulator's MNPO population game (``sim.experiments.mnpo_game``, ``swarm-sim run configs/sim/mnpo.yaml``): its
metrics are exact at known points, and every method plays from one start with its own opponents. B6's benchmark
script that ran it is retired (docs/benchmarks.md); the game stays as a check of the MNPO machinery."""

from pathlib import Path

from sim.config import load_sim_config
from sim.experiments.mnpo_game import duality_gap, game_rows, plot_game, run_game, win_rate

ROOT = Path(__file__).resolve().parents[3]


def test_duality_gap_is_zero_at_the_nash_of_rock_paper_scissors():
    from node.mnpo.oracles import SyntheticOracle

    m = SyntheticOracle.cyclic_matrix(3)
    assert abs(duality_gap(m, [1 / 3] * 3)) < 1e-12
    assert abs(duality_gap(m, [1.0, 0.0, 0.0]) - 1.0) < 1e-12  # pure rock loses to paper for sure
    assert abs(win_rate(m, [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]) - 1.0) < 1e-12  # r2 beats r0
    assert abs(win_rate(m, [1 / 3] * 3, [0.2, 0.5, 0.3]) - 0.5) < 1e-12


def test_every_method_plays_the_quick_game_from_one_start_with_its_own_opponents(tmp_path: Path):
    game = load_sim_config(str(ROOT / "configs" / "sim" / "mnpo.yaml"), quick=True).mnpo_game
    assert game is not None
    results = [run_game(game, method, 0) for method in game.methods]
    rows = {r["method"]: r for r in game_rows(results)}
    assert set(rows) == {"ht_mnpo", "td_mnpo", "ipo", "dpo"}
    assert len({r["gap_start"] for r in rows.values()}) == 1  # the same initial players for every method
    assert all(r["gap"] != r["gap_start"] for r in rows.values())  # every method's players moved
    # HT-MNPO's opponents are its peers, TD-MNPO's its own past versions; the two-player baselines have none
    assert rows["ht_mnpo"]["peer_opponents"] > 0 and rows["td_mnpo"]["peer_opponents"] == 0
    assert rows["td_mnpo"]["self_opponents"] > 0
    for method in ("ipo", "dpo"):
        assert rows[method]["peer_opponents"] == rows[method]["self_opponents"] == 0
    assert all(0.0 <= r["win_league"] <= 1.0 and -1.0 <= r["gap"] <= 1.0 for r in rows.values())
    assert [p.name for p in plot_game(results, tmp_path)] == ["mnpo_gap.png", "mnpo_winrate.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in ("mnpo_gap.png", "mnpo_winrate.png"))
