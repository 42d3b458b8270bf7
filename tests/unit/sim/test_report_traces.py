"""``sim.report.traces``: the verbatim share of right completions and held-out exact by problem shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.arith import LabConfig, lab_completion, lab_entry
from sim.report.traces import by_shape, columns, main, shape, terms_of_key, verbatim


@pytest.mark.parametrize(
    ("terms", "op", "want"),
    [([512, 178], "-", "3-3 b2"), ([347, 285], "+", "3-3 c2"), ([944, 633], "-", "3-3 b0"), ([264, 55], "-", "3-2 b1"),
     ([88, 228], "+", "3-2 c2"), ([500, 498], "-", "3-3 b2"), ([91, 9], "+", "2-1 c2")],
)  # fmt: skip
def test_shape_counts_the_columns_that_carry_or_borrow(terms: list[int], op: str, want: str) -> None:
    assert shape(terms, op) == want


def test_columns_agree_with_the_written_trace() -> None:
    """A column of the generator's trace that adds a carry or subtracts a borrow (one more term on its left side
    than the operands still alive there) follows each counted column."""
    cfg = LabConfig(min_terms=2, max_terms=3, min_digits=1, max_digits=4)
    for family, op in (("lab_add", "+"), ("lab_sub", "-")):
        for idx in range(200):
            terms = lab_entry(family, cfg, 7, idx)["metadata"]["terms"]
            lines = lab_completion(terms, op).split("</think>")[0].split("\n")[1:]  # one line a column
            alive = [sum(len(str(t)) > i for t in terms) for i in range(len(lines))]
            written = sum(len(line.split("=")[0].split(op)) > n for line, n in zip(lines, alive, strict=True))
            assert columns(terms, op) == written, (terms, lines)


def test_terms_of_a_canonical_key() -> None:
    assert terms_of_key("expr:sum[+264,-55]", "lab_sub") == ([264, 55], "-")
    assert terms_of_key("expr:sum[+17,+345]", "lab_add") == ([345, 17], "+")


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_verbatim_and_by_shape_read_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3}
    meta = lab_entry("lab_sub", LabConfig(**cfg), 0, 5)["metadata"]
    gold = lab_completion(meta["terms"], "-")
    other = gold.replace("<think>", "<think> ")  # right answer, other working
    task = {"family": "lab_sub", "config": cfg, "seed": 0, "index": 5}
    node = tmp_path / "arm" / "seed0" / "node0"
    _write(node / "rollouts.jsonl", [
        {"step": 0, "task": task, "completions": [gold, gold], "rewards": [1.0, 1.0]},
        {"step": 3, "task": task, "completions": [gold, other, "<answer>0</answer>"], "rewards": [1.0, 1.0, 0.0]},
    ])  # fmt: skip
    assert verbatim(node) == {"lab_sub": (4, 3)}
    assert verbatim(node, from_step=1) == {"lab_sub": (2, 1)}
    items = [
        {"key": "expr:sum[+512,-178]", "n_samples": 8, "samples_right": 2},
        {"key": "expr:sum[+500,-498]", "n_samples": 8, "samples_right": 6},
        {"key": "expr:sum[+944,-633]", "n_samples": 8, "samples_right": 8},
    ]
    _write(node / "eval.jsonl", [{"step": 0, "families": {}}, {"step": 9, "families": {"lab_sub": {"items": items}}}])
    assert by_shape(node, "lab_sub") == {"3-3 b0": (1, 1.0), "3-3 b2": (2, 0.5)}
    assert by_shape(node, "lab_add") == {}
    main([str(tmp_path), "--family", "lab_sub", "--nodes", "0"])
    out = capsys.readouterr().out
    assert "lab_sub 3/4" in out and "| 3-3 b2 | 2 | 0.50 |" in out
