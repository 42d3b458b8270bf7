"""Finding a family by name: verifiers environments, built-ins, reasoning-gym datasets, then installed plug-ins.

The order (``node.tasks.family`` describes each): ``verifiers:<module>``; ``lab_add``/``lab_sub``; a reasoning-gym
dataset name; an entry point of the group ``rl_swarm.tasks``. A plug-in may not take a built-in's name. Resolved
families are cached for the life of the process.
"""

from __future__ import annotations

import importlib.metadata as md

from node.tasks.builtin import builtin_family
from node.tasks.family import ENTRY_POINT_GROUP, NAME_RE, Family, TaskError, check_family


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
