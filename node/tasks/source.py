"""The task source: draws task refs from the configured families, materializes refs (own or peers') and scores.

A task item is fully determined by its ref ``(family, config, seed, index)``: a family generates item ``index`` of
task seed ``seed`` the same way on every machine (reasoning-gym seeds a fresh ``random.Random`` from ``seed + index``
per item; Open-Thought, *Reasoning Gym*, arXiv 2505.24760), so any peer regenerates the same question and gold answer
from the ref alone. The ref's ``family`` names the family's version too (``name@version``,
``node.tasks.family.wire_family``; built-ins are unversioned).

Families are objects behind one interface (``node.tasks.family``): reasoning-gym datasets and the laboratory
families are built in (``node.tasks.builtin``), others come from installed packages (entry point group
``rl_swarm.tasks``) or verifiers environments (``verifiers:<module>``). A plug-in's code runs under
``node.tasks.guard`` (a time limit per call, quarantine of one that hangs), and what it returns is checked: a
plug-in that raises, hangs or returns junk on a peer's item costs one dropped group, counted by reason.

**Split (SPEC 13, v2).** Training draws (:meth:`TaskSource.sample`) take train items only, peers' groups on dev or
test items are refused (:meth:`TaskSource.materialize_for_training`), and evaluation reads one named side
(:meth:`TaskSource.split_refs`), so the sides are disjoint on problems whatever the seeds or indices
(``node.tasks.split``).

Knows nothing about models, tokenizers or prompts' chat formatting (see ``node.model.policy``), nor about who sent a
ref: :meth:`TaskSource.materialize` only accepts the families and configs this node itself trains on, which
keeps hostile refs from making it generate arbitrary datasets.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import math
import random
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from node.config import TaskConfig
from node.tasks.builtin import DEFAULT_SIZE, GymFamily, builtin_family
from node.tasks.family import (
    DEFAULT_ITEMS,
    MAX_ANSWER_CHARS,
    MAX_QUESTION_CHARS,
    Family,
    PluginError,
    TaskError,
    TaskItem,
    config_key,
    split_wire_family,
    wire_family,
)
from node.tasks.guard import PluginGuard
from node.tasks.registry import entry_point_names, resolve_family
from node.tasks.split import Side, key_preimage, side_of_hash, split_key, split_side
from protocol.types import Scalar, TaskRef

logger = logging.getLogger(__name__)

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
__all__ = ["DEFAULT_SIZE", "SAPO_FAMILIES", "TaskSource"]


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


def _installed(name: str) -> bool:
    """Whether a family called ``name`` could be resolved here (without importing a plug-in's code)."""
    if name.startswith("verifiers:"):
        module = name.removeprefix("verifiers:")
        try:
            return bool(module) and importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False
    try:
        return builtin_family(name) is not None or name in entry_point_names()
    except Exception:  # a broken reasoning-gym registry is no reason to fail a peer's group differently
        return False


class TaskSource:
    """Draws task refs from the configured families, materializes refs (own or peers') and scores completions.

    Deterministic: :meth:`sample` depends only on the ``rng`` passed in, :meth:`materialize` only on the ref.
    """

    def __init__(self, cfg: TaskConfig, *, cache_items: int = 4096):
        if not cfg.families:
            raise TaskError("tasks.families is empty; configure at least one task family")
        self.cfg = cfg
        self.guard = PluginGuard(cfg.plugin_timeout_s)
        self._families: list[tuple[str, dict[str, Scalar]]] = []  # (wire family, config)
        self._weights: list[float] = []
        self._allowed: set[tuple[str, str]] = set()
        self._by_wire: dict[str, Family] = {}
        self._by_name: dict[str, Family] = {}
        for fam in cfg.families:
            family = resolve_family(fam.name)  # TaskError: one line naming the family
            if "seed" in fam.config:
                raise TaskError(f"task family {fam.name!r}: remove 'seed' from its config (use tasks.seed)")
            wire = wire_family(fam.name, family.version)
            self._families.append((wire, dict(fam.config)))
            self._weights.append(fam.weight)
            self._allowed.add((wire, config_key(fam.config)))
            self._by_wire[wire] = family
            self._by_name[fam.name] = family
        self._items = _LRU(cache_items)
        self._installed = _LRU(256)
        for wire, config in self._families:  # fail at start-up, not at the first step, on a bad config
            check = getattr(self._by_wire[wire], "check_config", None)
            if check is not None:  # the node's own config, not a peer's item: no time limit (loading may be slow)
                check(config)

    @property
    def families(self) -> list[str]:
        """The ``family`` strings of this source's refs (``name`` or ``name@version``), one per configured family."""
        return [wire for wire, _ in self._families]

    def family(self, ref_family: str) -> Family:
        """The family object behind a ref's ``family`` string this source trains on."""
        return self._by_wire[ref_family]

    # ------------------------------------------------------------------ calls into a family

    def _call(self, wire: str, what: str, fn: Any, *args: Any) -> Any:
        family = self._by_wire[wire]
        if getattr(family, "trusted", False):
            return fn(*args)
        return self.guard.call(wire, what, fn, *args)

    def _size(self, wire: str, config: Mapping[str, Scalar], seed: int) -> int:
        family = self._by_wire[wire]
        if isinstance(family, GymFamily):
            return family.size(config, seed)
        size = getattr(family, "size", None)
        if size is None:
            return DEFAULT_ITEMS
        n = self._call(wire, "size", size, dict(config))
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise PluginError(f"task plug-in {wire!r}: size() returned {n!r}, not a positive int", "plugin_junk")
        return n

    def _generate(self, ref: TaskRef) -> TaskItem:
        if not isinstance(ref.seed, int) or ref.seed < 0:
            raise TaskError(f"task seed must be a non-negative integer, got {ref.seed!r}")
        size = self._size(ref.family, ref.config, ref.seed)
        if not isinstance(ref.index, int) or not 0 <= ref.index < size:
            raise TaskError(f"task index {ref.index!r} outside [0, {size}) for {ref.family!r}")
        family = self._by_wire[ref.family]
        entry = self._call(ref.family, "generate", family.generate, dict(ref.config), ref.seed, ref.index)
        if getattr(family, "trusted", False):
            return TaskItem(ref=ref, question=entry["question"], answer=entry["answer"], metadata=entry["metadata"])
        return TaskItem(ref=ref, **_checked_entry(ref.family, entry))

    # ------------------------------------------------------------------ drawing and the split

    def sample(self, rng: random.Random, n: int) -> list[TaskRef]:
        """``n`` training refs: a family drawn by weight, then an index uniform in ``[0, pool_size)``, redrawn
        while the item is not on the train side (a bounded number of times: a family with no train item fails)."""
        picks = rng.choices(range(len(self._families)), weights=self._weights, k=n)
        refs = []
        for i in picks:
            name, config = self._families[i]
            size = min(self.cfg.pool_size, self._size(name, config, self.cfg.seed))
            for _ in range(_MAX_REDRAWS):
                ref = TaskRef(family=name, config=dict(config), seed=self.cfg.seed, index=rng.randrange(size))
                if self.side(self.materialize(ref)) == "train":
                    break
            else:
                raise TaskError(f"task family {name!r}: no training item found in {_MAX_REDRAWS} draws")
            refs.append(ref)
        return refs

    def split_key(self, item: TaskItem) -> str:
        """The split key of ``item``: its family's own canonical key (``split_key``) where the family has one, else
        the built-in rule (``node.tasks.split.split_key``)."""
        name, _ = split_wire_family(item.ref.family)
        own = getattr(self._by_wire.get(item.ref.family), "split_key", None)
        if own is None:
            return split_key(name, item.question)
        key = self._call(item.ref.family, "split_key", own, item.question)
        if key is None:
            return split_key(name, item.question)
        if not isinstance(key, str) or len(key) > MAX_QUESTION_CHARS:
            raise PluginError(f"task plug-in {item.ref.family!r}: split_key returned {type(key).__name__}",
                              "plugin_junk")  # fmt: skip
        return key

    def side(self, item: TaskItem) -> Side:
        """The side of ``item`` under this node's shares: by the family name (never its version, so a new version
        of a family keeps its sides) and :meth:`split_key`."""
        name, _ = split_wire_family(item.ref.family)
        if getattr(self._by_wire.get(item.ref.family), "split_key", None) is None:
            return split_side(name, item.question, self.cfg)
        digest = hashlib.sha256(key_preimage(name, self.split_key(item))).digest()
        return side_of_hash(int.from_bytes(digest[:8], "big"), self.cfg.test_fraction, self.cfg.dev_fraction)

    def materialize_for_training(self, ref: TaskRef) -> TaskItem:
        """:meth:`materialize`, refusing (:class:`TaskError`) dev and test items: a peer's group on an evaluation
        question must not reach the learner, or evaluation would stop measuring generalization."""
        item = self.materialize(ref)
        side = self.side(item)
        if side != "train":
            raise TaskError(f"task {ref.family!r} index {ref.index} is on this node's {side} side of the split")
        return item

    def split_refs(self, side: Side, n: int, seed: int) -> dict[str, list[TaskRef]]:
        """Up to ``n`` refs per family on ``side`` with distinct problems (:meth:`split_key`), scanning indices
        ``0, 1, ...`` of task seed ``seed`` (deterministic). A family whose problem space is small may yield
        fewer."""
        share = {"test": self.cfg.test_fraction, "dev": self.cfg.dev_fraction}.get(side, 1.0)
        out: dict[str, list[TaskRef]] = {}
        budget = max(1000, int(20 * n / max(share, 1e-6)))
        for name, config in self._families:
            refs: list[TaskRef] = []
            seen: set[str] = set()
            size = self._size(name, config, seed)
            for index in range(min(budget, size)):
                ref = TaskRef(family=name, config=dict(config), seed=seed, index=index)
                item = self._generate(ref)
                key = self.split_key(item)
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
        size = min(self.cfg.pool_size, self._size(name, config, self.cfg.seed))
        questions = []
        for _ in range(draws):
            index = rng.randrange(size)
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
                    f"task family {name!r} {config_key(config)} has about {distinct:.0f} distinct questions but "
                    f"this run draws about {planned:.0f}: the node will see repeats and can memorize them; "
                    "raise its difficulty knobs"
                )
                logger.warning(msg)
                warnings.append(msg)
        return warnings

    # ------------------------------------------------------------------ refs (own and peers')

    def accepts(self, ref: TaskRef) -> bool:
        """Whether ``ref`` names a family (in this version) and config this node trains on (the only refs it
        materializes)."""
        return (ref.family, config_key(ref.config)) in self._allowed

    def refusal(self, ref: TaskRef) -> TaskError:
        """Why ``ref`` is not accepted, as the error a receiver counts: ``task_version`` (a family this node trains
        on, in another version), ``task_unknown`` (no family of that name installed here), else
        ``task_rejected`` (a family or config this node does not train on)."""
        name, version = split_wire_family(ref.family)
        mine = self._by_name.get(name)
        if mine is not None and mine.version != version:
            return TaskError(
                f"task family {name!r} version {version or '(none)'!r} differs from this node's "
                f"{mine.version or '(none)'!r}",
                "task_version",
            )
        if mine is None and not self._installed.get_or(name, lambda: _installed(name)):
            return TaskError(f"task family {name!r} is not installed on this node", "task_unknown")
        return TaskError(f"task {ref.family!r} with config {config_key(ref.config)} is not one of this node's families")

    def materialize(self, ref: TaskRef) -> TaskItem:
        """Regenerate the question and gold answer of ``ref`` (cached); :class:`TaskError` (with the reason a
        receiver counts) for a family, version or config this node does not train on, an index outside the
        family's items, or a plug-in that fails on the item (:class:`PluginError`)."""
        if not self.accepts(ref):
            raise self.refusal(ref)
        return self._items.get_or(ref.key(), lambda: self._generate(ref))  # type: ignore[no-any-return]

    def score(self, item: TaskItem, completion_text: str) -> float:
        """Reward in [0, 1] of ``completion_text`` by the item's family; :class:`PluginError` when a plug-in's
        scorer raises, hangs or returns something that is not a number in [0, 1]."""
        family = self._by_wire.get(item.ref.family)
        if family is None:
            raise self.refusal(item.ref)
        reward = self._call(item.ref.family, "score", family.score, item, completion_text)
        if getattr(family, "trusted", False):
            return float(reward)
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise PluginError(f"task plug-in {item.ref.family!r}: score returned {reward!r}", "plugin_junk")
        if not 0.0 <= reward <= 1.0:
            raise PluginError(f"task plug-in {item.ref.family!r}: score {reward!r} outside [0, 1]", "plugin_junk")
        return float(reward)

    def trace(self, item: TaskItem) -> str | None:
        """The item's gold completion with its written working (``<think>...</think><answer>...</answer>``) where its
        family writes one (the optional ``trace`` method), else None."""
        family = self._by_wire.get(item.ref.family)
        writer = getattr(family, "trace", None)
        if writer is None:
            return None
        text = self._call(item.ref.family, "trace", writer, item)
        if text is not None and not isinstance(text, str):
            raise PluginError(f"task plug-in {item.ref.family!r}: trace returned {type(text).__name__}", "plugin_junk")
        return text  # type: ignore[no-any-return]


def _checked_entry(wire: str, entry: Any) -> dict[str, Any]:
    """A plug-in's generated item as TaskItem fields, or :class:`PluginError` (``plugin_junk``)."""

    def junk(what: str) -> PluginError:
        return PluginError(f"task plug-in {wire!r}: generate returned {what}", "plugin_junk")

    if not isinstance(entry, Mapping):
        raise junk(f"a {type(entry).__name__}, not a mapping")
    question, answer, metadata = entry.get("question"), entry.get("answer"), entry.get("metadata", {})
    if not isinstance(question, str) or not question.strip() or len(question) > MAX_QUESTION_CHARS:
        raise junk("no question (a non-empty str of at most 16384 characters)")
    if answer is not None and (not isinstance(answer, str) or len(answer) > MAX_ANSWER_CHARS):
        raise junk("an answer that is neither None nor a str of at most 4096 characters")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise junk("metadata that is not a mapping")
    return {"question": question, "answer": answer, "metadata": dict(metadata)}
