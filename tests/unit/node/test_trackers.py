"""Trackers: TRL's metric names, the rollout statistics TRL logs, TensorBoard for real, and failure handling."""

from __future__ import annotations

import inspect
import logging
import math
from pathlib import Path

import pytest
import torch

from node.cli.preflight import check_trackers
from node.config import NodeConfig
from node.telemetry.metrics import read_jsonl
from node.telemetry.trackers import TRL_NAMES, TrackedMetrics, open_trackers, tracker_metrics
from protocol.errors import ConfigError
from protocol.types import Completion, Group, TaskRef
from swarm.pool import SELF, PooledGroup, rollout_stats


def test_tracker_names_are_trls_where_trl_logs_the_quantity() -> None:
    row = {
        "step": 3,
        "time": 1.7e9,
        "reward_mean": 0.25,
        "clip_low_frac": 0.01,
        "clip_high_frac": 0.02,
        "completion_len_mean": 7.5,
        "peers": 2,
        "rejected_by_reason": {"forged": 4, "stale": 0},
        "heldout_accuracy": 0.4,
        "label": "not a number",
        "nan_metric": float("nan"),
        "flag": True,
    }
    out = tracker_metrics(row)
    assert out == {
        "train/reward": 0.25,
        "train/clip_ratio/low_mean": 0.01,
        "train/clip_ratio/high_mean": 0.02,
        "train/clip_ratio/region_mean": pytest.approx(0.03),
        "train/completions/mean_length": 7.5,
        "train/peers": 2.0,  # no TRL counterpart: our name
        "train/rejected_by_reason/forged": 4.0,
        "train/rejected_by_reason/stale": 0.0,
        "eval/heldout_accuracy": 0.4,
    }


def test_every_mapped_name_is_one_trl_logs() -> None:
    """The mapping's right-hand side, checked against the installed TRL's GRPOTrainer source (a rename there
    fails here). ``loss`` and ``grad_norm`` are logged by transformers' Trainer, which GRPOTrainer extends."""
    from transformers import Trainer
    from trl.trainer import grpo_trainer

    trl_src = inspect.getsource(grpo_trainer)
    trainer_src = inspect.getsource(Trainer)
    for ours, trl in TRL_NAMES.items():
        src = trainer_src if trl in ("loss", "grad_norm") else trl_src
        assert f'"{trl}"' in src, f"{ours} -> {trl}: not a name TRL logs"
    assert '"clip_ratio/region_mean"' in trl_src


def _group(rewards: list[float], lengths: list[int], reasons: list[str]) -> PooledGroup:
    comps = tuple(Completion(text="x" * n, n_tokens=n, finish_reason=r) for n, r in zip(lengths, reasons, strict=True))
    ref = TaskRef(family="chain_sum", seed=0, index=1)
    return PooledGroup(key="k", source=SELF, group=Group(task=ref, completions=comps), rewards=tuple(rewards), step=0)


def test_rollout_stats_match_trls_formulas() -> None:
    groups = [
        _group([1.0, 0.0, 0.0, 1.0], [3, 5, 8, 8], ["stop", "stop", "length", "length"]),
        _group([0.0, 0.0, 0.0, 0.0], [2, 4, 6, 8], ["stop", "stop", "stop", "length"]),
    ]
    s = rollout_stats(groups)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert s["reward_std"] == pytest.approx(rewards.std().item())  # unbiased, as TRL's nanstd
    assert s["frac_reward_zero_std"] == 0.5
    assert (s["completion_len_mean"], s["completion_len_min"], s["completion_len_max"]) == (5.5, 2.0, 8.0)
    assert s["completion_clipped_frac"] == 3 / 8
    assert rollout_stats([]) == {}


def test_report_to_accepts_a_comma_list_and_none() -> None:
    assert NodeConfig(report_to="tensorboard, wandb").report_to == ["tensorboard", "wandb"]
    assert NodeConfig(report_to="none").report_to == []
    assert NodeConfig(report_to=["trackio", "trackio"]).report_to == ["trackio"]
    assert NodeConfig().report_to == []
    with pytest.raises(ValueError, match="tensorboard"):
        NodeConfig(report_to=["mlflow"])


