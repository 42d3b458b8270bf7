"""The simulator report puts held-out accuracy beside training reward: table columns, spread only over seeds."""

from __future__ import annotations

import json
from pathlib import Path

from sim.report.summary import write_report


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(out: Path, config: str, seed: int, node: int, start: float, end: float, reward: float) -> None:
    d = out / config / f"seed{seed}" / f"node{node}"
    _write(d / "metrics.jsonl", [{"step": s, "reward_mean": reward} for s in (1, 2, 3, 4)])
    _write(d / "eval.jsonl", [{"step": 0, "accuracy": start}, {"step": 2, "accuracy": (start + end) / 2},
                              {"step": 4, "accuracy": end}])  # fmt: skip


def test_heldout_columns_and_plot(tmp_path: Path) -> None:
    for node in (0, 1):
        _run(tmp_path, "alone", 0, node, 0.1, 0.2 + 0.1 * node, 0.3)  # gains 0.1 and 0.2: mean 0.15
        _run(tmp_path, "swarm", 0, node, 0.1, 0.4, 0.5)
        _run(tmp_path, "swarm", 1, node, 0.1, 0.3, 0.5)
    rows = write_report(tmp_path, title="t", order=["alone", "swarm"])
    alone, swarm = rows
    assert alone["heldout_start"] == 0.1 and abs(alone["heldout_end"] - 0.25) < 1e-12
    assert abs(alone["heldout_gain"] - 0.15) < 1e-12
    assert abs(swarm["heldout_gain"] - 0.25) < 1e-12 and swarm["heldout_gain_std"] > 0
    md = (tmp_path / "results.md").read_text()
    assert "held-out exact start -> end" in md and "majority baseline" in md
    alone_line = next(line for line in md.splitlines() if line.startswith("| alone |"))
    swarm_line = next(line for line in md.splitlines() if line.startswith("| swarm |"))
    assert "0.100 -> 0.250" in alone_line and "±" not in alone_line  # one seed: no spread
    assert "0.250 ± 0.071" in swarm_line
    assert (tmp_path / "rewards.png").stat().st_size > 0


def test_report_without_evaluations_says_so(tmp_path: Path) -> None:
    d = tmp_path / "only" / "seed0" / "node0"
    _write(d / "metrics.jsonl", [{"step": 1, "reward_mean": 0.5}])
    [row] = write_report(tmp_path, title="t")
    md = (tmp_path / "results.md").read_text()
    assert row["heldout_gain"] != row["heldout_gain"]  # NaN: nothing to report
    assert "| only | 1 | 1 | 1 | 0.50 | 1 | 0.00 | 0.500 | - | - | - | - |" in md


def _specialist(out: Path, config: str, node: int, lacking: tuple[float, float], own: tuple[float, float]) -> None:
    """A node of the demo's shape: evaluated on lab_add and lab_sub, lacking one (node 0 lacks lab_sub)."""
    d = out / config / "seed0" / f"node{node}"
    fams = ("lab_sub", "lab_add") if node == 0 else ("lab_add", "lab_sub")
    _write(d / "metrics.jsonl", [{"step": s, "reward_mean": 0.5, "exact_mean": 0.5} for s in (1, 2)])
    _write(
        d / "eval.jsonl",
        [
            {
                "step": step,
                "accuracy": 0.5,
                "families": {fams[0]: {"accuracy": lacking[i]}, fams[1]: {"accuracy": own[i]}},
            }
            for i, step in enumerate((0, 2))
        ],
    )


