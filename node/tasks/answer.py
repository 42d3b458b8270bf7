"""The one answer format of the swarm: the prompt's instruction, and reading the answer out of a completion.

Answers use one format everywhere (prompt instruction, the built-in model's warm-start data, the verifiers): the
text between the last ``<answer>`` and ``</answer>`` of a completion (SPEC 13). Knows nothing about families.
"""

from __future__ import annotations

import re

from node.tasks.family import TaskItem

#: The instruction appended to every question (plain template and chat templates alike).
ANSWER_INSTRUCTION = "Give the final answer as <answer>...</answer>."
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
#: The prompt of tokenizers without a chat template (the built-in model's format).
PLAIN_TEMPLATE = "{question}\n" + ANSWER_INSTRUCTION + "\n"
#: An ``<answer>`` with no other ``<answer>`` before its first ``</answer>`` (SPEC 13: the last opening tag wins).
_ANSWER_RE = re.compile(
    re.escape(ANSWER_OPEN) + r"((?:(?!" + re.escape(ANSWER_OPEN) + r").)*?)" + re.escape(ANSWER_CLOSE), re.DOTALL
)


def format_answer(answer: str) -> str:
    """The completion text that states ``answer`` in the one answer format the verifier reads."""
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def extract_answer(text: str) -> str | None:
    """The stripped text between the last ``<answer>`` that a ``</answer>`` follows and the first ``</answer>``
    after it (SPEC 13), or ``None`` when there is no such pair (an unclosed tag -- a truncated completion --
    counts as no answer). A nested opening tag restarts the answer: ``<answer>dar<answer>ro</answer>`` is
    ``ro``."""
    matches = _ANSWER_RE.findall(text)
    return matches[-1].strip() if matches else None


def is_exact(item: TaskItem, answer: str | None, score: float) -> bool:
    """Whether an extracted ``answer`` is exactly right: equal to the gold answer (both stripped); for an item
    without a single gold answer (``propositional_logic``, a puzzle with many right answers), a verifier score of
    1.0."""
    if answer is None:
        return item.answer is None and score >= 1.0
    if item.answer is None:
        return score >= 1.0
    return answer == item.answer.strip()
