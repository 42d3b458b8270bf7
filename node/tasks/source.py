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
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from node.config import TaskConfig
from node.tasks.builtin import DEFAULT_SIZE, GymFamily, builtin_family
from node.tasks.family import (
    DEFAULT_ITEMS,
    MAX_ANSWER_CHARS,
    MAX_QUESTION_CHARS,
    Family,
    HeldOutError,
    PluginError,
    TaskError,
    TaskItem,
    config_key,
    parse_wire_family,
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
        #: Families quarantined for the life of this source (wire name -> why): never drawn, evaluated or accepted.
        self.quarantined: dict[str, str] = {}
        self._failures: Counter[tuple[str, str]] = Counter()  # (wire family, reason) -> failed plug-in calls
        self._in_a_row: Counter[str] = Counter()  # wire family -> own calls failed since its last success
        self._lock = threading.Lock()
        for wire, config in self._families:  # fail at start-up, not at the first step, on a bad config
            check = getattr(self._by_wire[wire], "check_config", None)
            if check is not None:  # the node's own config, not a peer's item: no time limit (loading may be slow)
                try:
                    check(config)
                except TaskError:
                    raise
                except Exception as e:  # a plug-in's refusal of its config is the user's error: one line
                    raise TaskError(f"task family {wire!r}: check_config({config_key(config)}) refused it: {e}") from e

    @property
    def families(self) -> list[str]:
        """The ``family`` strings of this source's refs (``name`` or ``name@version``), one per configured family."""
        return [wire for wire, _ in self._families]

    def family(self, ref_family: str) -> Family:
        """The family object behind a ref's ``family`` string this source trains on."""
        return self._by_wire[ref_family]

    # ------------------------------------------------------------------ calls into a family

    def _call(
        self, wire: str, what: str, fn: Any, *args: Any, check: Callable[[Any], Any] | None = None, own: bool = True
    ) -> Any:
        """``fn(*args)`` of family ``wire``; a plug-in's call runs under the guard and ``check`` (which raises
        :class:`PluginError` on junk) vets what it returns. A failure is counted (:meth:`metrics`); ``own`` calls
        (this node's draws, completions and evaluation, not peers' items) that fail ``plugin_quarantine_after`` times
        in a row quarantine the family, and so does a second call that never returns."""
        family = self._by_wire[wire]
        if getattr(family, "trusted", False):
            return fn(*args)
        why = self.quarantined.get(wire)
        if why is not None:
            raise PluginError(f"task plug-in {wire!r} is quarantined: {why}", "plugin_quarantined")
        try:
            value = self.guard.call(wire, what, fn, *args)
            if check is not None:
                value = check(value)
        except PluginError as e:
            self._failed(wire, e, own)
            raise
        if own:
            self._in_a_row[wire] = 0
        return value

    def _failed(self, wire: str, e: PluginError, own: bool) -> None:
        with self._lock:
            self._failures[(wire, e.reason)] += 1
            if own:
                self._in_a_row[wire] += 1
            if e.reason == "plugin_quarantined" or self.guard.stuck(wire) >= self.guard.max_stuck:
                why = f"{self.guard.max_stuck} of its calls never returned"
            elif own and self._in_a_row[wire] >= self.cfg.plugin_quarantine_after:
                why = f"its last {self._in_a_row[wire]} calls on this node's own items failed (last: {e})"
            else:
                return
            if wire in self.quarantined:
                return
            self.quarantined[wire] = why
            live = [w for w, _ in self._families if w not in self.quarantined]
        logger.warning(
            "task family %r is quarantined until the node restarts (%s): it is no longer drawn or evaluated and "
            "peers' groups of it are dropped (plugin_quarantined); training goes on with %s",
            wire, why, ", ".join(live) if live else "no family left",
        )  # fmt: skip

    def metrics(self) -> dict[str, Any]:
        """The plug-in fields of a metrics line: ``plugin_failures`` (failed calls into each family's code since
        start, own items and peers' alike, by reason) and ``quarantined_families``; empty for built-ins only."""
        if all(getattr(f, "trusted", False) for f in self._by_wire.values()):
            return {}
        failures: dict[str, dict[str, int]] = {}
        for (wire, reason), n in sorted(self._failures.items()):
            failures.setdefault(wire, {})[reason] = n
        return {"plugin_failures": failures, "quarantined_families": sorted(self.quarantined)}

    def _size(self, wire: str, config: Mapping[str, Scalar], seed: int) -> int:
        family = self._by_wire[wire]
        if isinstance(family, GymFamily):
            return family.size(config, seed)
        size = getattr(family, "size", None)
        if size is None:
            return DEFAULT_ITEMS

        def positive(n: Any) -> int:
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise PluginError(f"task plug-in {wire!r}: size() returned {n!r}, not a positive int", "plugin_junk")
            return n

        return self._call(wire, "size", size, dict(config), check=positive)  # type: ignore[no-any-return]

    def _generate(self, ref: TaskRef, *, own: bool = True) -> TaskItem:
        if not isinstance(ref.seed, int) or ref.seed < 0:
            raise TaskError(f"task seed must be a non-negative integer, got {ref.seed!r}")
        size = self._size(ref.family, ref.config, ref.seed)
        if not isinstance(ref.index, int) or not 0 <= ref.index < size:
            raise TaskError(f"task index {ref.index!r} outside [0, {size}) for {ref.family!r}")
        family = self._by_wire[ref.family]
        if getattr(family, "trusted", False):
            entry = family.generate(dict(ref.config), ref.seed, ref.index)
            return TaskItem(ref=ref, question=entry["question"], answer=entry["answer"], metadata=entry["metadata"])
        fields = self._call(
            ref.family, "generate", family.generate, dict(ref.config), ref.seed, ref.index,
            check=lambda entry: _checked_entry(ref.family, entry), own=own,
        )  # fmt: skip
        return TaskItem(ref=ref, **fields)

    # ------------------------------------------------------------------ drawing and the split

    def sample(self, rng: random.Random, n: int) -> list[TaskRef]:
        """``n`` training refs: a family drawn by weight, then an index uniform in ``[0, pool_size)``, redrawn
        while the item is not on the train side (a bounded number of times: a family with no train item fails).
        Quarantined families are not drawn; an item a plug-in fails on is redrawn (the failure counted), and a
        family quarantined meanwhile hands its draw to another family. :class:`TaskError` when every family is
        quarantined."""
        picks = rng.choices(range(len(self._families)), weights=self._live_weights(), k=n)
        refs = []
        for i in picks:
            ref = self._draw_train(i, rng)
            while ref is None:  # the family was quarantined while drawing: another family takes the draw
                ref = self._draw_train(rng.choices(range(len(self._families)), weights=self._live_weights())[0], rng)
            refs.append(ref)
        return refs

    def _live_weights(self) -> list[float]:
        weights = [
            0.0 if wire in self.quarantined else w for (wire, _), w in zip(self._families, self._weights, strict=True)
        ]
        if not any(weights):
            raise TaskError(
                "every task family is quarantined (its plug-in failed, see the warnings above): "
                + "; ".join(f"{wire}: {why}" for wire, why in self.quarantined.items())
            )
        return weights

    def _draw_train(self, i: int, rng: random.Random) -> TaskRef | None:
        """A train-side ref of family ``i``, or None once the family is quarantined."""
        name, config = self._families[i]
        for _ in range(_MAX_REDRAWS):
            if name in self.quarantined:
                return None
            try:
                size = min(self.cfg.pool_size, self._size(name, config, self.cfg.seed))
                ref = TaskRef(family=name, config=dict(config), seed=self.cfg.seed, index=rng.randrange(size))
                if self.side(self.materialize(ref)) == "train":
                    return ref
            except PluginError:  # counted by _call; this draw is lost, not the node
                continue
        raise TaskError(f"task family {name!r}: no training item found in {_MAX_REDRAWS} draws")

    def split_key(self, item: TaskItem, *, own: bool = True) -> str:
        """The split key of ``item``: its family's own canonical key (``split_key``) where the family has one, else
        the built-in rule (``node.tasks.split.split_key``)."""
        name, _ = split_wire_family(item.ref.family)
        keyer = getattr(self._by_wire.get(item.ref.family), "split_key", None)
        if keyer is None:
            return split_key(name, item.question)

        def checked(key: Any) -> str:
            if key is None:
                return split_key(name, item.question)
            if not isinstance(key, str) or len(key) > MAX_QUESTION_CHARS:
                raise PluginError(f"task plug-in {item.ref.family!r}: split_key returned {type(key).__name__}",
                                  "plugin_junk")  # fmt: skip
            return key

        return self._call(item.ref.family, "split_key", keyer, item.question, check=checked, own=own)  # type: ignore[no-any-return]

    def has_split_key(self, family: str) -> bool:
        """Whether the family behind ``family`` (a ref's family string) gives its own split key."""
        return getattr(self._by_wire.get(family), "split_key", None) is not None

    def side(self, item: TaskItem, *, own: bool = True) -> Side:
        """The side of ``item`` under this node's shares: by the family name (never its version, so a new version
        of a family keeps its sides) and :meth:`split_key`."""
        name, _ = split_wire_family(item.ref.family)
        if not self.has_split_key(item.ref.family):
            return split_side(name, item.question, self.cfg)
        digest = hashlib.sha256(key_preimage(name, self.split_key(item, own=own))).digest()
        return side_of_hash(int.from_bytes(digest[:8], "big"), self.cfg.test_fraction, self.cfg.dev_fraction)

    def materialize_for_training(self, ref: TaskRef) -> TaskItem:
        """A peer's ref as an item (:meth:`materialize`), refusing (:class:`HeldOutError`) dev and test items: a
        peer's group on an evaluation question must not reach the learner, or evaluation would stop measuring
        generalization. A plug-in failing on a peer's item costs the group; it never quarantines the family
        (a stranger chose the item), unless its calls hang."""
        if ref.family in self.quarantined:
            raise self.refusal(ref)
        item = self._materialize(ref, own=False)
        side = self.side(item, own=False)
        if side != "train":
            raise HeldOutError(f"task {ref.family!r} index {ref.index} is on this node's {side} side of the split")
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
            try:
                size = self._size(name, config, seed)
            except PluginError:  # counted; the family has nothing to evaluate
                size = 0
            for index in range(min(budget, size)):
                if name in self.quarantined:
                    refs = []
                    break
                ref = TaskRef(family=name, config=dict(config), seed=seed, index=index)
                try:
                    item = self._generate(ref)
                    key = self.split_key(item)
                    if key in seen or self.side(item) != side:
                        continue
                except PluginError:  # counted by _call; the item is skipped
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
            try:
                item = self._generate(TaskRef(family=name, config=dict(config), seed=self.cfg.seed, index=index))
            except PluginError:  # counted by _call; the estimate reads the items the plug-in gives
                if name in self.quarantined:
                    break
                continue
            questions.append(item.question)
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
            if planned < 2 or name in self.quarantined:
                continue
            try:
                distinct = self.distinct_estimate(i, min(probe, max(2, int(planned))), rng)
            except PluginError:  # counted by _call (its size() failed); the first draws will show it again
                continue
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
        materializes), and that family is not quarantined."""
        return (ref.family, config_key(ref.config)) in self._allowed and ref.family not in self.quarantined

    def refusal(self, ref: TaskRef) -> TaskError:
        """Why ``ref`` is not accepted, as the error a receiver counts: ``plugin_quarantined`` (a family this node
        quarantined), ``task_version`` (a family this node trains on, in another version), ``task_unknown`` (no
        family of that name installed here), else ``task_rejected`` (a family or config this node does not train
        on)."""
        if ref.family in self.quarantined:
            return PluginError(
                f"task plug-in {ref.family!r} is quarantined: {self.quarantined[ref.family]}", "plugin_quarantined"
            )
        parsed = parse_wire_family(ref.family)
        if parsed is None:  # names no code, so no version of it is installed anywhere (SPEC 13)
            return TaskError(f"task family {ref.family[:128]!r} is neither a name nor name@version")
        name, version = parsed
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
        return self._materialize(ref, own=True)

    def _materialize(self, ref: TaskRef, *, own: bool) -> TaskItem:
        key = ref.key()
        if key in self._items and (ref.family, config_key(ref.config)) in self._allowed:
            # made before any quarantine: groups already pooled or generated still build their prompts
            return self._items.get_or(key, lambda: None)  # type: ignore[no-any-return]
        if not self.accepts(ref):
            raise self.refusal(ref)
        return self._items.get_or(key, lambda: self._generate(ref, own=own))  # type: ignore[no-any-return]

    def score(self, item: TaskItem, completion_text: str, *, own: bool = True) -> float:
        """Reward in [0, 1] of ``completion_text`` by the item's family; :class:`PluginError` when a plug-in's
        scorer raises, hangs or returns something that is not a number in [0, 1], or its family is quarantined.
        ``own``: a completion of this node's own (training or evaluation), not a peer's."""
        family = self._by_wire.get(item.ref.family)
        if family is None:
            raise self.refusal(item.ref)
        if getattr(family, "trusted", False):
            return float(family.score(item, completion_text))

        def checked(reward: Any) -> float:
            if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
                raise PluginError(f"task plug-in {item.ref.family!r}: score returned {reward!r}", "plugin_junk")
            if not 0.0 <= reward <= 1.0:
                raise PluginError(f"task plug-in {item.ref.family!r}: score {reward!r} outside [0, 1]", "plugin_junk")
            return float(reward)

        return self._call(item.ref.family, "score", family.score, item, completion_text, check=checked, own=own)  # type: ignore[no-any-return]

    def trace(self, item: TaskItem) -> str | None:
        """The item's gold completion with its written working (``<think>...</think><answer>...</answer>``) where its
        family writes one (the optional ``trace`` method), else None."""
        family = self._by_wire.get(item.ref.family)
        writer = getattr(family, "trace", None)
        if writer is None:
            return None
        if getattr(family, "trusted", False):
            return writer(item)  # type: ignore[no-any-return]

        def checked(text: Any) -> str | None:
            if text is not None and not isinstance(text, str):
                raise PluginError(f"task plug-in {item.ref.family!r}: trace returned {type(text).__name__}",
                                  "plugin_junk")  # fmt: skip
            return text

        return self._call(item.ref.family, "trace", writer, item, check=checked)  # type: ignore[no-any-return]


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
