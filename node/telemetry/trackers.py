"""Experiment trackers -- TensorBoard, Weights & Biases, trackio -- fed from the node's per-step metrics.

``metrics.jsonl`` stays the source of truth: :class:`TrackedMetrics` writes each line there first and then hands
it to the trackers chosen in ``report_to``. Metrics go out under the names TRL's ``GRPOTrainer`` (1.16) logs for
the same quantity, with the ``train/`` and ``eval/`` prefixes that transformers' tracker callbacks add, so a swarm
node's dashboard reads like a TRL run's (``train/reward``, ``train/completions/mean_length``,
``train/clip_ratio/low_mean``); a quantity TRL does not log keeps our name (``train/peers``, ``train/received``).

Each tracker's package is an optional extra, imported only when selected; ``node.cli.preflight.check_trackers`` turns
a missing one into one error line before anything starts. W&B runs offline unless the user sets ``WANDB_MODE``
(no login, no upload); trackio writes to its local store. A tracker that fails while the node runs (a full disk,
a dead service) is logged once and dropped: the trackers never stop training.

Knows nothing about how the metrics are computed (``node.runtime``) or what they mean beyond the name mapping.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from node.telemetry.metrics import JsonlWriter

if TYPE_CHECKING:
    from node.config import NodeConfig

logger = logging.getLogger(__name__)

#: ``report_to`` value -> the package it needs (also the name of the pyproject extra).
PACKAGES: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}

#: Our metric key -> TRL 1.16 ``GRPOTrainer``'s name for the same quantity (read from its ``_metrics`` logging;
#: ``loss`` and ``grad_norm`` come from transformers' ``Trainer``). Computed alike: rewards and completion lengths
#: over the step's own rollouts, clip ratios as token means with TRL's definition (ratio below ``1 - eps_low``
#: with a negative advantage / above ``1 + eps_high`` with a positive one).
TRL_NAMES: dict[str, str] = {
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "completion_len_mean": "completions/mean_length",
    "completion_len_min": "completions/min_length",
    "completion_len_max": "completions/max_length",
    "completion_clipped_frac": "completions/clipped_ratio",
    "clip_low_frac": "clip_ratio/low_mean",
    "clip_high_frac": "clip_ratio/high_mean",
    "kl": "kl",
    "loss": "loss",
    "grad_norm": "grad_norm",
}

#: Keys that are the x axis or a wall-clock stamp, not a metric.
_NOT_METRICS = frozenset({"step", "time"})


def tracker_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """One ``metrics.jsonl`` row as tracker scalars: TRL's names where TRL logs the quantity, ours otherwise.

    Held-out evaluation numbers go under ``eval/``, everything else under ``train/``; a dict value (counts by
    reason) becomes one scalar per entry (``train/rejected_by_reason/forged``); non-numbers are left out.
    """
    out: dict[str, float] = {}

    def put(key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return
        prefix = "eval/" if key.startswith("heldout_") else "train/"
        out[prefix + TRL_NAMES.get(key, key)] = float(value)

    for key, value in row.items():
        if key in _NOT_METRICS:
            continue
        if isinstance(value, Mapping):
            for sub, v in value.items():
                put(f"{key}/{sub}", v)
        else:
            put(key, value)
    # TRL also logs the union of both clip regions; ours are disjoint (opposite advantage signs), so it is the sum.
    low, high = out.get("train/clip_ratio/low_mean"), out.get("train/clip_ratio/high_mean")
    if low is not None and high is not None:
        out["train/clip_ratio/region_mean"] = low + high
    return out


class Tracker(Protocol):
    """One experiment tracker: scalars by step, then close."""

    name: str

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def _quiet_stdout():
    """Keep a tracker library's banners off the user's stdout (the node's own lines go there); log them instead."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    finally:
        for line in buf.getvalue().splitlines():
            if line.strip():
                logger.debug("tracker: %s", line.strip())


class TensorBoardTracker:
    """Event files under ``<run dir>/tensorboard`` (``tensorboard --logdir <run dir>/tensorboard``)."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, config: dict[str, Any], start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = run_dir / "tensorboard"
        # On resume, steps after the checkpoint are trained again: purge_step hides the first attempt's points.
        self._writer = SummaryWriter(
            log_dir=str(self.log_dir), purge_step=start_step + 1 if start_step > 0 else None, flush_secs=30
        )
        self._writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", global_step=start_step)
        logger.info("tensorboard: event files in %s", self.log_dir)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """A W&B run, offline unless ``WANDB_MODE`` says otherwise; its files go to ``WANDB_DIR`` or the run dir."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: dict[str, Any], run_name: str) -> None:
        import wandb

        env_mode = os.environ.get("WANDB_MODE")
        with _quiet_stdout():
            self._run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or "rl-swarm",
                name=run_name,
                dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
                mode=None if env_mode else "offline",  # never a login or an upload unless the user asked for one
                reinit="create_new",  # the simulator runs many nodes in one process, one W&B run each
                config=config,
                settings=wandb.Settings(silent=True, console="off"),
            )
        self.run_dir = Path(self._run.dir).parent
        mode = env_mode or "offline"
        hint = f"; upload later with `wandb sync {self.run_dir}`" if mode == "offline" else ""
        logger.info("wandb (%s): run files in %s%s", mode, self.run_dir, hint)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        with _quiet_stdout():
            self._run.finish()


