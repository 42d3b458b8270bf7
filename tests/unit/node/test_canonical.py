"""The split's canonical problems (SPEC 13 v2, ``node.canonical``): forms keep the value and the numbers, merge
re-bracketed, reordered and re-signed questions (and the same problem in different families), keep different
problems apart and never crash on bad input. The leak check over configured families is ``test_split_leaks``."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node import canonical
from node.canonical import canonical_expression, canonical_problem, register_expression_family
from node.config import TaskConfig, TaskFamily
from node.tasks import TaskSource, split_hash, split_key, split_side
from protocol.types import TaskRef

CHAIN = "State the final answer to the following arithmetic problem: {} ="


def evaluate_form(form: str) -> int:
    """The value of a canonical form, read independently of the parser (floor division as reasoning-gym)."""
    if form.startswith("-"):
        return -evaluate_form(form[1:])
    if re.fullmatch(r"[0-9]+", form):
        return int(form)
    kind, body = form[:3], form[4:-1]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    if kind == "sum":
        return sum(evaluate_form(p[1:]) * (1 if p[0] == "+" else -1) for p in parts)
    if kind == "mul":
        value = 1
        for p in parts:
            value *= evaluate_form(p)
        return value
    if kind == "div":
        return evaluate_form(parts[0]) // evaluate_form(parts[1])
    assert kind == "neg", form
    return -evaluate_form(parts[0])


def literals(text: str) -> list[str]:
    return sorted(re.findall(r"[0-9]+", text))


def test_forms_keep_the_value_and_the_operands_of_generated_problems() -> None:
    """On reasoning-gym's own items (basic_arithmetic at its default config: brackets, negation, division), the
    form evaluates to the gold answer and holds exactly the question's numbers."""
    cases = [("basic_arithmetic", {}), ("chain_sum", {"min_terms": 2, "max_terms": 5}), ("products", {})]
    for family, config in cases:
        src = TaskSource(TaskConfig(families=[TaskFamily(name=family, config=config)]))
        for index in range(400):
            item = src.materialize(TaskRef(family=family, config=config, seed=0, index=index))
            form = canonical_problem(family, item.question)
            assert form is not None and form.startswith("expr:"), item.question
            assert evaluate_form(form[5:]) == int(item.answer or ""), (item.question, form)
            assert literals(form) == literals(item.question), (item.question, form)


def test_rebracketed_reordered_and_resigned_problems_share_a_form() -> None:
    same = [
        ["7 - 9", "( 7 - 9 )", "( ( 7 ) - 9 )", "7-9", "-9 + 7", "7 + -9"],
        ["3 - 5 + 2", "2 + 3 - 5", "( 2 + 3 ) - 5", "2 + ( 3 - 5 )", "-5 + 3 + 2"],
        ["3 - 6", "3 + -6", "-6 + 3", "-( 6 - 3 )", "-( -3 + 6 )"],
        ["2 - -1", "2--1", "2 - ( -1 )", "2 + 1", "1 + 2"],
        ["5 - ( 3 - 4 )", "5 - 3 + 4", "4 + 5 - 3"],
        ["5 - ( 3 + 4 )", "5 - ( 4 + 3 )", "( 5 ) - ( 4 + 3 )", "-( 3 + 4 ) + 5", "5 - 3 - 4"],
        ["2 * 3 * 4", "4 * ( 3 * 2 )", "( 2 * 4 ) * 3", "-2 * -3 * 4", "-( -2 * 3 ) * 4"],
        ["3 * -4", "-3 * 4", "-( 3 * 4 )", "-4 * 3", "4 * ( -3 )"],
        ["8 / 2 * 3", "3 * ( 8 / 2 )", "( 8 / 2 ) * 3", "-3 * -( 8 / 2 )"],
        ["( 1 + 2 ) * -3", "-3 * ( 2 + 1 )", "( -1 - 2 ) * 3", "-( 1 + 2 ) * 3"],
        ["( 1 - 2 ) * 3", "( 2 - 1 ) * -3", "3 * ( -2 + 1 )"],
        ["-0", "0", "-( 0 )"],
    ]
    for group in same:
        assert len({canonical_expression(e) for e in group}) == 1, (group, [canonical_expression(e) for e in group])


def test_signs_fold_into_documented_forms() -> None:
    assert canonical_expression("3 - 6") == "sum[+3,-6]"
    assert canonical_expression("3 * -4") == "-mul[3,4]"
    assert canonical_expression("-8 / 2") == "div[-8,2]"
    assert canonical_expression("-( 8 / 2 )") == "-div[8,2]"
    assert canonical_expression("0 * -3") == "mul[0,3]"


def test_different_problems_get_different_forms() -> None:
    """Conservative: the same value or the same numbers is not the same problem."""
    pairs = [
        ("7 - 9", "9 - 7"),
        ("3 + 4", "1 + 6"),
        ("3 - 5", "5 - 3"),
        ("2 - 1", "2 + 1"),
        ("5 - ( 3 - 4 )", "5 - 3 - 4"),
        ("3 * 4", "3 * -4"),
        ("8 / 2 * 3", "8 / ( 2 * 3 )"),
        ("8 / 4", "4 / 8"),
        ("-8 / 2", "-( 8 / 2 )"),  # floor division: -7 // 2 != -(7 // 2)
        ("8 / -2", "-8 / 2"),
        ("2 * 3 + 4", "2 * ( 3 + 4 )"),
        ("-( 5 )", "-5 + 0"),
        ("( 1 - 2 ) * 3", "( 1 - 2 ) * -3"),
    ]
    for a, b in pairs:
        assert canonical_expression(a) != canonical_expression(b), (a, b)


