"""Countdown puzzles as an rl-swarm task family (an example plug-in; it imports nothing from rl-swarm).

The family is called ``countdown_numbers``: reasoning-gym already has a ``countdown`` dataset, and a plug-in may not
take a built-in family's name.

An item gives a few numbers and a target: write an expression with ``+``, ``-``, ``*`` and brackets that uses each
given number at most once and equals the target. Many different expressions are right, so the item has no single
gold answer (``answer`` is None); the verifier checks the arithmetic. One solution is kept in the metadata.

Config (every key optional): ``numbers`` (how many numbers, 3..5, default 3) and ``max_number`` (the largest,
2..100, default 9). Item ``index`` of seed ``seed`` is drawn from ``random.Random(f"{seed}:{index}")``, so every peer
regenerates it. Reward: 1.0 for a right expression; otherwise 0.1 for a well-formed expression over the given numbers
plus up to 0.4 for getting close to the target, so a model that is nearly right earns part of it.

Register it in a swarm with ``tasks.families: [{name: countdown_numbers, config: {numbers: 3}}]`` after ``pip install``.
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from typing import Any

__all__ = ["Countdown"]

_ANSWER = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)
_EXPR = re.compile(r"[0-9+\-*() ]{1,200}")


def _value(node: ast.AST, used: list[int]) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
        a, b = _value(node.left, used), _value(node.right, used)
        return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
    raise ValueError("only integers, +, - and * are allowed")


def evaluate(expression: str, numbers: list[int]) -> int | None:
    """The value of ``expression`` when it is well formed and uses only ``numbers`` (each at most once), else None."""
    if not _EXPR.fullmatch(expression.strip()):
        return None
    try:
        used: list[int] = []
        value = _value(ast.parse(expression.strip(), mode="eval").body, used)
    except (SyntaxError, ValueError, RecursionError):
        return None
    return value if not Counter(used) - Counter(numbers) else None


class Countdown:
    """The family object: ``name``, ``version``, ``generate``, ``score``, and the optional ``check_config``,
    ``split_key``."""

    name = "countdown_numbers"
    version = "1"

    def check_config(self, config: dict[str, Any]) -> None:
        unknown = set(config) - {"numbers", "max_number"}
        if unknown:
            raise ValueError(f"unknown countdown config keys {sorted(unknown)}")
        if not 3 <= int(config.get("numbers", 3)) <= 5 or not 2 <= int(config.get("max_number", 9)) <= 100:
            raise ValueError("need 3 <= numbers <= 5 and 2 <= max_number <= 100")

    def generate(self, config: dict[str, Any], seed: int, index: int) -> dict[str, Any]:
        rng = random.Random(f"{seed}:{index}")
        numbers = [rng.randint(1, int(config.get("max_number", 9))) for _ in range(int(config.get("numbers", 3)))]
        # A solution: the numbers in a random order joined by random operators, so the target is reachable.
        order = rng.sample(numbers, len(numbers))
        solution = str(order[0])
        for n in order[1:]:
            solution += f" {rng.choice('+-*')} {n}"
        target = evaluate(solution, numbers)
        listed = ", ".join(map(str, numbers))
        return {
            "question": f"Use the numbers {listed} (each at most once) with + - * and brackets to make {target}.",
            "answer": None,
            "metadata": {"numbers": numbers, "target": target, "solution": solution},
        }

    def score(self, item: Any, completion: str) -> float:
        found = _ANSWER.findall(completion)
        if not found:
            return 0.0
        numbers, target = list(item.metadata["numbers"]), int(item.metadata["target"])
        value = evaluate(found[-1], numbers)
        if value is None:
            return 0.0
        if value == target:
            return 1.0
        return 0.1 + 0.4 * max(0.0, 1.0 - abs(value - target) / max(1, abs(target)))

    def split_key(self, question: str) -> str:
        """The same puzzle whatever the order of its numbers: ``countdown_numbers:<sorted numbers>-><target>``."""
        numbers = sorted(int(n) for n in re.findall(r"\d+", question.split("(")[0]))
        target = question.rstrip(".").rsplit(" ", 1)[-1]
        return f"countdown_numbers:{','.join(map(str, numbers))}->{target}"