class TrackioTracker:
    """A trackio run in its local store (``TRACKIO_DIR``; view with ``trackio show``); nothing is uploaded."""

    name = "trackio"

    def __init__(self, config: dict[str, Any], run_name: str) -> None:
        import trackio

        project = os.environ.get("TRACKIO_PROJECT") or "rl-swarm"
        with _quiet_stdout():
            # No space_id / dataset_id: local only. CPU and GPU sampling threads stay off (they would share the
            # node's cores and are not what this run measures).
            self._run = trackio.init(
                project=project, name=run_name, config=config, auto_log_cpu=False, auto_log_gpu=False
            )
        logger.info("trackio: project %r, run %r (view with `trackio show --project %s`)", project, run_name, project)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        with _quiet_stdout():
            self._run.finish()


class TrackedMetrics(JsonlWriter):
    """``metrics.jsonl`` first, then each tracker; a tracker that raises is logged once and dropped."""

    def __init__(self, path: str | Path, trackers: Sequence[Tracker], fsync_every: int = 10) -> None:
        super().__init__(path, fsync_every=fsync_every)
        self.trackers = list(trackers)

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)
        if not self.trackers:
            return
        metrics = tracker_metrics(record)
        step = int(record.get("step", 0))
        for tracker in list(self.trackers):
            try:
                tracker.log(metrics, step)
            except Exception as e:  # a tracker's failure must not stop training; metrics.jsonl has the line
                self._drop(tracker, e)

    def _drop(self, tracker: Tracker, error: Exception) -> None:
        self.trackers.remove(tracker)
        logger.warning(
            "%s tracker failed (%s: %s); it is off for the rest of this run (metrics.jsonl has every step)",
            tracker.name,
            type(error).__name__,
            error,
        )
        with contextlib.suppress(Exception):
            tracker.close()

    def close(self) -> None:
        super().close()
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as e:
                logger.warning("%s tracker did not close cleanly: %s", tracker.name, e)
        self.trackers = []


def _run_name(run_dir: Path) -> str:
    """The run dir as the user named it from here (``runs/node1``, ``out/default/seed0/node2``): unique in a
    project, and a simulator's nodes named by configuration and seed rather than all ``node0``."""
    rel = os.path.relpath(run_dir.absolute())
    return str(run_dir.absolute()) if rel.startswith("..") else rel


def open_trackers(
    report_to: Sequence[str], run_dir: Path, *, config: dict[str, Any], start_step: int = 0
) -> list[Tracker]:
    """Start the selected trackers; one that fails to start is logged and left out (training goes on)."""
    run_dir = Path(run_dir)
    run_name = _run_name(run_dir)
    opened: list[Tracker] = []
    for name in report_to:
        try:
            if name == "tensorboard":
                opened.append(TensorBoardTracker(run_dir, config, start_step))
            elif name == "wandb":
                opened.append(WandbTracker(run_dir, config, run_name))
            elif name == "trackio":
                opened.append(TrackioTracker(config, run_name))
            else:
                raise ValueError(f"unknown tracker {name!r} (use one of {sorted(PACKAGES)})")
        except Exception as e:
            logger.warning("%s tracker did not start (%s: %s); training goes on without it", name, type(e).__name__, e)
    return opened


def open_metrics(path: Path, cfg: NodeConfig, *, start_step: int = 0, fsync_every: int = 10) -> JsonlWriter:
    """The node's metrics writer: plain ``metrics.jsonl``, plus the trackers in ``cfg.report_to`` (each gets the
    resolved config). Blocking: a tracker's start-up can take seconds."""
    if not cfg.report_to:
        return JsonlWriter(path, fsync_every=fsync_every)
    config = cfg.model_dump(mode="json")
    trackers = open_trackers(cfg.report_to, Path(path).parent, config=config, start_step=start_step)
    return TrackedMetrics(path, trackers, fsync_every=fsync_every)
