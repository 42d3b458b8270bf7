"""Layer boundaries: protocol and swarm stay light, the CLIs start fast, import-linter contracts hold."""

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "hivemind", "libp2p", "vllm")
# Backends that are allowed (and expected) to import a heavy library.
BACKENDS = {
    "protocol.transport.hivemind",  # the package: transport, guard, loop
    "protocol.transport.libp2p.transport",
    "protocol.transport.libp2p.gossipsub",
    "protocol.transport.libp2p.bridge",
    "protocol.transport.libp2p.sync",
    "protocol.transport.libp2p.peers",
}


def _light_modules() -> list[str]:
    names = []
    for pkg in ("protocol", "swarm"):
        names.append(pkg)
        for info in pkgutil.walk_packages([str(ROOT / pkg)], prefix=f"{pkg}."):
            if not any(info.name == b or info.name.startswith(b + ".") for b in BACKENDS):
                names.append(info.name)
    return names


def test_protocol_and_swarm_do_not_import_heavy_libraries():
    modules = _light_modules()
    assert "protocol.records" in modules or len(modules) > 2
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = [h for h in {HEAVY!r} if h in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported by protocol/swarm: {out.stdout.strip()}"


@pytest.mark.parametrize("module", ["node.cli", "node.cli.app", "sim.cli", "node.observer", "node.telemetry", "sim"])
def test_cli_modules_import_no_heavy_library(module):
    code = f"import sys, {module}; print(','.join(h for h in {HEAVY!r} if h in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    exe = str(lint) if lint.exists() else "lint-imports"
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_is_clean():
    ruff = Path(sys.executable).parent / "ruff"
    out = subprocess.run(
        [str(ruff) if ruff.exists() else "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-3000:]


def test_ruff_format_is_clean():
    ruff = Path(sys.executable).parent / "ruff"
    out = subprocess.run(
        [str(ruff) if ruff.exists() else "ruff", "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-3000:]


def _import_cycles(modules: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in modules[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in modules:
        if m not in index:
            visit(m)
    return cycles


def test_cycle_finder_finds_a_cycle():
    assert _import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_between_modules():
    """Every import counts, deferred and TYPE_CHECKING ones too: a module never needs, even lazily, a module that
    needs it (data flows one way)."""
    import grimp

    graph = grimp.build_graph("protocol", "swarm", "node", "sim")
    mods = set(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & mods for m in mods}
    assert _import_cycles(edges) == []


def _private_uses(source: str) -> list[str]:
    """``from node... import _x`` and ``obj._x`` (on anything but ``self``/``cls``) in ``source``."""
    import ast

    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "node":
            found += [f"import {a.name}" for a in n.names if a.name.startswith("_")]
        elif (
            isinstance(n, ast.Attribute)
            and n.attr.startswith("_")
            and not n.attr.startswith("__")
            and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
        ):
            found.append(ast.unparse(n))
    return found


def test_private_use_finder_finds_one():
    assert _private_uses("from node.runtime import _x\nnode._finish_step()\nself._ok = 1") == [
        "import _x",
        "node._finish_step",
    ]


def test_simulator_drives_nodes_through_public_names_only():
    """The simulator runs nodes with the same public step pipeline as the runtime: no private name of another
    object, no private import from node/."""
    uses = {str(p.relative_to(ROOT)): _private_uses(p.read_text()) for p in (ROOT / "sim").rglob("*.py")}
    assert {k: v for k, v in uses.items() if v} == {}


FACES = [
    "protocol",
    "protocol.transport",
    "protocol.transport.hivemind",
    "protocol.transport.libp2p",
    "swarm",
    "node",
    "node.model",
    "node.rollout",
    "node.learn",
    "node.mnpo",
    "node.telemetry",
    "node.observer",
    "node.cli",
    "sim",
    "sim.report",
    "sim.experiments",
]


@pytest.mark.parametrize("package", FACES)
def test_every_name_a_package_face_exports_resolves(package):
    """A face's ``__all__`` (lazy or not) names objects that exist: a stale mapping fails here, not at a user's
    import. Faces whose modules import a transport library run in their own interpreter (hivemind and libp2p
    cannot share a process)."""
    code = (
        "import importlib\n"
        f"m = importlib.import_module({package!r})\n"
        "missing = [n for n in m.__all__ if getattr(m, n, None) is None]\n"
        "print(','.join(missing))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{package} exports names that do not resolve: {out.stdout.strip()}"
