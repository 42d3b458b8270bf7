"""The experiment driver (``sim.driver``, ``swarm-sim experiment``): the committed controls re-analyse to the same
numbers from their JSON alone; the registration hash, the refusal of a changed registration and its amendment; the
verdict rule (better-of controls, margins, levels); the gap-closed metric; per-seed warm starts; and a quick run
of two arms x two seeds from a shared start that resumes from its JSON with nothing to run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from protocol.errors import ConfigError
from sim.config import load_sim_config
from sim.driver import analysis, metrics, provenance
from sim.driver.main import main
from sim.driver.pairs import seed_sim
from sim.driver.stats import parse_seeds, t975, t_interval
from sim.registration import Registration, registration_hash

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = ("het", "homo", "smol")
#: Read off the JSON the pre-driver ``benchmarks/controls.py`` committed (the README and docs cite them).
LEGACY = {
    ("het", "receiver", "alone"): (0.0314453125, 0.019387503847026664, 0.04350312115297334),
    ("homo", "receiver", "alone"): (0.009228515625, 0.0033952351759628423, 0.015061796074037157),
    ("smol", "receiver", "labels"): (0.17643229166666666, 0.02787711554669023, 0.3249874677866431),
}


def reanalyse(setting: str, out: Path, *extra: str) -> dict:
    config = ROOT / "configs" / "sim" / f"controls-{setting}.yaml"
    assert main([str(config), "--analyze", "--out", str(out), "--work", str(out / "none"), *extra]) == 0
    return json.loads((out / f"controls_{setting}.json").read_text())


@pytest.mark.parametrize("setting", SETTINGS)
def test_committed_controls_reanalyse_to_the_same_values(setting: str, tmp_path: Path) -> None:
    committed = json.loads((ROOT / "benchmarks" / "results" / f"controls_{setting}.json").read_text())
    shutil.copy(ROOT / "benchmarks" / "results" / f"controls_{setting}.json", tmp_path)
    again = reanalyse(setting, tmp_path)
    for key in ("arms", "comparisons", "verdict", "baseline", "pairs", "arm_keys", "shared_start"):
        assert again.get(key) == committed.get(key), key
    assert again["registration"]["hash"] == committed["registration"]["hash"]
    for (s, arm, ctl), (mean, lo, hi) in LEGACY.items():
        if s == setting:
            row = next(c for c in again["comparisons"] if (c["arm"], c["control"]) == (arm, ctl))["exact"]
            assert (row["mean"], row["lo"], row["hi"]) == (mean, lo, hi)
    assert again["verdict"]["met"] and again["verdict"]["by"][0] == "receiver"
    assert_tables_aligned((tmp_path / f"controls_{setting}.md").read_text())


def assert_tables_aligned(text: str, where: str = "") -> None:
    """Every row of every Markdown table has its header's number of cells (a renderer drops or shifts the rest).
    Pipes escaped (``\\|``) or inside code spans are text, not cell borders; fenced code blocks are skipped."""
    header, fenced = None, False
    for n, line in enumerate(text.splitlines(), start=1):
        fenced = fenced != line.startswith("```")
        if fenced or not line.startswith("|"):
            header = None
            continue
        bare = re.sub(r"`[^`]*`", "", line.replace("\\|", ""))
        cells = bare.rstrip().rstrip("|").count("|")  # a row may omit its closing pipe
        header = cells if header is None else header
        assert cells == header, f"{where}:{n}: {line[:120]}"


def test_every_committed_table_is_aligned() -> None:
    """The committed reports (written by the driver, some rewritten by hand), the README and the docs."""
    paths = [*sorted((ROOT / "benchmarks" / "results").glob("*.md")), ROOT / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]  # fmt: skip
    assert len(paths) > 10
    for path in paths:
        assert_tables_aligned(path.read_text(), str(path.relative_to(ROOT)))


def test_a_retirement_without_finished_pairs_says_so() -> None:
    from sim.driver.report import retired_lines

    text = "\n".join(retired_lines({"17": [{"when": "2026-12-07 11:35", "pairs": {}}]}))
    assert "- seed 17, 2026-12-07 11:35: no finished pair (only the saved start was replaced)" in text
    text = "\n".join(retired_lines({"4": [{"when": "t", "pairs": {"alone": {}, "receiver": {}}}]}))
    assert "- seed 4, t: alone, receiver" in text


def test_interval_and_seeds() -> None:
    assert t975(9) == pytest.approx(2.262, abs=1e-3) and t975(60) == pytest.approx(2.000, abs=2e-3)
    m, lo, hi = t_interval([0.1, 0.2, 0.3, 0.4])  # mean 0.25, sd 0.1291, t(3) 3.182
    assert m == pytest.approx(0.25) and hi - m == pytest.approx(3.182 * 0.129099 / 2, rel=1e-3) and lo < m
    assert parse_seeds("0-3,7") == [0, 1, 2, 3, 7]


def het_mapping() -> dict:
    return yaml.safe_load((ROOT / "configs" / "sim" / "controls-het.yaml").read_text())


def test_registration_hash_covers_the_setting_not_how_it_runs() -> None:
    m = het_mapping()
    h = registration_hash(m)
    assert registration_hash({**m, "seeds": [5], "workers": 1, "quick": {}}) == h  # how it runs
    amended = json.loads(json.dumps(m, default=str))
    amended["registration"]["amendments"].append({"date": "2026-12-01", "change": "x", "before": "abc"})
    assert registration_hash(amended) == h  # the history is not the registration
    for path, value in (("steps", 61), ("node.learner.lr", 3e-4), ("registration.readout", 30)):
        changed = json.loads(json.dumps(m, default=str))
        *parents, leaf = path.split(".")
        node = changed
        for p in parents:
            node = node[p]
        node[leaf] = value
        assert registration_hash(changed) != h, path


def test_a_changed_registration_is_refused_unless_an_amendment_names_it(tmp_path: Path) -> None:
    reg = Registration.model_validate(het_mapping()["registration"])
    old = {"registration": {"hash": "0123456789abcdef"}}
    with pytest.raises(SystemExit, match="made under registration 0123456789abcdef"):
        provenance.check_results(old, reg, "fedcba9876543210", tmp_path / "x.json")
    provenance.check_results(old, reg, "0123456789abcdef", tmp_path / "x.json")  # the same
    provenance.check_results({"pairs": {}}, reg, "fedcba9876543210", tmp_path / "x.json")  # made before hashes
    change = {"date": "2026-12-01", "change": "c", "before": "0123456789abcdef"}
    amended = Registration.model_validate({**het_mapping()["registration"], "amendments": [change]})
    provenance.check_results(old, amended, "fedcba9876543210", tmp_path / "x.json")
    assert provenance.base_hash(amended, "fedcba9876543210") == "0123456789abcdef"


def test_a_changed_yaml_refuses_the_committed_results_and_an_amendment_admits_them(tmp_path: Path) -> None:
    """End to end on the committed het results: a rewritten target is refused; recorded as an amendment naming the
    hash the results were made under, it is accepted and printed."""
    shutil.copy(ROOT / "benchmarks" / "results" / "controls_het.json", tmp_path)
    made = json.loads((tmp_path / "controls_het.json").read_text())["registration"]["hash"]
    m = het_mapping()
    m["registration"]["target"]["all"] = [{"beats": "alone"}]
    config = tmp_path / "controls-het.yaml"
    config.write_text(yaml.safe_dump(m, sort_keys=False))
    args = [str(config), "--analyze", "--out", str(tmp_path), "--work", str(tmp_path / "none")]
    with pytest.raises(SystemExit, match=f"made under registration {made}"):
        main(args)
    m["registration"]["amendments"].append({"date": "2026-12-01", "change": "target: alone only", "before": made})
    config.write_text(yaml.safe_dump(m, sort_keys=False))
    assert main(args) == 0
    text = (tmp_path / "controls_het.md").read_text()
    assert f"2026-12-01: target: alone only (replaced registration `{made}`)" in text
    assert "**Target met** by share, receiver, stronger" not in text and "**Target met** by" in text
    assert json.loads((tmp_path / "controls_het.json").read_text())["registration"]["hash"] != made


def arms_of(ends: dict[str, list[float]], reg: Registration) -> dict:
    return {a: {"seeds": list(range(len(v))), **{m: {"start": [0.0] * len(v), "end": v} for m in reg.metrics}}
            for a, v in ends.items()}  # fmt: skip


def transfer_registration(**target: object) -> Registration:
    return Registration.model_validate({
        "question": "q?", "results": "t", "seeds": [0, 1, 2],
        "arms": {"alone": {"role": "control"}, "alone-best": {"role": "control"}, "trace": {"role": "treatment"}},
        "parts": {"lacking": {0: "b", 1: "a"}, "known": {0: "a", 1: "b", 2: "b", 3: "a"}}, "measured": [0, 1],
        "metrics": {"gap": {"hook": "gap_closed", "part": "lacking"}},
        "target": {"arms": ["trace"], **target},
    })  # fmt: skip


def test_verdict_beats_the_better_of_two_controls_and_reads_levels() -> None:
    reg = transfer_registration(all=[{"beats": ["alone", "alone-best"]}, {"at_least": 0.5},
                                     {"arm": "alone", "at_most": 0.05}])  # fmt: skip
    arms = arms_of({"alone": [0.0, 0.01, 0.02], "alone-best": [0.30, 0.32, 0.31], "trace": [0.6, 0.62, 0.61]}, reg)
    v = analysis.verdict(arms, reg)
    assert v["met"] and v["by"] == ["trace"] and "(the better of alone, alone-best)" in v["checks"]["trace"][0]["line"]
    assert "alone-best" in v["checks"]["trace"][0]["line"].split("=")[0]
    arms["trace"]["gap"]["end"] = [0.31, 0.33, 0.32]  # beats alone, not alone at its best rate
    assert not analysis.verdict(arms, reg)["met"]
    arms["trace"]["gap"]["end"] = [0.6, 0.62, 0.61]
    arms["alone"]["gap"]["end"] = [0.1, 0.1, 0.1]  # alone closes more than 5%
    assert not analysis.verdict(arms, reg)["met"]
    assert not analysis.verdict(arms_of({"trace": [0.6, 0.6]}, reg), reg)["complete"]
    undefined = arms_of({"alone": [0.0, 0.0, 0.0], "alone-best": [0.1, float("nan"), 0.1], "trace": [0.6, 0.6, 0.6]},
                        reg)  # fmt: skip
    for names in (["alone", "alone-best"], ["alone-best", "alone"]):  # a control that cannot be read is never skipped
        assert analysis.better_of(undefined, names, "gap") == "alone-best"
    assert not analysis.verdict(undefined, reg)["met"]
    margin = transfer_registration(all=[{"beats": "alone", "above": -0.01}])
    close = arms_of({"alone": [0.50, 0.50, 0.50], "trace": [0.499, 0.498, 0.4995]}, margin)
    assert analysis.verdict(close, margin)["met"]  # not worse than alone by more than 0.01


def test_the_rule_is_read_beside_the_verdict_for_amended_arms_without_changing_the_answer() -> None:
    reg = Registration.model_validate({
        "question": "q?", "results": "t", "seeds": [0, 1, 2],
        "arms": {"alone": {"role": "control"}, "trace": {"role": "treatment"}, "late": {"role": "treatment"}},
        "metrics": {"gap": {}}, "target": {"arms": ["trace"], "beside": ["late"], "all": [{"beats": "alone"}]},
    })  # fmt: skip
    arms = arms_of({"alone": [0.0, 0.01, 0.02], "trace": [0.0, 0.02, 0.01], "late": [0.5, 0.52, 0.51]}, reg)
    v = analysis.verdict(arms, reg)
    assert not v["met"] and v["by"] == [] and list(v["checks"]) == ["trace"]  # the late arm is not a candidate
    assert v["beside"]["late"]["met"] and "late - alone" in v["beside"]["late"]["checks"][0]["line"]
    assert v["complete"] and v["beside"]["late"]["complete"]
    arms["late"]["gap"]["end"] = [0.0, 0.0, 0.0]
    assert not analysis.verdict(arms, reg)["beside"]["late"]["met"]
    short = arms_of({"alone": [0.0, 0.01, 0.02], "trace": [0.0, 0.02, 0.01], "late": [0.5, 0.52]}, reg)
    v = analysis.verdict(short, reg)  # a late arm short of seeds leaves the registered verdict complete
    assert v["complete"] and not v["beside"]["late"]["complete"]
    target = {"arms": ["trace"], "all": [{"beats": "alone"}]}
    plain = Registration.model_validate({**reg.model_dump(), "target": target})
    assert "beside" not in analysis.verdict(arms, plain)  # results written before it are reread unchanged
    with pytest.raises(ValueError, match="both candidates and read beside"):
        Registration.model_validate({**reg.model_dump(), "target": {"arms": ["trace"], "beside": ["trace"],
                                                                      "all": [{"beats": "alone"}]}})  # fmt: skip
    with pytest.raises(ValueError, match="nope"):
        Registration.model_validate({**reg.model_dump(), "target": {"arms": ["trace"], "beside": ["nope"],
                                                                      "all": [{"beats": "alone"}]}})  # fmt: skip


def test_gap_closed_reads_each_node_against_the_peers_that_know_its_family() -> None:
    reg = transfer_registration(all=[{"at_least": 0.5}])

    def cells(v: dict[int, dict[str, float]]) -> dict:
        return {str(i): {f: {"accuracy": x} for f, x in fams.items()} for i, fams in v.items()}

    start = cells({0: {"a": 0.6, "b": 0.1}, 1: {"a": 0.2, "b": 0.7}, 2: {"a": 0.0, "b": 0.5}, 3: {"a": 0.8, "b": 0.0}})
    end = cells({0: {"a": 0.6, "b": 0.4}, 1: {"a": 0.5, "b": 0.7}, 2: {"a": 0.0, "b": 0.5}, 3: {"a": 0.8, "b": 0.0}})
    record = {"per_node": {"0": start, "10": end}}
    # node 0 lacks b: peers 1 and 2 know it at (0.7 + 0.5) / 2 = 0.6, so (0.4 - 0.1) / (0.6 - 0.1) = 0.6;
    # node 1 lacks a: peers 0 and 3 at 0.7, so (0.5 - 0.2) / (0.7 - 0.2) = 0.6
    assert metrics.value(record, reg, "gap", "10") == pytest.approx(0.6)
    assert metrics.value(record, reg, "gap", "0") == 0.0
    metrics.check_hooks(reg)
    with pytest.raises(SystemExit, match="needs registration parts"):
        metrics.check_hooks(reg.model_copy(update={"parts": {"lacking": reg.parts["lacking"]}}))


def test_per_seed_paths_draw_the_warm_start_from_the_seed() -> None:
    sim = load_sim_config(str(ROOT / "configs" / "sim" / "controls-het.yaml"), [], quick=True)
    sim = sim.model_copy(
        update={"registration": sim.registration.model_copy(update={"per_seed": ["node.model.builtin.seed"]})}
    )
    for seed in (3, 7):
        assert seed_sim(sim, seed).node_config("alone", 1, seed).model.builtin["seed"] == seed
    with pytest.raises(ConfigError, match="eval.at_start: true"):  # one start for every seed contradicts per_seed
        load_sim_config(str(ROOT / "configs" / "sim" / "controls-het.yaml"),
                        ["registration.per_seed=[node.model.builtin.seed]", "node.eval.at_start=false"])  # fmt: skip
    assert seed_sim(sim, 3).node_config("alone", 0, 3).model.builtin["families"] == sim.node_config(
        "alone", 0, 3).model.builtin["families"]  # fmt: skip


@pytest.mark.timeout(900)
def test_quick_run_records_its_registration_and_resumes_with_nothing_to_run(tmp_path: Path, capsys) -> None:
    args = [str(ROOT / "configs" / "sim" / "controls-het.yaml"), "--quick", "--seeds", "0-1", "--workers", "2"]
    args += ["--only", "alone,receiver", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    args += ["--set", f"node.model.cache_dir={tmp_path / 'cache'}", "--set", "node.eval.at_start=false"]
    assert main(args) == 0
    data = json.loads((tmp_path / "out" / "controls_het_quick.json").read_text())
    assert set(data["pairs"]) == {"alone", "receiver"} and set(data["pairs"]["alone"]) == {"0", "1"}
    pair = data["pairs"]["receiver"]["1"]
    assert pair["registration"] == data["registration"]["hash"] and pair["commit"]
    assert set(pair["per_node"]["2"]) == {"0", "1"}  # every node's own numbers, for derived metrics
    # the shared start (eval.at_start: false): evaluated once, every pair's step 0
    assert (
        pair["steps"]["0"] == data["shared_start"]["record"]
        and pair["per_node"]["0"] == data["shared_start"]["per_node"]
    )
    row = next(c for c in data["comparisons"] if (c["arm"], c["control"]) == ("receiver", "alone"))
    ends = data["arms"]
    assert row["exact"]["diff"][0] == pytest.approx(
        ends["receiver"]["exact"]["end"][0] - ends["alone"]["exact"]["end"][0]
    )
    assert "interim" in data["verdict"]["text"]
    text = (tmp_path / "out" / "controls_het_quick.md").read_text()
    assert "| receiver | alone | 2 |" in text and "| share |" not in text and "## The start\n" in text
    # a later session without the run directory: the JSON keeps the finished pairs, nothing runs again
    shutil.rmtree(tmp_path / "work")
    capsys.readouterr()
    assert main(args) == 0
    assert "0 pairs to run" in capsys.readouterr().err
    again = json.loads((tmp_path / "out" / "controls_het_quick.json").read_text())
    assert again["comparisons"] == data["comparisons"] and again["pairs"] == data["pairs"]
    assert again["shared_start"] == data["shared_start"]
    # another setting (more steps) is another registration: refused
    with pytest.raises(SystemExit, match="made under registration"):
        main([*args, "--set", "steps=3"])


def test_saved_pairs_survive_fields_added_since_but_not_changed_ones(capsys) -> None:
    """A long experiment outlives code changes: an option added to the node config since its pairs ran (at its
    default) keeps them, named; a changed setting does not."""
    from sim.driver.pairs import saved_pairs, settings_key

    then = {"experiment": {"steps": 60}, "arm": {"name": "alone"}, "nodes": [{"learner": {"lr": 1e-4}}]}
    old = {
        "pairs": {"alone": {"0": {"steps": {}}}},
        "arm_keys": {"alone": settings_key(then)},
        "arm_settings": {"alone": then},
    }
    assert saved_pairs(old, {"alone": then}, "r.json") == {"alone": {0: {"steps": {}}}}
    added = json.loads(json.dumps(then))
    added["nodes"][0]["learner"]["guidance_gamma"] = 0.1
    assert saved_pairs(old, {"alone": added}, "r.json") == {"alone": {0: {"steps": {}}}}
    assert "nodes.0.learner.guidance_gamma" in capsys.readouterr().err
    changed = json.loads(json.dumps(added))
    changed["nodes"][0]["learner"]["lr"] = 3e-5
    assert saved_pairs(old, {"alone": changed}, "r.json") == {}
    assert "differs at nodes.0.learner.lr" in capsys.readouterr().err
    assert saved_pairs(old, {"alone": changed}, "r.json", analyze=True)  # re-reading keeps every pair


#: Registrations whose results were made before the driver, read in with ``--legacy``: YAML, old JSON, and the
#: figures the old scripts reported to three places (docs/benchmarks.md cites them), as (arm, metric, mean).
LEGACY_IMPORTS = {
    "b7-lab": ("b7_lab", [("alone", "gain", 0.098), ("alone", "pass@8", 0.073)]),
    "b6-real": ("b6_real", [("ht_mnpo", "gain", 0.115), ("td_mnpo", "gain", 0.113), ("dpo", "gain", 0.102)]),
    "lab-gate": (
        "lab_gate",
        [("traces", "greedy_add", 0.88), ("traces", "greedy_sub", 1.0), ("bare", "greedy_sub", 0.03)],
    ),
}


@pytest.mark.parametrize("name", sorted(LEGACY_IMPORTS))
def test_legacy_results_read_in_and_reanalyse_to_the_same_values(name: str, tmp_path: Path) -> None:
    """B7-lab, B6-real and the lab gate: their committed driver JSON re-analyses to itself, and reading the old
    script's JSON in again gives the same pairs and the figures the old script reported."""
    import statistics

    old, figures = LEGACY_IMPORTS[name]
    config, results = ROOT / "configs" / "sim" / f"{name}.yaml", ROOT / "benchmarks" / "results"
    stem = load_sim_config(str(config)).registration.results
    committed = json.loads((results / f"{stem}.json").read_text())
    shutil.copy(results / f"{stem}.json", tmp_path)
    assert main([str(config), "--analyze", "--out", str(tmp_path), "--work", str(tmp_path / "none")]) == 0
    again = json.loads((tmp_path / f"{stem}.json").read_text())
    for key in ("arms", "comparisons", "verdict", "baseline", "pairs", "arm_keys"):
        assert again.get(key) == committed.get(key), key
    fresh = tmp_path / "fresh"
    assert main([str(config), "--analyze", "--out", str(fresh), "--work", str(tmp_path / "none"),
                 "--legacy", str(results / f"{old}.json")]) == 0  # fmt: skip
    imported = json.loads((fresh / f"{stem}.json").read_text())
    assert imported["pairs"] == committed["pairs"] and imported["verdict"] == committed["verdict"]
    for arm, metric, mean in figures:
        assert statistics.fmean(committed["arms"][arm][metric]["end"]) == pytest.approx(mean, abs=5e-4)


