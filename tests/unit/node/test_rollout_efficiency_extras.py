"""Rollout-efficiency extras: the APRIL and VADE benchmarks' quick modes run; the default path never imports vllm
(the vLLM engine's own tests, CPU and GPU: ``tests/integration/test_vllm_engine.py``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "systems" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_b2_april_quick(tmp_path: Path, tiny_cache: Path) -> None:
    assert _load("b2_april").main(["--quick", "--out", str(tmp_path), "--cache-dir", str(tiny_cache)]) == 0
    text = (tmp_path / "b2_april.md").read_text()
    assert "| APRIL 2x |" in text and "without APRIL" in text and "cores" in text


def test_vade_quick(tmp_path: Path) -> None:
    assert _load("vade").main(["--quick", "--out", str(tmp_path), "--runs", str(tmp_path / "runs")]) == 0
    text = (tmp_path / "vade.md").read_text()
    assert "| uniform |" in text and "| vade |" in text and "| vade-dart |" in text


def test_default_path_never_imports_vllm() -> None:
    code = (
        "import sys, node.runtime, node.rollout.engine, node.rollout.planner, node.rollout.april\n"
        "import node.rollout.engine_vllm, swarm.vade\n"
        "print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