def test_one_problem_in_two_families_has_one_key_hash_and_side() -> None:
    """chain_sum and basic_arithmetic share problems; v1 hashed the family with them (8 of 48 chain_sum test items
    were basic_arithmetic training prompts). Here every problem the two default families share lies on one side."""
    shares = TaskConfig()
    assert split_key("chain_sum", CHAIN.format("3 - 6")) == split_key("basic_arithmetic", "Calculate 3 + -6.")
    assert split_hash("chain_sum", CHAIN.format("3 - 6")) == split_hash("basic_arithmetic", "What is -6 + 3?")
    families = {f.name: f for f in shares.families}
    keys: dict[str, dict[str, str]] = {}
    for name in ("chain_sum", "basic_arithmetic"):
        src = TaskSource(TaskConfig(families=[families[name]]))
        keys[name] = {}
        for index in range(1500):
            item = src.materialize(TaskRef(family=name, config=families[name].config, seed=0, index=index))
            keys[name][split_key(name, item.question)] = split_side(name, item.question, shares)
    shared = set(keys["chain_sum"]) & set(keys["basic_arithmetic"])
    assert len(shared) > 20, len(shared)
    assert {keys["chain_sum"][k] for k in shared} >= {"train", "test"}  # the shared problems are spread over sides
    assert all(keys["chain_sum"][k] == keys["basic_arithmetic"][k] for k in shared)


def test_any_family_with_a_template_wording_is_arithmetic() -> None:
    """A laboratory family asking ``Compute 347 + 285.`` needs no registration; a new wording registers its
    template, after which its questions share keys with every other family's."""
    assert split_key("lab_sum", "Compute 347 + 285.") == split_key("basic_arithmetic", "Calculate 285 + 347.")
    assert split_hash("lab_sum", "Compute 347 + 285.") == split_hash("chain_sum", CHAIN.format("285 + 347"))
    question = "Work out 12 - 5 now."
    assert canonical_problem("lab_new", question) is None
    before = list(canonical._EXPRESSION_TEMPLATES), set(canonical._ARITHMETIC_FAMILIES)
    try:
        register_expression_family("lab_new", r"Work out (.+) now\.")
        assert canonical_problem("lab_new", question) == "expr:sum[+12,-5]"
        assert split_key("lab_new", question) == split_key("chain_sum", CHAIN.format("-5 + 12"))
        assert "lab_new" in canonical.arithmetic_families()
        with pytest.raises(ValueError, match="exactly one group"):
            register_expression_family("lab_bad", r"(\d+) plus (\d+)")
    finally:
        canonical._EXPRESSION_TEMPLATES[:], canonical._ARITHMETIC_FAMILIES = before[0], before[1]


_LEAVES = st.integers(min_value=0, max_value=99).map(str)


def _expressions(max_leaves: int = 6) -> st.SearchStrategy[str]:
    """Random expressions over ``+ - *`` (no division: its floor makes sign rules differ), brackets, unary minus."""

    def extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(children, st.sampled_from(["+", "-", "*"]), children).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            children.map(lambda e: f"( {e} )"),
            children.map(lambda e: f"-( {e} )"),
        )

    return st.recursive(_LEAVES | _LEAVES.map(lambda x: "-" + x), extend, max_leaves=max_leaves)


@given(_expressions())
def test_random_forms_keep_the_value(expression: str) -> None:
    assert evaluate_form(canonical_expression(expression)) == eval(expression)  # only digits, + - * and brackets


@given(_expressions(3), _expressions(3))
def test_random_sign_folding_twins_share_a_form(a: str, b: str) -> None:
    form = canonical_expression(f"( {a} ) - ( {b} )")
    assert canonical_expression(f"( {a} ) + -( {b} )") == form
    assert canonical_expression(f"-( {b} ) + ( {a} )") == form
    assert canonical_expression(f"-( ( {b} ) - ( {a} ) )") == form
    product = canonical_expression(f"( {a} ) * -( {b} )")
    assert canonical_expression(f"-( {a} ) * ( {b} )") == product == canonical_expression(f"-( ( {b} ) * ( {a} ) )")


@given(st.text(max_size=80), st.sampled_from(["chain_sum", "basic_arithmetic", "products", "spell_backward", "x"]))
def test_any_question_text_gives_a_key_and_never_raises(text: str, family: str) -> None:
    for question in (
        text,
        f"Calculate {text}.",
        f"State the final answer to the following arithmetic problem: {text} =",
    ):
        key = split_key(family, question)
        assert isinstance(key, str)
        assert split_side(family, question, TaskConfig()) in ("train", "dev", "test")


def test_deep_or_long_expressions_fall_back_to_the_text() -> None:
    deep = "Calculate " + "( " * 51 + "1" + " )" * 51 + "."
    assert canonical_problem("basic_arithmetic", deep) is None
    assert split_key("basic_arithmetic", deep) == deep
    ok = "Calculate " + "( " * 50 + "1" + " )" * 50 + "."
    assert canonical_problem("basic_arithmetic", ok) == "expr:1"
    assert canonical_problem("basic_arithmetic", "Calculate " + "1 + " * 600 + "1.") is None
