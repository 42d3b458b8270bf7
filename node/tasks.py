"""Task items and rewards: reasoning-gym datasets addressed by :class:`~protocol.types.TaskRef`.

A task item is fully determined by its ref ``(family, config, seed, index)``: reasoning-gym generators seed a
fresh ``random.Random`` from ``seed + index`` per item, so any peer regenerates the same question and gold answer
from the ref alone (Open-Thought, *Reasoning Gym*, arXiv 2505.24760). The dataset's virtual ``size`` is not
part of item generation for the families used here, but it bounds valid indices, so it is fixed
(:data:`DEFAULT_SIZE`) unless a family's config names it explicitly -- then it travels inside the ref.

Answers use one format everywhere (prompt instruction, the built-in model's warm-start data, the verifier): the
text between the last ``<answer>`` and ``</answer>`` of a completion. The verifier is the dataset's own
``score_answer`` (partial credit included), clamped to [0, 1]; ``propositional_logic`` has no single gold answer
and is scored against its premises by reasoning-gym.

**Split (SPEC 13, v2).** Every problem falls on one of three sides, by a 64-bit hash of its *split key*
(:func:`split_key`; ``node.canonical``): ``test`` (reported results only), ``dev`` (probes and choices of family,
size and hyper-parameters) and ``train`` (RL prompts, warm starts, peers' groups). Arithmetic keys are value-level
and family-independent (signs folded, brackets and order ignored; the hash leaves the family out), so one problem
asked by chain_sum and by basic_arithmetic lies on one side; word tasks are keyed by their word(s), other families
by question text, both with the family in the hash. The shares are ``tasks.test_fraction`` and
``tasks.dev_fraction`` (:func:`split_side`). Training draws (:meth:`TaskSource.sample`) take train items only,
peers' groups on dev or test items are refused (:meth:`TaskSource.materialize_for_training`), and evaluation reads
one named side (:meth:`TaskSource.split_refs`), so the sides are disjoint on problems whatever the seeds or indices.

Knows nothing about models, tokenizers or prompts' chat formatting (see ``node.model.policy``), nor about who sent a
ref: :meth:`TaskSource.materialize` only accepts the families and configs this node itself trains on, which
keeps hostile refs from making it generate arbitrary datasets.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import random
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import node.arith  # noqa: F401  (registers the laboratory families with reasoning-gym)
from node.canonical import canonical_problem, is_expression_key
from node.config import TaskConfig
from protocol.errors import SwarmError
from protocol.types import Scalar, TaskRef

logger = logging.getLogger(__name__)

#: Virtual dataset size (upper bound on item indices) when a family's config does not set ``size``.
DEFAULT_SIZE = 1_000_000_000
#: The instruction appended to every question (plain template and chat templates alike).
ANSWER_INSTRUCTION = "Give the final answer as <answer>...</answer>."
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
#: The prompt of tokenizers without a chat template (the built-in model's format).
PLAIN_TEMPLATE = "{question}\n" + ANSWER_INSTRUCTION + "\n"
#: An ``<answer>`` with no other ``<answer>`` before its first ``</answer>`` (SPEC 13: the last opening tag wins).
_ANSWER_RE = re.compile(
    re.escape(ANSWER_OPEN) + r"((?:(?!" + re.escape(ANSWER_OPEN) + r").)*?)" + re.escape(ANSWER_CLOSE), re.DOTALL
)

#: The SAPO paper's nine reasoning-gym families (arXiv 2509.08721) plus the default ``chain_sum``.
SAPO_FAMILIES = (
    "base_conversion",
    "basic_arithmetic",
    "arc_1d",
    "bf",
    "propositional_logic",
    "fraction_simplification",
    "decimal_arithmetic",
    "calendar_arithmetic",
    "binary_matrix",
)


#: Redraws of a training index that landed on the dev or test side before giving up (a 20% share needs ~1.25).
_MAX_REDRAWS = 1000


class TaskError(SwarmError):
    """A task ref or family config cannot be materialized here (unknown family, foreign config, bad index)."""


@dataclass
class TaskItem:
    """One materialized task: the question, its gold answer (``None`` when scored otherwise) and the metadata
    reasoning-gym's verifier needs."""

    ref: TaskRef
    question: str
    answer: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


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
    arithmetic, ``word:``/``words:`` word tasks) where it has one, else the question text."""
    canonical = canonical_problem(family, question)
    return question if canonical is None else canonical


def split_preimage(family: str, question: str) -> bytes:
    """The bytes whose SHA-256 decides the side: the UTF-8 :func:`split_key` alone for an arithmetic key (the same
    problem in any family is one problem), else the UTF-8 family, a NUL byte and the UTF-8 key."""
    key = split_key(family, question)
    return key.encode() if is_expression_key(key) else family.encode() + b"\0" + key.encode()


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


def _config_key(config: Mapping[str, Scalar]) -> str:
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))


class _LRU(OrderedDict):
    """A tiny least-recently-used map (``functools.lru_cache`` would key on unhashable configs)."""

    def __init__(self, maxsize: int):
        super().__init__()
        self.maxsize = maxsize

    def get_or(self, key: Any, make: Any) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = make()
        self[key] = value
        if len(self) > self.maxsize:
            self.popitem(last=False)
        return value


def is_exact(item: TaskItem, answer: str | None, score: float) -> bool:
    """Whether an extracted ``answer`` is exactly right: equal to the gold answer (both stripped); for an item
    without a single gold answer (``propositional_logic``), a verifier score of 1.0."""
    if answer is None:
        return False
    if item.answer is None:
        return score >= 1.0
    return answer == item.answer.strip()


class TaskSource:
    """Draws task refs from the configured families, materializes refs (own or peers') and scores completions.

    Deterministic: :meth:`sample` depends only on the ``rng`` passed in, :meth:`materialize` only on the ref.
    """

    def __init__(self, cfg: TaskConfig, *, cache_items: int = 4096):
        with contextlib.redirect_stdout(io.StringIO()):  # its bf dataset prints a row of dots on import
            import reasoning_gym  # noqa: F401  (registers the datasets)
        from reasoning_gym.factory import DATASETS

        if not cfg.families:
            raise TaskError("tasks.families is empty; configure at least one reasoning-gym family")
        self.cfg = cfg
        self._families: list[tuple[str, dict[str, Scalar]]] = []
        self._weights: list[float] = []
        self._allowed: set[tuple[str, str]] = set()
        for fam in cfg.families:
            if fam.name not in DATASETS:
                raise TaskError(f"unknown task family {fam.name!r} (not a reasoning-gym dataset)")
            if "seed" in fam.config:
                raise TaskError(f"task family {fam.name!r}: remove 'seed' from its config (use tasks.seed)")
            self._families.append((fam.name, dict(fam.config)))
            self._weights.append(fam.weight)
            self._allowed.add((fam.name, _config_key(fam.config)))
        self._datasets = _LRU(64)
        self._items = _LRU(cache_items)
        for name, config in self._families:  # fail at start-up, not at the first step, on a bad config
            self._dataset(name, config, cfg.seed)

    @property
    def families(self) -> list[str]:
        """Names of the families this source draws from (and accepts refs for)."""
        return [name for name, _ in self._families]

    def sample(self, rng: random.Random, n: int) -> list[TaskRef]:
        """``n`` training refs: a family drawn by weight, then an index uniform in ``[0, pool_size)``, redrawn
        while the item is not on the train side (a bounded number of times: a family with no train item fails)."""
        picks = rng.choices(range(len(self._families)), weights=self._weights, k=n)
        refs = []
        for i in picks:
            name, config = self._families[i]
            for _ in range(_MAX_REDRAWS):
                ref = TaskRef(
                    family=name, config=dict(config), seed=self.cfg.seed, index=rng.randrange(self.cfg.pool_size)
                )
                if self.side(self.materialize(ref)) == "train":
                    break
            else:
                raise TaskError(f"task family {name!r}: no training item found in {_MAX_REDRAWS} draws")
            refs.append(ref)
        return refs

    def side(self, item: TaskItem) -> Side:
        """The side of ``item`` under this node's shares (:func:`split_side`)."""
        return split_side(item.ref.family, item.question, self.cfg)

    def materialize_for_training(self, ref: TaskRef) -> TaskItem:
        """:meth:`materialize`, refusing (:class:`TaskError`) dev and test items: a peer's group on an evaluation
        question must not reach the learner, or evaluation would stop measuring generalization."""
        item = self.materialize(ref)
        side = self.side(item)
        if side != "train":
            raise TaskError(f"task {ref.family!r} index {ref.index} is on this node's {side} side of the split")
        return item

    def split_refs(self, side: Side, n: int, seed: int) -> dict[str, list[TaskRef]]:
        """Up to ``n`` refs per family on ``side`` with distinct problems (:func:`split_key`), scanning indices
        ``0, 1, ...`` of task seed ``seed`` (deterministic). A family whose problem space is small may yield
        fewer."""
        share = {"test": self.cfg.test_fraction, "dev": self.cfg.dev_fraction}.get(side, 1.0)
        out: dict[str, list[TaskRef]] = {}
        budget = max(1000, int(20 * n / max(share, 1e-6)))
        for name, config in self._families:
            refs: list[TaskRef] = []
            seen: set[str] = set()
            size = self._dataset(name, config, seed).size
            for index in range(min(budget, size)):
                ref = TaskRef(family=name, config=dict(config), seed=seed, index=index)
                item = self._generate(ref)
                key = split_key(name, item.question)
                if key in seen or self.side(item) != side:
                    continue
                seen.add(key)
                refs.append(ref)
                if len(refs) >= n:
                    break
            out[name] = refs
        return out

    def distinct_estimate(self, family_index: int, draws: int, rng: random.Random) -> float:
        """Estimated number of distinct training questions of one family, from ``draws`` random draws: the
        birthday estimate ``draws**2 / (2 * repeats)`` (infinite when no question repeats)."""
        name, config = self._families[family_index]
        questions = []
        for _ in range(draws):
            index = rng.randrange(self.cfg.pool_size)
            questions.append(
                self._generate(TaskRef(family=name, config=dict(config), seed=self.cfg.seed, index=index)).question
            )
        repeats = len(questions) - len(set(questions))
        return float("inf") if repeats == 0 else len(questions) ** 2 / (2 * repeats)

    def warn_if_small(self, total_draws: int, *, probe: int = 2000) -> list[str]:
        """Log one warning line per family whose estimated distinct questions are fewer than this run's expected
        draws of it (``total_draws`` prompts over all families, split by weight); returns the warnings."""
        warnings = []
        total_w = sum(self._weights)
        rng = random.Random(0)
        for i, (name, config) in enumerate(self._families):
            planned = total_draws * self._weights[i] / total_w
            if planned < 2:
                continue
            distinct = self.distinct_estimate(i, min(probe, max(2, int(planned))), rng)
            if distinct < planned:
                msg = (
                    f"task family {name!r} {_config_key(config)} has about {distinct:.0f} distinct questions but "
                    f"this run draws about {planned:.0f}: the node will see repeats and can memorize them; "
                    "raise its difficulty knobs"
                )
                logger.warning(msg)
                warnings.append(msg)
        return warnings

    def accepts(self, ref: TaskRef) -> bool:
        """Whether ``ref`` names a family and config this node trains on (the only refs it materializes)."""
        return (ref.family, _config_key(ref.config)) in self._allowed

    def materialize(self, ref: TaskRef) -> TaskItem:
        """Regenerate the question and gold answer of ``ref`` (cached); :class:`TaskError` for a family or
        config this node does not train on, or an index outside the dataset."""
        if not self.accepts(ref):
            raise TaskError(
                f"task {ref.family!r} with config {_config_key(ref.config)} is not one of this node's families"
            )
        return self._items.get_or(ref.key(), lambda: self._generate(ref))

    def score(self, item: TaskItem, completion_text: str) -> float:
        """Reward in [0, 1]: the answer extracted from ``completion_text`` scored by the dataset's own verifier."""
        answer = extract_answer(completion_text)
        if answer is None:
            return 0.0
        dataset = self._dataset(item.ref.family, dict(item.ref.config), item.ref.seed)
        entry = {"question": item.question, "answer": item.answer, "metadata": item.metadata}
        try:
            reward = float(dataset.score_answer(answer, entry))
        except Exception as e:  # a verifier crashing on garbage text is a wrong answer, not a node failure
            logger.debug("score_answer of %s raised %r on %r", item.ref.family, e, answer[:80])
            return 0.0
        return min(1.0, max(0.0, reward)) if reward == reward else 0.0

    def _dataset(self, name: str, config: dict[str, Scalar], seed: int) -> Any:
        def make() -> Any:
            import reasoning_gym

            kwargs = {"size": DEFAULT_SIZE, **config, "seed": seed}
            try:
                return reasoning_gym.create_dataset(name, **kwargs)
            except (TypeError, ValueError, AssertionError) as e:
                raise TaskError(f"task family {name!r}: invalid config {_config_key(config)}: {e}") from e

        return self._datasets.get_or((name, _config_key(config), seed), make)

    def _generate(self, ref: TaskRef) -> TaskItem:
        if not isinstance(ref.seed, int) or ref.seed < 0:
            raise TaskError(f"task seed must be a non-negative integer, got {ref.seed!r}")
        dataset = self._dataset(ref.family, dict(ref.config), ref.seed)
        if not isinstance(ref.index, int) or not 0 <= ref.index < dataset.size:
            raise TaskError(f"task index {ref.index!r} outside [0, {dataset.size}) for {ref.family!r}")
        with contextlib.redirect_stdout(io.StringIO()):  # some generators print progress dots to stdout
            entry = dataset[ref.index]
        answer = entry.get("answer")
        return TaskItem(
            ref=ref,
            question=entry["question"],
            answer=None if answer is None else str(answer),
            metadata=entry.get("metadata", {}),
        )
