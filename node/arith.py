"""The laboratory families ``lab_add`` and ``lab_sub`` and their trace writer: multi-digit arithmetic with working.

Two task families built for the laboratory model (``builtin:lab``, ``node.model.lab``), made exactly as a
reasoning-gym dataset makes its items (:class:`LabDataset`; :func:`register_with_reasoning_gym` adds them to its
registry, which the node does whenever it imports reasoning-gym), so that every other part of the node (task refs,
the held-out split, peers' groups, evaluation) treats them like any reasoning-gym family:

* ``lab_add``: a sum of ``min_terms``..``max_terms`` positive integers, each of ``min_digits``..``max_digits``
  digits (the digit count drawn per term); ``Compute 347 + 285 + 19.``
* ``lab_sub``: a difference ``a - b`` of two such integers with ``a >= b`` (never negative); ``Compute 512 - 178.``

An item is generated from ``random.Random(seed + index)`` as reasoning-gym's own generators do (SPEC 13 gives the
draw order), so any peer regenerates it from its task ref. The verifier is exact: 1.0 when the stated answer equals
the gold decimal integer, else 0.0 (no partial credit, no leading zeros or signs tolerated).

**The trace** (:func:`write_trace`) is column arithmetic written so that every token it asks for depends on a few
nearby tokens: each line peels the last digit off every operand of the line before, so the digits to combine are
always at the end of an operand (next to a ``+``/``-``, a space or the line end), never at a position that must be
counted. ``347 + 285``::

    <think>347+285
    7+5=12 34+28 r2
    4+8+1=13 3+2 r32
    3+2+1=6 r632</think><answer>632</answer>

A line is ``<digits and carry>=<column value> <the operands without their last digits> r<result so far>``: the
column value's last digit is prepended to the result, its tens digit is the carry the next line adds (``+1``,
``+2``; omitted when 0). Subtraction is the same with borrows: the column value ``d1-d2-borrow`` may be negative,
then the digit is ``value + 10`` and the next line subtracts ``-1``; ``512 - 178``::

    512-178
    2-8=-6 51-17 r4
    1-7-1=-7 5-1 r34
    5-1-1=3 r334

Operands that run out of digits drop out; a line whose operands are all gone and whose carry is 0 ends the trace.
The result may have leading zeros (``500 - 498`` ends ``r002``); the answer drops them. A trace costs about 50
tokens for two 3-digit terms on the laboratory tokenizer.

Pure Python: knows nothing about models, tokenizers or the swarm.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

LAB_FAMILIES = ("lab_add", "lab_sub")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class LabConfig:
    """Difficulty knobs of a laboratory family (reasoning-gym dataset config)."""

    min_terms: int = 2
    max_terms: int = 3
    min_digits: int = 2
    max_digits: int = 3
    seed: int | None = None
    #: Items (indices ``0 <= index < size``): the range every built-in family has on a node (SPEC 13), also when the
    #: dataset is made without ``size``.
    size: int = 1_000_000_000

    def validate(self) -> None:
        assert self.size > 0, "size must be positive"
        assert 1 <= self.min_digits <= self.max_digits <= 12, "need 1 <= min_digits <= max_digits <= 12"
        assert 1 <= self.min_terms <= self.max_terms <= 8, "need 1 <= min_terms <= max_terms <= 8"


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def draw_terms(family: str, cfg: LabConfig, rng: random.Random) -> list[int]:
    """The operands of one item, in question order (SPEC 13): ``lab_add`` draws the number of terms, then per term
    its digit count and its value; ``lab_sub`` draws two terms the same way and puts the larger first."""
    if family == "lab_add":
        n = rng.randint(cfg.min_terms, cfg.max_terms)
        return [_number(rng, rng.randint(cfg.min_digits, cfg.max_digits)) for _ in range(n)]
    a, b = (_number(rng, rng.randint(cfg.min_digits, cfg.max_digits)) for _ in range(2))
    return [max(a, b), min(a, b)]


def op_of(family: str) -> str:
    return "+" if family == "lab_add" else "-"


def question_of(terms: list[int], op: str) -> str:
    return "Compute " + f" {op} ".join(str(t) for t in terms) + "."


def answer_of(terms: list[int], op: str) -> int:
    return sum(terms) if op == "+" else terms[0] - sum(terms[1:])


def write_trace(terms: list[int], op: str) -> str:
    """The ``<think>...</think>`` working for ``terms`` combined by ``op`` (``+``; ``-`` for ``a - b`` with
    ``a >= b``), in the format of the module docstring."""
    if op not in "+-" or not terms or any(t < 0 for t in terms):
        raise ValueError(f"no trace for {terms} with {op!r}")
    if op == "-" and (len(terms) != 2 or terms[0] < terms[1]):
        raise ValueError(f"subtraction traces need a - b with a >= b, got {terms}")
    operands = [str(t) for t in terms]
    lines = [op.join(operands)]
    result, carry = "", 0
    while operands or carry:
        digits = [int(o[-1]) for o in operands]
        rest = [o[:-1] for o in operands if len(o) > 1]
        parts = [str(d) for d in digits] + ([str(carry)] if carry else [])
        if op == "+":
            value = sum(digits) + carry
            digit, carry = value % 10, value // 10
        else:
            value = digits[0] - sum(digits[1:]) - carry
            digit, carry = (value + 10, 1) if value < 0 else (value, 0)
        result = str(digit) + result
        tail = (op.join(rest) + " " if rest else "") + "r" + result
        lines.append(f"{op.join(parts)}={value} {tail}")
        operands = rest
    return THINK_OPEN + "\n".join(lines) + THINK_CLOSE


def lab_completion(terms: list[int], op: str, *, trace: bool = True) -> str:
    """The target completion of an item: its trace (unless ``trace`` is off) and ``<answer>gold</answer>``."""
    answer = f"<answer>{answer_of(terms, op)}</answer>"
    return write_trace(terms, op) + answer if trace else answer


def completion_for(item_metadata: dict[str, Any], *, trace: bool = True) -> str:
    """:func:`lab_completion` of a materialized laboratory item (from its metadata)."""
    return lab_completion(list(item_metadata["terms"]), str(item_metadata["op"]), trace=trace)


class LabDataset:
    """One laboratory family's items, as ``reasoning_gym.create_dataset(family, **config)`` gives them once
    :func:`register_with_reasoning_gym` has run (the same config handling, seed and ``__getitem__``), without
    importing reasoning-gym: its package imports every dataset it has (sympy, matplotlib and more, about 4.5 s of CPU
    a process), which a node of the laboratory families never uses."""

    def __init__(self, family: str, config: LabConfig):
        config.validate()
        self.family, self.config = family, config
        self.size = config.size
        self.seed = config.seed if config.seed is not None else random.Random().randint(0, 2**32)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return lab_entry(self.family, self.config, self.seed, idx)

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
        return lab_score(answer, entry)


def lab_dataset(family: str, **kwargs: Any) -> LabDataset:
    """``create_dataset(family, **kwargs)`` of a laboratory family: ``LabConfig(**kwargs)`` (TypeError for an unknown
    key), validated (AssertionError for a bad value)."""
    if family not in LAB_FAMILIES:
        raise ValueError(f"{family!r} is not a laboratory family ({', '.join(LAB_FAMILIES)})")
    return LabDataset(family, LabConfig(**kwargs))


def lab_entry(family: str, cfg: LabConfig, seed: int, idx: int) -> dict[str, Any]:
    """Item ``idx`` of dataset seed ``seed`` (SPEC 13): drawn from ``random.Random(seed + idx)``."""
    terms = draw_terms(family, cfg, random.Random(seed + idx))
    op = op_of(family)
    return {
        "question": question_of(terms, op),
        "answer": str(answer_of(terms, op)),
        "metadata": {"source_dataset": family, "source_index": idx, "terms": terms, "op": op},
    }


def lab_score(answer: str | None, entry: dict[str, Any]) -> float:
    """Exact: 1.0 when the stated answer is the gold decimal integer, else 0.0."""
    return 1.0 if isinstance(answer, str) and answer.strip() == entry["answer"] else 0.0


def register_with_reasoning_gym() -> None:
    """Register ``lab_add`` and ``lab_sub`` with reasoning-gym's dataset registry (once; imports reasoning-gym), so
    that ``reasoning_gym.create_dataset`` makes them like any of its own. The node itself does not need it
    (:class:`LabDataset`); it registers them whenever it imports reasoning-gym for its own datasets."""
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS, register_dataset

    class _LabDataset(ProceduralDataset):
        family = ""

        def __init__(self, config: LabConfig):
            super().__init__(config=config, seed=config.seed, size=config.size)

        def __getitem__(self, idx: int) -> dict[str, Any]:
            return lab_entry(self.family, self.config, self.seed, idx)

        def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
            return lab_score(answer, entry)

    for family in LAB_FAMILIES:
        if family not in DATASETS:
            register_dataset(family, type(f"{family}_dataset", (_LabDataset,), {"family": family}), LabConfig)
