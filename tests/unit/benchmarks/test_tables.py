"""docs/benchmarks.md's generated tables are what ``benchmarks/tables.py`` writes from the committed result JSON:
a hand edit of a number, or a result JSON committed without its tables, fails here."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks import tables  # noqa: E402


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
