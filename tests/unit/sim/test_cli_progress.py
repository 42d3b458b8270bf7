"""What a person waiting on a CLI sees: step progress with an ETA, the project's own INFO lines, no library noise."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from sim.report.progress import StepProgress

REPO = Path(__file__).resolve().parents[3]


def _run(*cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_progress_off_a_terminal_prints_about_every_tenth():
    out = io.StringIO()
    bar = StepProgress("demo seed 0", 100, stream=out, tty=False)
    for k in range(1, 101):
        bar.update(k)
    bar.done()
    lines = out.getvalue().splitlines()
    assert 10 <= len(lines) <= 12, lines
    assert lines[0].startswith("demo seed 0: step 1/100 (1%)") and "ETA" in lines[0]
    assert "step 50/100 (50%)" in out.getvalue()
    assert lines[-1].startswith("demo seed 0: step 100/100 (100%)") and "ETA" not in lines[-1]


def test_progress_on_a_terminal_rewrites_one_line():
    out = io.StringIO()
    bar = StepProgress("x", 5, stream=out, tty=True, min_interval_s=0.0)
    for k in range(1, 6):
        bar.update(k)
    assert "\n" not in out.getvalue() and out.getvalue().count("\r") == 5
    bar.done("x: finished")
    assert out.getvalue().endswith("x: finished\n")


def test_sim_cli_shows_per_seed_step_progress_on_stderr(tmp_path):
    res = _run(
        sys.executable, "-m", "sim.cli", "run", "configs/sim/scale.yaml", "--quick",
        "--set", "steps=20", "--set", "nodes=3", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    progress = [line for line in res.stderr.splitlines() if ": step " in line]
    assert any("seed 0: step 2/20 (10%)" in line and "ETA" in line for line in progress), res.stderr
    assert len(progress) <= 12 * res.stderr.count("seed 0: step 2/20"), "a line per ~10%, not per step"
    assert "| config |" in res.stdout and ": step " not in res.stdout  # stdout keeps the table only


def test_reasoning_gym_import_prints_nothing_to_stdout():
    code = "from node.config import TaskConfig; from node.tasks import TaskSource; TaskSource(TaskConfig())"
    res = _run(sys.executable, "-c", code)
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""


def test_cli_logging_shows_project_info_lines_only():
    code = (
        "import logging; from node.cli.logs import setup_cli_logging; setup_cli_logging('INFO'); "
        "logging.getLogger('node.model.tiny').info('building the model'); "
        "logging.getLogger('somelib.sub').info('library chatter'); "
        "logging.getLogger('somelib.sub').warning('library warning')"
    )
    res = _run(sys.executable, "-c", code)
    assert res.returncode == 0 and res.stdout == ""
    assert "node.model.tiny: building the model" in res.stderr
    assert "library warning" in res.stderr and "library chatter" not in res.stderr
