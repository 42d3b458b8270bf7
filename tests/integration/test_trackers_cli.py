"""``report_to`` on the real CLI: one node run feeds TensorBoard, W&B (offline) and trackio (local) at once, and
a tracker whose package is missing is one error line before anything starts. All offline."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TINY_RUN = [
    "--transport", "memory",
    "--set", "rollout.prompts_per_step=4",
    "--set", "rollout.group_size=4",
    "--set", "sapo.local_groups=4",
    "--set", "eval.at_start=false",
    "--set", "eval.at_end=false",
]  # fmt: skip


def _join(run_dir: Path, *args: str, env: dict[str, str], prelude: str = "") -> subprocess.CompletedProcess:
    code = f"{prelude}import sys; from node.cli.app import main; sys.argv = ['swarm-node', *sys.argv[1:]]; main()"
    cmd = [sys.executable, "-c", code, "join", "--run-dir", str(run_dir), "--config", "tiny", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)


def _wandb_history(run_file: str) -> list[dict]:
    """History rows of an offline W&B run file: a LevelDB-style log (32 KiB blocks of CRC/length/type-framed
    chunks after a 7-byte ``:W&B`` header) of ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(run_file).read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    rows, pos, chunk = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


@pytest.mark.timeout(600)
def test_one_run_reports_to_tensorboard_wandb_and_trackio_offline(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from node.telemetry.metrics import read_jsonl

    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_"))}
    env.update(PYTHONPATH=str(REPO), TRACKIO_DIR=str(tmp_path / "trackio"), HF_HUB_OFFLINE="1")
    res = _join(run, "--max-steps", "2", *TINY_RUN, "--set", "report_to=[tensorboard,wandb,trackio]", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Trackio" not in res.stdout and "wandb" not in res.stdout  # libraries' banners stay off stdout
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    jsonl = {r["step"]: r for r in rows}

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    for name, ours in [("train/reward", "reward_mean"), ("train/completions/mean_length", "completion_len_mean")]:
        got = [(e.step, e.value) for e in acc.Scalars(name)]
        assert got == [(s, pytest.approx(jsonl[s][ours], rel=1e-6)) for s in (1, 2)], name

    files = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))  # offline, in the run dir
    assert len(files) == 1, os.listdir(run)
    history = [h for h in _wandb_history(files[0]) if "train/reward" in h]
    assert [(h["_step"], h["train/reward"]) for h in history] == [(s, jsonl[s]["reward_mean"]) for s in (1, 2)]
    # the learner's numbers are there on the steps it trained (a step whose groups all tie has no update)
    assert [("train/clip_ratio/low_mean" in h) for h in history] == [("clip_low_frac" in jsonl[s]) for s in (1, 2)]
    assert all("train/completions/clipped_ratio" in h and "train/reward_std" in h for h in history)

    read = (
        "import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
        "print(json.dumps(S.get_logs(sys.argv[1], sys.argv[2])))"
    )
    name = os.path.relpath(run.absolute(), REPO) if str(run.absolute()).startswith(str(REPO)) else str(run.absolute())
    out = subprocess.run([sys.executable, "-c", read, "rl-swarm", name], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    logs = json.loads(out.stdout)
    assert [(r["step"], r["train/reward"]) for r in logs] == [(s, jsonl[s]["reward_mean"]) for s in (1, 2)]


def test_a_selected_tracker_that_is_not_installed_is_one_error_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    hide = "import sys; sys.modules['wandb'] = None; "  # as if wandb were not installed
    res = _join(tmp_path / "run", "--set", "report_to=[tensorboard,wandb]", env=env, prelude=hide)
    assert res.returncode == 1, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "pip install wandb" in lines[0], res.stderr
    assert "listening on" not in res.stdout and not (tmp_path / "run").exists()


def test_swarm_sim_checks_the_nodes_trackers_before_it_starts(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    hide = "import sys; sys.modules['trackio'] = None; "  # as if trackio were not installed
    code = hide + "from sim.cli import main; sys.argv = ['swarm-sim', *sys.argv[1:]]; main()"
    out = tmp_path / "out"
    args = ["run", "configs/sim/demo.yaml", "--out", str(out), "--set", "node.report_to=[trackio]"]
    res = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "pip install trackio" in lines[0], res.stderr
    assert not out.exists()