def test_gain_over_start_and_share_of_read_the_registered_rules() -> None:
    """B7-lab: the gain beats its own start beyond 2 sd but misses +0.10 (not met); the lab gate: bare answers as a
    share of traces; B6-real: neither MNPO arm beats DPO, and the one-seed reference arm leaves the verdict final."""
    results = ROOT / "benchmarks" / "results"
    b7 = json.loads((results / "b7_lab_registered.json").read_text())["verdict"]
    assert not b7["met"] and [c["ok"] for c in b7["checks"]["alone"]] == [False, True, True, True, True]
    gate = json.loads((results / "lab_gate_registered.json").read_text())["verdict"]
    assert gate["met"] and gate["by"] == ["traces"]
    b6 = json.loads((results / "b6_real_registered.json").read_text())["verdict"]
    assert not b6["met"] and b6["complete"]


def test_gap_closed_is_nan_where_there_is_no_gap_and_the_stats_carry_it() -> None:
    import math

    from sim.driver.stats import interval, mean_sd

    reg = transfer_registration(all=[{"at_least": 0.5}])
    flat = {str(i): {"a": {"accuracy": 0.0}, "b": {"accuracy": 0.0}} for i in range(4)}  # untrained quick models
    assert math.isnan(metrics.value({"per_node": {"0": flat, "10": flat}}, reg, "gap", "10"))
    assert all(math.isnan(v) for v in interval([0.5, math.nan, 0.1]))
    assert mean_sd([math.nan, 0.2]) == "nan ± nan"


