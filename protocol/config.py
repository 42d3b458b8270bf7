"""Configuration plumbing shared by every layer: strict pydantic models, YAML + overrides, one-line errors.

Knows nothing about what the configs describe; the node, swarm and simulator define their own models on
top of :class:`StrictModel`. Flow: YAML file -> ``a.b.c=value`` overrides -> validation -> resolved YAML
written into the run directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from protocol.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every config model: unknown keys are errors, defaults are validated too."""

    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=False)


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``a.b.c=value``; the value is read as YAML so ``3``, ``0.5``, ``true``, ``[1, 2]`` get their types."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like section.field=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({e.__class__.__name__})") from None
    return key.strip(), value


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file or bad YAML is a :class:`ConfigError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at top level, not {type(data).__name__}")
    return data


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem, each naming the dotted field; joined with '; '."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling, or remove it)"
        parts.append(f"{loc}: {msg}")
    return f"invalid config {source}: " + "; ".join(parts)


def validate_config(model: type[M], data: dict[str, Any], source: str = "") -> M:
    """Validate ``data`` into ``model``; errors become one :class:`ConfigError` line naming each field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source or model.__name__)) from None


def load_config(model: type[M], path: str | Path | None = None, overrides: Sequence[str] = ()) -> M:
    """YAML file (optional) + ``key.path=value`` overrides -> validated ``model`` instance."""
    data = read_yaml(path) if path is not None else {}
    for text in overrides:
        key, value = parse_override(text)
        _set_path(data, key, value)
    return validate_config(model, data, str(path) if path is not None else "(defaults + overrides)")


def dump_config(config: BaseModel) -> str:
    """The resolved config as YAML (JSON-compatible values, so paths become strings)."""
    text: str = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    return text


def write_resolved(config: BaseModel, run_dir: str | Path, name: str = "config.yaml") -> Path:
    """Write the resolved config into the run directory (atomically) and return its path."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / name
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # unique: two runs may share a run dir
    tmp.write_text(dump_config(config))
    tmp.replace(path)
    return path
