"""The three-sided split (SPEC 13): which side -- train, dev or test -- a problem lies on, by a hash of its key.

Every problem falls on one of three sides by a 64-bit hash of its *split key* (:func:`split_key`;
``node.canonical``): ``test`` (reported results only), ``dev`` (probes and choices of family, size and
hyper-parameters) and ``train`` (RL prompts, warm starts, peers' groups). Arithmetic keys are value-level and
family-independent (signs folded, brackets and order ignored; the hash leaves the family out), so one problem asked
by chain_sum and by basic_arithmetic lies on one side; word tasks are keyed by their word(s), other families by
question text, both with the family in the hash. A plug-in family may give its own canonical key
(``Family.split_key``); it is hashed the same way (:func:`key_preimage`).

Pure: knows nothing about families' code, models or the swarm.
"""

from __future__ import annotations

import hashlib
from typing import Literal, Protocol

from node.canonical import canonical_problem, is_expression_key
from node.tasks.family import split_wire_family

#: A side of the split.
Side = Literal["train", "dev", "test"]
SIDES: tuple[Side, ...] = ("train", "dev", "test")


class SplitShares(Protocol):
    """The shares of the problem space a split reserves (``TaskConfig``, ``WarmStartConfig``)."""

    @property
    def test_fraction(self) -> float: ...
    @property
    def dev_fraction(self) -> float: ...


def split_key(family: str, question: str) -> str:
    """What the split hashes for ``question``: its canonical problem (``node.canonical``: ``expr:`` value-level
    arithmetic, ``word:``/``words:`` word tasks) where it has one, else the question text. ``family`` is a ref's
    family string, ``name`` or ``name@version``: only the name counts (SPEC 13), here and in :func:`key_preimage`."""
    canonical = canonical_problem(split_wire_family(family)[0], question)
    return question if canonical is None else canonical


def key_preimage(family: str, key: str) -> bytes:
    """The bytes whose SHA-256 decides the side of a problem with split key ``key``: the UTF-8 key alone for an
    arithmetic key (the same problem in any family is one problem), else the UTF-8 family, a NUL byte and the UTF-8
    key; the family's name, never its version, so a new version of a family keeps its sides."""
    return key.encode() if is_expression_key(key) else split_wire_family(family)[0].encode() + b"\0" + key.encode()


def split_preimage(family: str, question: str) -> bytes:
    """:func:`key_preimage` of the question's :func:`split_key`."""
    return key_preimage(family, split_key(family, question))


def split_hash(family: str, question: str) -> int:
    """``hash64``: the first 8 bytes of SHA-256 over :func:`split_preimage`, as a big-endian unsigned integer."""
    return int.from_bytes(hashlib.sha256(split_preimage(family, question)).digest()[:8], "big")


def side_of_hash(hash64: int, test_fraction: float, dev_fraction: float) -> Side:
    """``test`` when ``hash64 < test_fraction * 2**64``, else ``dev`` when ``hash64 < (test_fraction +
    dev_fraction) * 2**64`` (the sum a binary64 addition), else ``train``. Multiplying a binary64 by 2**64 is exact
    and Python compares an int with a float exactly, so every peer draws the same lines."""
    if hash64 < test_fraction * 2**64:
        return "test"
    if hash64 < (test_fraction + dev_fraction) * 2**64:
        return "dev"
    return "train"


def split_side(family: str, question: str, shares: SplitShares) -> Side:
    """The side of ``question`` of ``family`` under ``shares`` (``tasks.test_fraction``, ``tasks.dev_fraction``).
    Depends on the text alone, so every peer with the same shares puts it on the same side."""
    return side_of_hash(split_hash(family, question), shares.test_fraction, shares.dev_fraction)