def test_a_node_without_a_gap_is_undefined_or_left_out_as_registered() -> None:
    """A seed whose specialist's warm start failed: node 0 starts above its peers on the family it lacks. As first
    registered the pair's gap is NaN; with ``no_gap: left_out`` it is node 1's ratio alone, and NaN only when no
    measured node has a gap."""
    import math

    reg = transfer_registration(all=[{"at_least": 0.5}])
    start = {"0": {"a": 0.9, "b": 0.4}, "1": {"a": 0.1, "b": 0.2}, "2": {"a": 0.0, "b": 0.3}, "3": {"a": 0.5, "b": 0.0}}
    end = {"0": {"a": 0.9, "b": 0.6}, "1": {"a": 0.4, "b": 0.2}, "2": {"a": 0.0, "b": 0.3}, "3": {"a": 0.5, "b": 0.0}}
    cells = lambda v: {i: {f: {"accuracy": x} for f, x in fams.items()} for i, fams in v.items()}  # noqa: E731
    record = {"per_node": {"0": cells(start), "10": cells(end)}}
    # node 0 lacks b: its peers 1 and 2 start at 0.25 < 0.4 (no gap); node 1 lacks a: peers 0 and 3 at 0.7, so
    # (0.4 - 0.1) / (0.7 - 0.1) = 0.5
    assert math.isnan(metrics.value(record, reg, "gap", "10"))
    left_out = reg.model_copy(update={"metrics": {"gap": reg.metrics["gap"].model_copy(update={"no_gap": "left_out"})}})
    assert metrics.value(record, left_out, "gap", "10") == pytest.approx(0.5)
    assert metrics.value(record, left_out, "gap", "0") == 0.0
    flat = {str(i): {"a": {"accuracy": 0.0}, "b": {"accuracy": 0.0}} for i in range(4)}
    assert math.isnan(metrics.value({"per_node": {"0": flat, "10": flat}}, left_out, "gap", "10"))


