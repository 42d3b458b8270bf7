"""The greatest common divisor of two numbers, as an rl-swarm task family (the example of docs/tasks.md).

It imports nothing from rl-swarm: the node finds the class through the entry point in pyproject.toml, makes one
object of it, and calls the methods below. Config (optional): ``max_value``, the largest number (default 100).
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

__all__ = ["GcdPair"]

#: The node's prompt asks for the answer as <answer>...</answer>; the family reads it out of the completion itself.
_ANSWER = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.DOTALL)
_QUESTION = re.compile(r"What is the greatest common divisor of (\d+) and (\d+)\?")


class GcdPair:
    """One family object; every method must give the same result on every machine (peers regenerate items)."""

    name = "gcd_pair"  # equal to the entry point's name; "gcd" is taken by a built-in (reasoning-gym) family
    version = "1"  # a string: raise it whenever items or verdicts change

    def check_config(self, config: dict[str, Any]) -> None:
        """Optional: refuse a config at start-up (raise; the message is shown as one error line)."""
        if set(config) - {"max_value"}:
            raise ValueError(f"unknown keys {sorted(set(config) - {'max_value'})}; gcd_pair takes max_value")
        if not 2 <= int(config.get("max_value", 100)) <= 1_000_000:
            raise ValueError("max_value must be between 2 and 1000000")

    def size(self, config: dict[str, Any]) -> int:
        """Optional: how many item indices the family has under ``config`` (indices run over [0, size))."""
        return int(config.get("max_value", 100)) ** 2

    def generate(self, config: dict[str, Any], seed: int, index: int) -> dict[str, Any]:
        """Item ``index`` of task seed ``seed``: a function of its arguments alone."""
        rng = random.Random(f"{seed}:{index}")
        top = int(config.get("max_value", 100))
        a, b = rng.randint(1, top), rng.randint(1, top)
        return {
            "question": f"What is the greatest common divisor of {a} and {b}?",
            "answer": str(math.gcd(a, b)),
            "metadata": {"a": a, "b": b},
        }

    def score(self, item: Any, completion: str) -> float:
        """The reward of the model's whole completion, in [0, 1]: 1 when its last <answer> is the gold answer."""
        found = _ANSWER.findall(completion)
        return 1.0 if found and found[-1].strip() == item.answer else 0.0

    def split_key(self, question: str) -> str | None:
        """Optional: gcd(a, b) is gcd(b, a), so both orders get one key and land on one side of the split."""
        m = _QUESTION.fullmatch(question)
        if m is None:
            return None  # the node then keys the question by its text
        a, b = sorted(int(n) for n in m.groups())
        return f"gcd:{a},{b}"

    def trace(self, item: Any) -> str:
        """Optional: a worked gold completion, for gold-label training and warm starts."""
        a, b = item.metadata["a"], item.metadata["b"]
        steps = []
        while b:
            steps.append(f"gcd({a}, {b}) = gcd({b}, {a % b})")
            a, b = b, a % b
        return f"<think>{'; '.join(steps) or 'equal'}</think><answer>{a}</answer>"