def test_results_open_with_what_to_look_at_and_the_plot_legend_matches_its_lines(tmp_path: Path) -> None:
    for node in (0, 1):
        _specialist(tmp_path, "alone", node, (0.1, 0.15), (0.8, 0.8))
        _specialist(tmp_path, "sharing", node, (0.1, 0.4), (0.8, 0.75))
    write_report(tmp_path, title="demo", order=["alone", "sharing"])
    md = (tmp_path / "results.md").read_text()
    glance, full = md.split("## Full table", 1)
    assert (
        "## What to look at" in glance and "| configuration | node | the family it lacks | its own family |" in glance
    )
    assert "| alone | node 0 | lab_sub: 0.100 -> 0.150, up 0.050 | lab_add: 0.800 -> 0.800, no change |" in glance
    assert "| sharing | node 1 | lab_add: 0.100 -> 0.400, up 0.300 | lab_sub: 0.800 -> 0.750, down 0.050 |" in glance
    assert "| config |" in full
    # the reward is the exact one (no partial credit): the wording and the columns say so
    assert "partial credit" not in md.replace("no partial credit", "")
    assert "cumulative exact" not in full.split("\n\n")[2]  # the full table's header
    assert (tmp_path / "families.png").stat().st_size > 0

    from sim.report.summary import collect, family_panels_figure

    fig = family_panels_figure(collect(tmp_path, ["alone", "sharing"]), "demo")
    assert "does each node rise on the family it lacks" in fig._suptitle.get_text()
    legend = fig.axes[0].get_legend()
    styles = {h.get_label(): h.get_linestyle() for h in legend.legend_handles if hasattr(h, "get_linestyle")}
    drawn = {line.get_linestyle() for ax in fig.axes for line in ax.get_lines()}
    node_styles = {label: style for label, style in styles.items() if label.startswith("node ")}
    assert node_styles == {"node 0": "-", "node 1": "--"} and drawn == {"-", "--"}
    from matplotlib.patches import Patch

    assert [h.get_label() for h in legend.legend_handles if isinstance(h, Patch)] == ["alone", "sharing"]


def _items(scores: list[int]) -> list[dict]:
    return [{"key": f"p{i}", "n_samples": 4, "samples_right": r} for i, r in enumerate(scores)]


def test_the_glance_gives_each_change_its_standard_error_and_lacking_png_a_panel_per_node(tmp_path: Path) -> None:
    import statistics

    # node 0 lacks lab_sub (its peer, node 1, starts at 0.75 on it); node 1 lacks lab_add (node 0 starts at 0.5)
    first = {0: {"lab_sub": [0, 0, 1, 0], "lab_add": [2, 2, 2, 2]}, 1: {"lab_add": [0, 1, 0, 0], "lab_sub": [3] * 4}}
    last = {0: {"lab_sub": [1, 2, 3, 2], "lab_add": [2, 2, 2, 2]}, 1: {"lab_add": [0, 1, 0, 0], "lab_sub": [3] * 4}}
    for node in (0, 1):
        d = tmp_path / "guided" / "seed0" / f"node{node}"
        _write(d / "metrics.jsonl", [{"step": s, "reward_mean": 0.5} for s in (1, 2)])
        evals = [
            {"step": step, "accuracy": 0.5, "families": {fam: {"accuracy": sum(v) / 16, "items": _items(v)}
                                                         for fam, v in ev[node].items()}}
            for step, ev in ((0, first), (2, last))
        ]  # fmt: skip
        _write(d / "eval.jsonl", evals)
    write_report(tmp_path, title="demo", order=["guided"])
    glance = (tmp_path / "results.md").read_text().split("## Full table", 1)[0]
    change = [0.25, 0.5, 0.5, 0.5]  # node 0's per-problem changes on lab_sub: the same problems at both ends
    se = statistics.stdev(change) / 2
    assert f"| guided | node 0 | lab_sub: 0.062 -> 0.500, up 0.438 ± {se:.3f} SE |" in glance
    assert "lab_add: 0.062 -> 0.062, no change ± 0.000 SE" in glance  # node 1 learned nothing: no spread either

    from sim.report.summary import collect, lacking_panels_figure, level_se, peer_level

    results = collect(tmp_path, ["guided"])
    roles = {0: ("lab_sub", "lab_add"), 1: ("lab_add", "lab_sub")}
    assert peer_level(results, roles, 0) == 0.75 and peer_level(results, roles, 1) == 0.5
    assert level_se(results[0], "lab_sub", 0)[0] == statistics.stdev([0, 0, 0.25, 0]) / 2
    fig = lacking_panels_figure(results, "demo")
    assert [ax.get_title() for ax in fig.axes] == [
        "node 0: lab_sub, the family it lacks (lab_add is its own)",
        "node 1: lab_add, the family it lacks (lab_sub is its own)",
    ]
    line = fig.axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [0, 2] and list(line.get_ydata()) == [1 / 16, 0.5]
    assert fig.axes[0].get_lines()[1].get_ydata()[0] == 0.75  # the peer's level, dashed
    assert (tmp_path / "lacking.png").stat().st_size > 0


