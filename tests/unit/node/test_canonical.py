"""The held-out split by canonical problem (SPEC 13, ``node.canonical``): forms keep the problem, merge only
re-bracketed or reordered questions, never crash on bad input, and keep held-out problems out of training."""

from __future__ import annotations

import random
import re

from hypothesis import given
from hypothesis import strategies as st

from node.canonical import canonical_expression, canonical_problem
from node.config import EvalConfig, TaskConfig, TaskFamily
from node.model import tiny
from node.tasks import PLAIN_TEMPLATE, TaskSource, heldout_key, is_heldout_question
from protocol.types import TaskRef


def evaluate_form(form: str) -> int:
    """The value of a canonical form, read independently of the parser (floor division as reasoning-gym)."""
    if re.fullmatch(r"-?[0-9]+", form):
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


def test_rebracketed_and_reordered_problems_share_a_form() -> None:
    same = [
        ["7 - 9", "( 7 - 9 )", "( ( 7 ) - 9 )", "7-9"],
        ["3 - 5 + 2", "2 + 3 - 5", "( 2 + 3 ) - 5", "2 + ( 3 - 5 )"],
        ["2 * 3 * 4", "4 * ( 3 * 2 )", "( 2 * 4 ) * 3"],
        ["8 / 2 * 3", "3 * ( 8 / 2 )", "( 8 / 2 ) * 3"],
        ["( 1 + 2 ) * -3", "-3 * ( 2 + 1 )"],
        ["5 - ( 3 + 4 )", "5 - ( 4 + 3 )", "( 5 ) - ( 4 + 3 )"],
        ["2 - -1", "2--1", "2 - ( -1 )"],
    ]
    for group in same:
        assert len({canonical_expression(e) for e in group}) == 1, group


def test_different_problems_get_different_forms() -> None:
    """Conservative: the same value or the same numbers is not the same problem."""
    pairs = [
        ("7 - 9", "9 - 7"),
        ("3 + 4", "1 + 6"),
        ("3 - 5", "-5 + 3"),
        ("2 - -1", "2 + 1"),
        ("5 - ( 3 - 4 )", "5 - 3 - 4"),
        ("5 - ( 3 + 4 )", "-( 3 + 4 ) + 5"),
        ("8 / 2 * 3", "8 / ( 2 * 3 )"),
        ("8 / 4", "4 / 8"),
        ("2 * 3 + 4", "2 * ( 3 + 4 )"),
        ("-( 5 )", "-5 + 0"),
    ]
    for a, b in pairs:
        assert canonical_expression(a) != canonical_expression(b), (a, b)


@given(st.text(max_size=80), st.sampled_from(["chain_sum", "basic_arithmetic", "products", "spell_backward", "x"]))
def test_any_question_text_gives_a_key_and_never_raises(text: str, family: str) -> None:
    for question in (
        text,
        f"Calculate {text}.",
        f"State the final answer to the following arithmetic problem: {text} =",
    ):
        key = heldout_key(family, question)
        assert isinstance(key, str)
        assert is_heldout_question(family, question, 0.5) in (True, False)


def test_deep_or_long_expressions_fall_back_to_the_text() -> None:
    deep = "Calculate " + "( " * 51 + "1" + " )" * 51 + "."
    assert canonical_problem("basic_arithmetic", deep) is None
    assert heldout_key("basic_arithmetic", deep) == deep
    ok = "Calculate " + "( " * 50 + "1" + " )" * 50 + "."
    assert canonical_problem("basic_arithmetic", ok) == "expr:1"
    assert canonical_problem("basic_arithmetic", "Calculate " + "1 + " * 600 + "1.") is None


def test_no_heldout_problem_in_the_warm_start_or_training_draws() -> None:
    """The evaluator's held-out problems appear neither among the warm start's questions (both phases, and the
    tokenizer corpus) nor among a few thousand training draws. The check has teeth: the old text rule's held-out
    questions do share problems with the same warm start."""
    src = TaskSource(TaskConfig())
    eval_cfg = EvalConfig()
    heldout = src.heldout_refs(eval_cfg.items_per_family, eval_cfg.seed)
    held_keys = {
        (ref.family, heldout_key(ref.family, src.materialize(ref).question))
        for refs in heldout.values()
        for ref in refs
    }
    assert len(held_keys) == sum(len(refs) for refs in heldout.values()) >= 4 * 40

    prefix, suffix = PLAIN_TEMPLATE.split("{question}")
    seen: set[tuple[str, str]] = set()
    families = src.families
    for salt, fraction in ((1, 1.0), (2, tiny.DEFAULT_RECIPE.correct_fraction)):
        for prompt, _ in tiny.sft_examples(tiny.DEFAULT_RECIPE, 2000, fraction, salt=salt):
            question = prompt.removeprefix(prefix).removesuffix(suffix)
            for family in families:  # the prompt does not name its family; every family's key is checked
                seen.add((family, heldout_key(family, question)))
    warm_overlap = held_keys & seen
    assert not warm_overlap, sorted(warm_overlap)[:5]

    draws = [src.materialize(ref) for ref in src.sample(random.Random(7), 3000)]
    train_keys = {(it.ref.family, heldout_key(it.ref.family, it.question)) for it in draws}
    assert not held_keys & train_keys, sorted(held_keys & train_keys)[:5]

    # teeth: items held out by question text alone include problems the warm start trains on
    by_text = []
    for family in families:
        config = dict(next(f.config for f in TaskConfig().families if f.name == family))
        for index in range(3000):
            item = src.materialize(TaskRef(family=family, config=config, seed=eval_cfg.seed, index=index))
            if _heldout_by_text(family, item.question):
                by_text.append((family, heldout_key(family, item.question)))
    assert set(by_text) & seen


def _heldout_by_text(family: str, question: str) -> bool:
    """The split before SPEC 13 named canonical problems: SHA-256 over the family, NUL and the question text."""
    import hashlib

    digest = hashlib.sha256(family.encode() + b"\0" + question.encode()).digest()
    return int.from_bytes(digest[:8], "big") < 0.1 * 2**64
