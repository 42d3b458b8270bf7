"""Lazy re-exports for package faces (PEP 562): a package names its public objects without importing them.

A face such as ``node.rollout`` re-exports ``TransformersEngine`` from ``node.rollout.engine``, which imports torch;
``node.rollout.planner`` must stay importable without torch (the scripted simulator uses it). So a face maps each
public name to the submodule that defines it, and the submodule is imported on the first attribute access.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that resolves ``name`` from ``package.<names[name]>`` on first use."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