def test_no_lacking_png_when_no_node_lacks_a_family(tmp_path: Path) -> None:
    for node in (0, 1):
        _specialist(tmp_path, "alone", node, (0.5, 0.5), (0.5, 0.6))  # every family starts equal
    write_report(tmp_path, title="t", order=["alone"])
    assert (tmp_path / "families.png").exists() and not (tmp_path / "lacking.png").exists()


def test_the_errors_pair_the_same_problems_and_count_each_problem_once_over_seeds(tmp_path: Path) -> None:
    import statistics

    from sim.report.summary import change_se, collect, level_se

    def node(config: str, seed: int, first: list[int], last: list[int], keys_last: list[str] | None = None) -> None:
        d = tmp_path / config / f"seed{seed}" / "node0"
        _write(d / "metrics.jsonl", [{"step": 1, "reward_mean": 0.5}])
        end = _items(last)
        for it, key in zip(end, keys_last or [], strict=False):
            it["key"] = key
        _write(d / "eval.jsonl", [
            {"step": s, "accuracy": 0.5, "families": {"f": {"accuracy": sum(v) / 16, "items": items}}}
            for s, v, items in ((0, first, _items(first)), (2, last, end))
        ])  # fmt: skip

    node("moved", 0, [0, 1, 2, 3], [1, 1, 2, 4], keys_last=["p0", "p1", "p2", "other"])
    node("two", 0, [0, 0, 4, 4], [0, 0, 4, 4])
    node("two", 1, [0, 0, 4, 4], [0, 0, 4, 4])
    moved, two = collect(tmp_path, ["moved", "two"])
    assert change_se(moved, "f", 0) is None  # not the same problems at both ends: no paired error
    assert change_se(two, "f", 0) == (0.0, "seeds")
    # each problem once (its mean over the two seeds), not each seed's copy of it: sd([0, 0, 1, 1]) / 2
    assert level_se(two, "f", 0)[0] == statistics.stdev([0, 0, 1, 1]) / 2


def test_swarm_sim_run_prints_the_glance_after_its_table(tmp_path: Path, monkeypatch) -> None:
    """``swarm-sim run`` of two half-knowing nodes prints, after the per-configuration table, what each node
    learned of the family it lacks and kept of its own (the README's demo numbers are this output)."""
    from typer.testing import CliRunner

    import sim.runner
    from sim.cli import app

    def fake_run(cfg, out, progress=None, pairs=None):  # the runner's output files, as a finished demo leaves them
        for node in (0, 1):
            _specialist(out, "alone", node, (0.1, 0.1), (0.8, 0.8))
            _specialist(out, "own-labels", node, (0.1, 0.0), (0.8, 0.2))
            _specialist(out, "peer-trace", node, (0.1, 0.35), (0.8, 0.8))

    monkeypatch.setattr(sim.runner, "run_experiment", fake_run)
    root = Path(__file__).resolve().parents[3]
    res = CliRunner().invoke(app, ["run", str(root / "configs/sim/demo.yaml"), "--quick", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    table, glance = res.output.split("Held-out exact, first -> last evaluation", 1)
    assert "| peer-trace | 1 | 2 |" in table
    assert "| peer-trace | node 0 | lab_sub: 0.100 -> 0.350, up 0.250 | lab_add: 0.800 -> 0.800, no change |" in glance
    assert "| own-labels | node 1 | lab_add: 0.100 -> 0.000, down 0.100 |" in glance
