"""The task plug-in interface: what a family is, how one is found, and the errors a receiver counts.

A **family** is an object that

* generates an item from ``(config, seed, index)``: its question, its gold answer (or ``None`` when there is none
  single, e.g. a puzzle with many right answers) and any metadata its verifier needs;
* scores a completion of an item, a float in [0, 1];
* optionally gives the canonical key of a question for the held-out split (``split_key``), and the written working
  of an item for gold-label training (``trace``).

It names itself (``name``) and its ``version``: the version travels in every task reference the node publishes
(SPEC 13: ``family`` is ``name@version`` on the wire), so a receiver with another version of the same family, whose
items or verdicts may differ, drops the group instead of training on it under a different question.

Families are found by name (``node.tasks.registry.resolve_family``), in this order:

1. ``verifiers:<module>``: an installed verifiers environment (``node.tasks.verifiers_env``);
2. the built-in laboratory families ``lab_add`` and ``lab_sub`` (``node.tasks.builtin``);
3. a reasoning-gym dataset name (``node.tasks.builtin``; unversioned: SPEC 13 and reasoning-gym 0.1.25 define them);
4. an entry point of the group ``rl_swarm.tasks`` (``[project.entry-points."rl_swarm.tasks"]`` in a package's
   ``pyproject.toml``: ``countdown = "my_tasks:Countdown"``), so ``pip install my-task`` is enough. The entry point
   loads a family object, or a class or factory called with no arguments that returns one.

Duck-typed on purpose (:class:`Family` is a ``typing.Protocol``): a plug-in package need not import this project.
Knows nothing about models, the swarm or time limits (``node.tasks.guard`` contains a plug-in's faults).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from protocol.errors import ConfigError, SwarmError
from protocol.types import Scalar, TaskRef

logger = logging.getLogger(__name__)

#: The entry point group plug-in packages register their families under.
ENTRY_POINT_GROUP = "rl_swarm.tasks"
#: A family name (config and wire) and a version: no ``@`` (it separates them on the wire), no white space.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-/]{0,95}")
VERSION_RE = re.compile(r"[A-Za-z0-9_.+\-]{1,31}")
#: What a plug-in's generated item may hold at most (a longer question or answer is junk, not an item).
MAX_QUESTION_CHARS = 16_384
MAX_ANSWER_CHARS = 4_096


class TaskError(SwarmError):
    """A task ref or family config cannot be materialized here (unknown family, foreign config, bad index).

    ``reason`` is what a receiver counts a dropped peer group under (``rejected_by_reason``): ``task_rejected``
    (a family or config this node does not train on, an index out of range, a dev or test item), ``task_unknown``
    (no family of that name is installed here), ``task_version`` (installed here in another version)."""

    reason = "task_rejected"

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class HeldOutError(TaskError):
    """A peer's group on this node's dev or test side of the split (``task_rejected``): routine between peers whose
    splits agree on the problem but not on every sampled index, so receivers count it without a log line."""


class PluginError(TaskError):
    """A family's own code failed on an item: it raised (``plugin_error``), ran past its time limit
    (``plugin_timeout``), returned something that is not an item or a score (``plugin_junk``), or is quarantined after
    calls that never returned (``plugin_quarantined``)."""

    reason = "plugin_error"


class FamilyConfigError(ConfigError):
    """Configured families that cannot be used, one problem each (``node.tasks.registry.check_families``). Its
    message is the problems joined by ``"\nerror: "``, so a CLI that prints ``error: <message>`` shows one
    ``error:`` line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\nerror: ".join(problems))
        self.problems = problems


@dataclass
class TaskItem:
    """One materialized task: the question, its gold answer (``None`` when scored otherwise) and the metadata
    the family's verifier needs."""

    ref: TaskRef
    question: str
    answer: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Family(Protocol):
    """A task family (module docstring). ``split_key`` and ``trace`` are optional methods (looked up with
    ``getattr``); ``size`` is optional too (default: :data:`DEFAULT_ITEMS`), and so is ``check_config``."""

    name: str
    version: str

    def generate(self, config: Mapping[str, Scalar], seed: int, index: int) -> Mapping[str, Any]:
        """``{"question": str, "answer": str | None, "metadata": dict}`` of item ``index`` under ``seed`` (the same
        on every machine: a peer regenerates it from the ref alone)."""
        ...

    def score(self, item: TaskItem, completion: str) -> float:
        """The reward of ``completion`` (the model's whole text) for ``item``, in [0, 1]."""
        ...


#: Item indices of a family without ``size`` (an upper bound: generators draw from ``seed`` and ``index``).
DEFAULT_ITEMS = 1_000_000_000


def config_key(config: Mapping[str, Scalar]) -> str:
    """A config as canonical JSON (sorted keys): equal configs, equal keys."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))


def wire_family(name: str, version: str) -> str:
    """The ``family`` string of a task ref: the name alone for an unversioned (built-in) family, else
    ``name@version``."""
    return f"{name}@{version}" if version else name


def split_wire_family(family: str) -> tuple[str, str]:
    """``(name, version)`` of a ref's ``family`` string (the version ``""`` when it has none)."""
    name, _, version = family.partition("@")
    return name, version


def parse_wire_family(family: str) -> tuple[str, str] | None:
    """``(name, version)`` of a well-formed ``family`` string (SPEC 13: a name, or ``name@version`` with a version of
    1-31 characters), else None: ``echo@`` (empty version), a 32-character version, ``@1`` (empty name) or
    ``echo@1@2`` name no code, so a receiver drops them as ``task_rejected``."""
    name, at, version = family.partition("@")
    if not NAME_RE.fullmatch(name) or (at and not VERSION_RE.fullmatch(version)):
        return None
    return name, version


def check_family(obj: Any, name: str) -> Family:
    """``obj`` as a family named ``name``, or :class:`TaskError` saying what it lacks."""
    missing = [a for a in ("name", "version", "generate", "score") if not hasattr(obj, a)]
    if missing:
        raise TaskError(f"task plug-in {name!r} is not a family: it has no {', '.join(missing)}", "task_unknown")
    if obj.name != name:
        raise TaskError(f"task plug-in registered as {name!r} names itself {obj.name!r}", "task_unknown")
    version = obj.version
    if not isinstance(version, str):
        raise TaskError(
            f'task plug-in {name!r}: version must be a string such as "1" (it travels as text on the wire), '
            f"not the {type(version).__name__} {version!r}",
            "task_unknown",
        )
    if not VERSION_RE.fullmatch(version):
        raise TaskError(
            f"task plug-in {name!r}: version {version!r} must be 1-31 characters of letters, digits and ._+-",
            "task_unknown",
        )
    return obj  # type: ignore[no-any-return]
