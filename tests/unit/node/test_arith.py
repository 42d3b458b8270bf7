"""The laboratory families and their trace writer (node.arith)."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.arith import LabConfig, answer_of, draw_terms, lab_completion, question_of, write_trace
from node.config import TaskConfig, TaskFamily
from node.tasks import TaskSource, extract_answer
from protocol.types import TaskRef

_LINE = re.compile(r"\A([0-9+-]+)=(-?[0-9]+) (?:([0-9+-]+) )?r([0-9]+)\Z")


def replay(trace: str, op: str) -> str:
    """Check every line of a trace against the column arithmetic it claims; return the result digits."""
    assert trace.startswith("<think>") and trace.endswith("</think>")
    first, *lines = trace[len("<think>") : -len("</think>")].split("\n")
    operands, carry, result = first.split(op), 0, ""
    for line in lines:
        m = _LINE.match(line)
        assert m, line
        parts = [int(x) for x in m.group(1).split(op)]
        digits = [int(o[-1]) for o in operands]
        assert parts == digits + ([carry] if carry else []), line
        value = sum(parts) if op == "+" else parts[0] - sum(parts[1:])
        assert int(m.group(2)) == value, line
        digit = value % 10 if op == "+" else (value + 10 if value < 0 else value)
        carry = value // 10 if op == "+" else int(value < 0)
        operands = [o[:-1] for o in operands if len(o) > 1]
        assert (m.group(3) or "") == op.join(operands), line
        result = str(digit) + result
        assert m.group(4) == result, line
    assert not operands and carry == 0
    return result


@given(st.lists(st.integers(0, 99_999), min_size=1, max_size=5))
def test_an_addition_trace_is_right_line_by_line(terms: list[int]) -> None:
    assert int(replay(write_trace(terms, "+"), "+")) == sum(terms)


@given(st.integers(0, 99_999), st.integers(0, 99_999))
def test_a_subtraction_trace_borrows_right(a: int, b: int) -> None:
    a, b = max(a, b), min(a, b)
    assert int(replay(write_trace([a, b], "-"), "-")) == a - b


def test_the_documented_examples() -> None:
    assert write_trace([347, 285], "+") == "<think>347+285\n7+5=12 34+28 r2\n4+8+1=13 3+2 r32\n3+2+1=6 r632</think>"
    assert write_trace([512, 178], "-") == "<think>512-178\n2-8=-6 51-17 r4\n1-7-1=-7 5-1 r34\n5-1-1=3 r334</think>"
    assert lab_completion([500, 498], "-").endswith("r002</think><answer>2</answer>")  # leading zeros dropped
    assert lab_completion([12, 3], "+", trace=False) == "<answer>15</answer>"


def test_no_trace_for_a_negative_difference() -> None:
    with pytest.raises(ValueError, match="a >= b"):
        write_trace([3, 5], "-")


def test_items_regenerate_from_their_ref_and_score_exactly() -> None:
    fams = [TaskFamily(name="lab_add", config={"min_terms": 2, "max_terms": 3, "min_digits": 2, "max_digits": 3}),
            TaskFamily(name="lab_sub", config={"min_digits": 2, "max_digits": 3})]  # fmt: skip
    src = TaskSource(TaskConfig(families=fams))
    for ref in src.sample(random.Random(0), 40):
        item = src.materialize(ref)
        again = TaskSource(TaskConfig(families=fams)).materialize(TaskRef(**ref.__dict__))
        assert (item.question, item.answer) == (again.question, again.answer)
        terms, op = item.metadata["terms"], item.metadata["op"]
        assert item.question == question_of(terms, op) and item.answer == str(answer_of(terms, op))
        assert int(item.answer) >= 0
        gold = lab_completion(terms, op)
        assert extract_answer(gold) == item.answer and src.score(item, gold) == 1.0
        assert src.score(item, f"<answer>0{item.answer}</answer>") == 0.0  # exact: no leading zeros
        assert src.score(item, "<answer>x</answer>") == 0.0


def test_draws_respect_the_knobs() -> None:
    rng = random.Random(3)
    cfg = LabConfig(min_terms=3, max_terms=3, min_digits=4, max_digits=4)
    for _ in range(50):
        terms = draw_terms("lab_add", cfg, rng)
        assert len(terms) == 3 and all(1000 <= t <= 9999 for t in terms)
        a, b = draw_terms("lab_sub", cfg, rng)
        assert a >= b and b >= 1000


def test_the_laboratory_families_are_made_without_reasoning_gym_and_as_it_makes_them() -> None:
    """A node of the laboratory families does not import reasoning-gym (its package imports every dataset it has:
    seconds of CPU a process); the items are the ones ``reasoning_gym.create_dataset`` gives once they are
    registered, config errors included."""
    import subprocess
    import sys

    import reasoning_gym

    from node.arith import lab_dataset, register_with_reasoning_gym

    code = (
        "import sys\nfrom node.config import TaskConfig\nfrom node.tasks import TaskSource\n"
        "from protocol.types import TaskRef\n"
        "src = TaskSource(TaskConfig(families=[{'name': 'lab_add'}, {'name': 'lab_sub'}]))\n"
        "src.materialize(TaskRef(family='lab_sub', seed=0, index=5))\n"
        "print('reasoning_gym' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
    register_with_reasoning_gym()
    register_with_reasoning_gym()  # once is enough; again is harmless
    for family in ("lab_add", "lab_sub"):
        for config in ({}, {"min_terms": 2, "max_terms": 5, "min_digits": 1, "max_digits": 6, "size": 77}):
            ours = lab_dataset(family, **config, seed=3)
            theirs = reasoning_gym.create_dataset(family, **config, seed=3)
            assert ours.size == theirs.size and ours.seed == theirs.seed == 3
            for idx in (0, 1, 76, 10**6):
                assert ours[idx] == theirs[idx]
                entry = ours[idx]
                for answer in (entry["answer"], f" {entry['answer']} ", "0" + entry["answer"], None):
                    assert ours.score_answer(answer, entry) == theirs.score_answer(answer, entry)
        with pytest.raises(TypeError):
            lab_dataset(family, digits=3)
        with pytest.raises(AssertionError):
            lab_dataset(family, min_digits=5, max_digits=2)