def test_a_missing_tracker_package_is_one_line_naming_the_pip_command(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    check_trackers(["tensorboard"])
    with pytest.raises(ConfigError) as e:
        check_trackers(["tensorboard", "wandb"])
    msg = str(e.value)
    assert "\n" not in msg and "pip install wandb" in msg and '".[wandb]"' in msg


class _Recorder:
    def __init__(self, name: str, fail_at: int | None = None) -> None:
        self.name, self.fail_at, self.steps, self.closed = name, fail_at, [], False

    def log(self, metrics: dict[str, float], step: int) -> None:
        if step == self.fail_at:
            raise OSError(28, "No space left on device")
        self.steps.append((step, metrics["train/reward"]))

    def close(self) -> None:
        self.closed = True


def test_a_failing_tracker_is_logged_once_and_dropped_while_the_others_go_on(tmp_path: Path, caplog) -> None:
    bad, good = _Recorder("bad", fail_at=2), _Recorder("good")
    w = TrackedMetrics(tmp_path / "metrics.jsonl", [bad, good])
    with caplog.at_level(logging.WARNING, logger="node.telemetry.trackers"):
        for step in range(1, 5):
            w.write({"step": step, "reward_mean": step / 10})
    w.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]  # the source of truth
    assert bad.steps == [(1, 0.1)] and bad.closed
    assert good.steps == [(s, s / 10) for s in range(1, 5)] and good.closed
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "bad tracker failed" in warnings[0] and "No space left" in warnings[0]


def test_a_tracker_that_cannot_start_is_left_out(tmp_path: Path, caplog, monkeypatch) -> None:
    import node.telemetry.trackers as trackers

    def broken(*args, **kwargs):
        raise RuntimeError("service down")

    monkeypatch.setattr(trackers, "WandbTracker", broken)
    with caplog.at_level(logging.WARNING, logger="node.telemetry.trackers"):
        assert open_trackers(["wandb"], tmp_path, config={}) == []
    assert any("wandb tracker did not start" in r.getMessage() for r in caplog.records)


def test_tensorboard_event_files_hold_trl_named_scalars(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    w = TrackedMetrics(run / "metrics.jsonl", open_trackers(["tensorboard"], run, config={"seed": 0}))
    for step in (1, 2, 3):
        w.write({"step": step, "reward_mean": step / 4, "completion_len_mean": 10.0 + step, "heldout_accuracy": 0.5})
    w.close()
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/reward", "train/completions/mean_length", "eval/heldout_accuracy"} <= set(tags)
    assert [(e.step, e.value) for e in acc.Scalars("train/reward")] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert all(math.isclose(e.value, 10.0 + e.step) for e in acc.Scalars("train/completions/mean_length"))


def test_simulated_nodes_open_trackers_only_when_their_config_asks() -> None:
    from sim.config import SimConfig

    base = {"nodes": 3, "configurations": [{"name": "a"}, {"name": "b", "node_overrides": {2: {"report_to": "wandb"}}}]}
    assert SimConfig.model_validate({**base, "configurations": [{"name": "a"}]}).trackers() == []
    assert SimConfig.model_validate(base).trackers() == ["wandb"]
    both = SimConfig.model_validate({**base, "node": {"report_to": ["tensorboard"]}})
    assert both.trackers() == ["tensorboard", "wandb"]


def test_tracker_packages_are_imported_only_when_selected(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from node.config import NodeConfig\n"
        "from node.telemetry.trackers import open_metrics\n"
        f"open_metrics({str(tmp_path / 'metrics.jsonl')!r}, NodeConfig()).close()\n"
        "print(sorted(m for m in ('wandb', 'trackio', 'tensorboard') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_tensorboard_on_resume_hides_the_steps_trained_again(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    first = TrackedMetrics(run / "metrics.jsonl", open_trackers(["tensorboard"], run, config={}))
    for step in (1, 2, 3):
        first.write({"step": step, "reward_mean": 0.1})
    first.close()
    # resumed from a checkpoint at step 1: steps 2 and 3 are trained again
    again = TrackedMetrics(run / "metrics.jsonl", open_trackers(["tensorboard"], run, config={}, start_step=1))
    for step in (2, 3):
        again.write({"step": step, "reward_mean": 0.9})
    again.close()
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    got = [(e.step, round(e.value, 6)) for e in acc.Scalars("train/reward")]  # float32 in the event files
    assert got == [(1, 0.1), (2, 0.9), (3, 0.9)]
