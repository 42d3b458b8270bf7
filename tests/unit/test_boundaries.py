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
    "protocol.transport.hivemind_dht",
    "protocol.transport.libp2p_gossip",
    "protocol.transport.lp2p.gossipsub",
    "protocol.transport.lp2p.bridge",
    "protocol.transport.lp2p.sync",
    "protocol.transport.lp2p.peers",
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


@pytest.mark.parametrize("module", ["node.cli", "sim.cli"])
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
