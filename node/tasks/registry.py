"""Finding a family by name: verifiers environments, built-ins, reasoning-gym datasets, then installed plug-ins.

The order (``node.tasks.family`` describes each): ``verifiers:<module>``; ``lab_add``/``lab_sub``; a reasoning-gym
dataset name; an entry point of the group ``rl_swarm.tasks``. A plug-in may not take a built-in's name. Resolved
families are cached for the life of the process. :func:`check_families` checks a whole configuration up front.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Iterable
from typing import Any

from node.tasks.builtin import builtin_family
from node.tasks.family import (
    ENTRY_POINT_GROUP,
    NAME_RE,
    Family,
    FamilyConfigError,
    TaskError,
    check_family,
    config_key,
)


def entry_point_names() -> list[str]:
    """Names of the families installed packages register (entry point group :data:`ENTRY_POINT_GROUP`)."""
    return sorted({ep.name for ep in md.entry_points(group=ENTRY_POINT_GROUP)})


def _from_entry_point(name: str) -> Family | None:
    eps = [ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not eps:
        return None
    if len({ep.value for ep in eps}) > 1:
        raise TaskError(
            f"task family {name!r} is registered by several installed packages: {[ep.value for ep in eps]}",
            "task_unknown",
        )
    try:
        obj = eps[0].load()
        if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "generate")):
            obj = obj()
    except Exception as e:  # a plug-in that fails to import is a configuration error the user must see
        raise TaskError(f"task plug-in {name!r} ({eps[0].value}) failed to load: {e!r}", "task_unknown") from e
    return check_family(obj, name)


_RESOLVED: dict[str, Family] = {}


def resolve_family(name: str) -> Family:
    """The family named ``name`` (module docstring: verifiers environments, built-ins, reasoning-gym, entry points);
    :class:`TaskError` (reason ``task_unknown``) when none is installed here. Cached per process."""
    if name in _RESOLVED:
        return _RESOLVED[name]
    if not NAME_RE.fullmatch(name):
        raise TaskError(f"task family name {name!r} is not a valid name", "task_unknown")
    family: Family | None
    if name.startswith("verifiers:"):
        from node.tasks.verifiers_env import VerifiersFamily  # imports verifiers: only when such a family is named

        family = VerifiersFamily.load(name.removeprefix("verifiers:"))
    else:
        family = builtin_family(name)
        if family is not None and name in entry_point_names():
            raise TaskError(
                f"an installed task plug-in takes the name of the built-in family {name!r}; rename the plug-in",
                "task_unknown",
            )
        family = family or _from_entry_point(name)
    if family is None:
        installed = entry_point_names()
        raise TaskError(
            f"unknown task family {name!r}: not a reasoning-gym dataset, not a built-in family, and no installed "
            f"package registers it under the entry point group {ENTRY_POINT_GROUP!r}"
            + (f" (installed plug-ins: {installed})" if installed else ""),
            "task_unknown",
        )
    _RESOLVED[name] = family
    return family


def family_problems(families: Iterable[Any]) -> list[str]:
    """One line per configured family (``TaskFamily``: ``name``, ``config``) that cannot be used, in order: not
    installed, not a family, a clash with a built-in name, a version that is not a string, ``seed`` in its config,
    or a config its ``check_config`` refuses. Each distinct ``(name, config)`` is checked once."""
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for fam in families:
        key = (fam.name, config_key(fam.config))
        if key in seen:
            continue
        seen.add(key)
        try:
            family = resolve_family(fam.name)
        except TaskError as e:
            problems.append(str(e))
            continue
        if "seed" in fam.config:
            problems.append(f"task family {fam.name!r}: remove 'seed' from its config (use tasks.seed)")
            continue
        check = getattr(family, "check_config", None)
        if check is None:
            continue
        try:
            check(dict(fam.config))
        except Exception as e:  # a plug-in's refusal, in its own words, as one line
            problems.append(f"task family {fam.name!r}: check_config({key[1]}) refused it: {str(e) or repr(e)}")
    return problems


def check_families(families: Iterable[Any]) -> None:
    """:class:`FamilyConfigError` listing every problem :func:`family_problems` finds; run before anything slow
    (a model build, the network) starts."""
    problems = family_problems(families)
    if problems:
        raise FamilyConfigError(problems)
