"""docs/benchmarks.md's generated tables are what ``benchmarks/tables.py`` writes from the committed result JSON:
a hand edit of a number, or a result JSON committed without its tables, fails here."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from sim.driver import tables  # noqa: E402


def test_committed_tables_are_the_ones_the_result_json_writes() -> None:
    text = tables.DOC.read_text()
    assert tables.BEGIN in text, "docs/benchmarks.md has no generated tables: run python benchmarks/tables.py"
    assert tables.render(text) == text, "docs/benchmarks.md differs from its result JSON: run benchmarks/tables.py"


def test_every_registered_result_has_a_section() -> None:
    names = [res["name"] for _, _, res in tables.registered()]
    assert {"controls-het", "controls-homo", "controls-smol"} <= set(names)
    row = "| receiver | treatment | 10 | 0.077"
    edited = tables.DOC.read_text().replace(row, row[:-1] + "8")
    assert tables.render(edited) != edited


def test_committed_readme_results_are_the_ones_the_result_json_writes() -> None:
    """The README's Results table: one row per registered question, at most 40 words a row, its answer the
    registered verdict's, every number from the JSON; a hand edit fails."""
    text = tables.README.read_text()
    assert tables.README_BEGIN in text, "README.md has no generated Results: run python benchmarks/tables.py"
    assert tables.render_readme(text) == text, (
        "README.md's Results differ from the result JSON: run benchmarks/tables.py"
    )
    rows = [r for r in tables.readme_table()[2:]]
    assert len(rows) == len(tables.registered())
    for row in rows:
        words = [w for w in row.replace("|", " ").split() if "docs/benchmarks.md#" not in w]
        assert len(words) <= 40, row
    answers = {res["name"]: row.split(" | ")[1] for (_, _, res), row in zip(tables.registered(), rows, strict=True)}
    assert answers["controls-het"] == "yes" and answers["b6-real"] == "no" and answers["b7-lab"] == "partly"
    edited = text.replace("+0.031 [+0.019, +0.044]", "+0.032 [+0.019, +0.044]")
    assert edited != text and tables.render_readme(edited) != edited


def test_the_readme_leads_with_the_gap_closed_the_result_json_writes() -> None:
    """The README's first section: every gap-closed experiment's arms, best first, each number from the JSON."""
    text = tables.README.read_text()
    assert tables.GAP_BEGIN in text and text.index(tables.GAP_BEGIN) < text.index("## Set-up")
    lines = tables.gap_table()
    assert any(line.startswith("[transfer-het]") for line in lines)
    tables_rows: list[list[str]] = []  # one table per experiment, each best first
    for line in lines:
        if line.startswith("["):
            tables_rows.append([])
        elif line.startswith("| ") and not line.startswith("| arm"):
            tables_rows[-1].append(line)
    assert tables_rows and all(tables_rows)
    for rows in tables_rows:
        means = [float(row.split("**")[1]) for row in rows]
        assert means == sorted(means, reverse=True)
    first = tables_rows[0][0]
    edited = text.replace(first, first.replace("**", "**0", 1))
    assert edited != text and tables.render_readme(edited) == text


def test_an_interim_answer_says_how_many_seeds_its_arms_have() -> None:
    """An unfinished registration's answer gives the fewest and the most seeds of any arm, so an arm added late
    (one seed) does not read as if the whole experiment had one."""
    reg = next(r for _, r, res in tables.registered() if res["name"] == "transfer-het")
    verdict = {"met": False, "complete": False, "by": [], "checks": {}}
    first, *rest = reg.arms
    arms = {first: {"seeds": [0]}, **{a: {"seeds": list(range(10))} for a in rest}}
    assert tables.answer(reg, {"verdict": verdict, "arms": arms})[0] == "interim (arms at 1-10 of 10 seeds)"
    arms = {a: {"seeds": [0, 1]} for a in reg.arms}
    assert tables.answer(reg, {"verdict": verdict, "arms": arms})[0] == "interim (arms at 2 of 10 seeds)"
    del arms[first]  # a registered arm with no finished pair yet is at 0 seeds, not left out
    assert tables.answer(reg, {"verdict": verdict, "arms": arms})[0] == "interim (arms at 0-2 of 10 seeds)"


def test_an_interim_headline_says_its_candidate_has_not_run_yet() -> None:
    """A registration whose candidate has no finished pair yet (only a control has run) gets a README row that
    says so, not an error from the table writer."""
    reg = next(r for _, r, res in tables.registered() if res["name"] == "transfer-never")
    arms = {"alone": {"gap": {"end": [0.0]}, "seeds": [0]}}
    line = tables.headline(reg, {"arms": arms, "comparisons": []}, "guided")
    assert line == "gap guided: not run yet"


def test_partly_needs_a_condition_of_the_candidate_not_of_a_control() -> None:
    """A target not met whose only holding condition is the one it sets on a control ("alone closes at most 5%")
    answers no; one of the candidate's own conditions holding makes it partly."""
    reg = next(r for _, r, res in tables.registered() if res["name"] == "transfer-never")
    conds = reg.target.all
    assert [c.arm for c in conds].count("alone") == 1 and conds[-1].arm == "alone"
    checks = [{"ok": c.arm == "alone", "line": ""} for c in conds]
    verdict = {"met": False, "complete": True, "by": [], "checks": {"guided": checks}}
    assert tables.answer(reg, {"verdict": verdict, "arms": {}}) == ("no", "guided")
    checks[1]["ok"] = True
    assert tables.answer(reg, {"verdict": verdict, "arms": {}}) == ("partly", "guided")


def test_the_headline_compares_with_the_better_of_the_registered_controls() -> None:
    """Where the target's first comparison names several controls (alone at two rates), the headline reads the
    better one, as the verdict does, not the first named."""
    reg = next(r for _, r, res in tables.registered() if res["name"] == "transfer-het-long")
    arms = {"alone": {"gap": {"end": [0.05, 0.04]}}, "alone-best": {"gap": {"end": [0.12, 0.14]}}}
    comparisons = [{"arm": "peer-trace", "control": c, "gap": {"diff": d}}
                   for c, d in (("alone", [0.6, 0.7]), ("alone-best", [0.5, 0.55]))]  # fmt: skip
    line = tables.headline(reg, {"arms": arms, "comparisons": comparisons}, "peer-trace")
    assert line == "gap peer-trace - alone-best (the better of alone, alone-best): +0.525 [+0.207, +0.843]"
    arms["alone"]["gap"]["end"] = [0.2, 0.3]
    line = tables.headline(reg, {"arms": arms, "comparisons": comparisons}, "peer-trace")
    assert line.startswith("gap peer-trace - alone (the better of alone, alone-best): +0.650")