def test_analyze_reads_per_seed_starts_a_run_left_on_disk(tmp_path: Path) -> None:
    """A per-seed experiment run with several workers keeps its JSON only after each seed's pairs: ``--analyze`` of
    what an interrupted run left on disk pairs each seed's pairs with that seed's start, read from its directory."""
    args = [str(ROOT / "configs" / "sim" / "transfer-het.yaml"), "--quick", "--seeds", "0-1", "--workers", "2"]
    args += ["--only", "alone", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    args += ["--set", f"node.model.cache_dir={tmp_path / 'cache'}"]
    assert main(args) == 0
    out = tmp_path / "out" / "transfer_het_quick.json"
    ran = json.loads(out.read_text())
    out.unlink()  # as if the run had stopped before writing it
    assert main([*args, "--analyze"]) == 0
    read = json.loads(out.read_text())
    assert set(read["pairs"]["alone"]) == {"0", "1"}
    for seed in ("0", "1"):
        assert read["pairs"]["alone"][seed]["per_node"]["0"] == ran["seed_starts"][seed]["per_node"]
    assert read["arms"]["alone"]["gap"] == ran["arms"]["alone"]["gap"]


def test_a_reread_writes_an_arms_settings_only_where_todays_are_provably_the_ones_it_ran_with(tmp_path: Path) -> None:
    """An arm added by amendment and first written by ``--analyze`` had no settings in the JSON: today's are written
    for it when its recorded key is today's key, never when the key differs."""
    from sim.driver import pairs

    shutil.copy(ROOT / "benchmarks" / "results" / "controls_het.json", tmp_path)
    path = tmp_path / "controls_het.json"
    old = json.loads(path.read_text())
    sim = load_sim_config(str(ROOT / "configs" / "sim" / "controls-het.yaml"), [])
    now = pairs.arm_settings(sim)
    same, other = "alone", "labels"
    unrecorded = "receiver"
    old["arm_keys"][same] = pairs.settings_key(now[same])
    old["arm_keys"][other] = "0" * 16
    old["arm_keys"].pop(unrecorded)
    for arm in (same, other, unrecorded):
        old.setdefault("arm_settings", {}).pop(arm, None)
    path.write_text(json.dumps(old))
    assert main([str(ROOT / "configs" / "sim" / "controls-het.yaml"), "--analyze", "--out", str(tmp_path),
                 "--work", str(tmp_path / "none")]) == 0  # fmt: skip
    written = json.loads(path.read_text())["arm_settings"]
    assert written[same] == json.loads(json.dumps(now[same])) and other not in written and unrecorded not in written
