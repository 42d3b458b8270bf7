"""Atomic, pickle-free learner checkpoints: save, find the latest complete one, restore.

A checkpoint is a directory ``step-XXXXXXXX`` holding

* ``model.safetensors`` -- the model's state dict (tied weights stored once, aliases listed in ``state.json``),
* ``optimizer.safetensors`` -- the optimizer's per-parameter tensors (AdamW moments and step counts),
* ``trace_optimizer.safetensors`` -- only with a trace step (``learner.trace_lr``): its optimizer's tensors,
* ``rng.safetensors`` -- torch's CPU (and CUDA) generator states,
* ``state.json`` -- step, policy_version, the runtime's ``extra`` blob, optimizer scalars and param groups,
  Python's and NumPy's RNG states, with the trace step's anchor its reservoir of own token ids, and with
  ``learner.trace_batch`` its replay buffer of verified traces (token ids and family),
* ``manifest.json`` -- size and SHA-256 of every other file; written last.

It is written into a hidden temporary directory, fsynced, renamed into place, and only then is the ``latest``
pointer file replaced (write + fsync + ``os.replace``), so a crash at any point leaves the previous checkpoint
intact and at worst a temporary directory that the next save deletes. :func:`load_latest` verifies the
manifest and falls back to older checkpoints when the newest is damaged. Nothing is unpickled.

This module knows the learner only through ``model``, ``optimizer``, ``trace_optimizer``, ``anchor_pool``,
``anchor_seen``, ``trace_buffer``, ``trace_keys`` and ``policy_version``;
it knows nothing about what ``extra`` means.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

if TYPE_CHECKING:
    from node.learn.learner import Learner

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json")
#: Written only by a learner that has the optimizer: the trace step's (``learner.trace_lr``).
_OPTIONAL = ("trace_optimizer.safetensors",)


@dataclass
class Checkpoint:
    """A complete checkpoint on disk (verified by :func:`load_latest`); tensors are read by :func:`restore`."""

    path: Path
    """The ``step-XXXXXXXX`` directory."""
    step: int
    """Runtime step at which it was written."""
    policy_version: int
    """Learner's optimizer-update count."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The runtime's JSON blob (counters and the like)."""
    state: dict[str, Any] = field(default_factory=dict, repr=False)
    """The parsed ``state.json``."""


def save_checkpoint(
    ckpt_dir: str | Path,
    learner: Learner,
    *,
    step: int,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    """Write a checkpoint of ``learner`` as ``ckpt_dir/step-{step:08d}`` atomically; keep the newest ``keep``.

    Returns the final directory. ``extra`` must be JSON-serialisable.
    """
    if step < 0 or keep < 1:
        raise ValueError(f"step must be >= 0 and keep >= 1 (got step={step}, keep={keep})")
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(ckpt_dir)
    name = f"step-{step:08d}"
    tmp = ckpt_dir / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write_files(tmp, learner, step, extra)
    except BaseException:
        # A half-written temporary (a full disk, an I/O error) goes at once: it holds the space the node needs.
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    final = ckpt_dir / name
    if final.exists():  # the same step written again (e.g. after a resume): replace it
        _discard(final)
    os.rename(tmp, final)
    _fsync_dir(ckpt_dir)
    _write_atomic(ckpt_dir / LATEST, name)
    _prune(ckpt_dir, keep)
    logger.info("checkpoint %s written (policy_version %d)", final, learner.policy_version)
    return final


def save_or_report(
    ckpt_dir: str | Path,
    learner: Learner,
    *,
    step: int,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path | None:
    """:func:`save_checkpoint`, except that a write the filesystem refuses (disk full, quota, I/O error) is one
    warning line naming the checkpoint that is still loadable, and None: the node keeps training and tries again
    at its next checkpoint. Nothing of the previous checkpoint is touched before the new one is complete."""
    try:
        return save_checkpoint(ckpt_dir, learner, step=step, extra=extra, keep=keep)
    except OSError as e:
        try:
            prev = load_latest(ckpt_dir)
        except OSError:
            prev = None
        kept = f"step {prev.step} is still the latest, verified loadable" if prev else "there is no earlier one"
        logger.warning("checkpoint of step %d failed (%s); %s; training goes on", step, e.strerror or e, kept)
        return None


_OS_ERROR = re.compile(r"os error (\d+)")


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``safetensors.torch.save_file``, with its I/O failures raised as the ``OSError`` they are (safetensors
    reports a full disk as ``SafetensorError: ... No space left on device (os error 28)``)."""
    try:
        save_file(tensors, str(path))
    except SafetensorError as e:
        m = _OS_ERROR.search(str(e))
        if m is None and "I/O error" not in str(e):
            raise
        code = int(m.group(1)) if m else errno.EIO
        raise OSError(code, os.strerror(code), str(path)) from e


def _write_files(tmp: Path, learner: Learner, step: int, extra: dict[str, Any] | None) -> None:
    """Every file of a checkpoint into ``tmp``, manifest last, all fsynced."""
    tensors, aliases = _dedupe_shared(learner.model.state_dict())
    _save_tensors(tensors, tmp / "model.safetensors")
    opt_tensors, opt_meta = _flatten_optimizer(learner.optimizer.state_dict())
    _save_tensors(opt_tensors, tmp / "optimizer.safetensors")
    rng_tensors, rng_meta = _capture_rng()
    _save_tensors(rng_tensors, tmp / "rng.safetensors")
    state = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "policy_version": learner.policy_version,
        "extra": extra or {},
        "tied": aliases,
        "optimizer": opt_meta,
        "rng": rng_meta,
    }
    files = list(_FILES)
    trace_opt = getattr(learner, "trace_optimizer", None)
    if trace_opt is not None:
        trace_tensors, state["trace_optimizer"] = _flatten_optimizer(trace_opt.state_dict())
        _save_tensors(trace_tensors, tmp / _OPTIONAL[0])
        files.append(_OPTIONAL[0])
    pool = getattr(learner, "anchor_pool", None)
    if pool:  # the trace step's anchor reservoir: this node's own token ids only, as JSON
        state["anchor"] = {
            "seen": int(learner.anchor_seen),
            "rows": [[list(r.prompt_ids), list(r.completion_ids)] for r in pool],
        }
    buffer = getattr(learner, "trace_buffer", None)
    if buffer:  # the trace step's replay buffer of distinct verified traces: token ids, family and source, as JSON
        state["trace_buffer"] = [[list(r.prompt_ids), list(r.completion_ids), r.family, r.source] for r in buffer]
    (tmp / "state.json").write_text(json.dumps(state))
    manifest = {name_: _describe(tmp / name_) for name_ in files}
    (tmp / "manifest.json").write_text(json.dumps({"format_version": FORMAT_VERSION, "files": manifest}))
    for f in tmp.iterdir():
        _fsync_file(f)
    _fsync_dir(tmp)


def load_latest(ckpt_dir: str | Path) -> Checkpoint | None:
    """The newest complete, intact checkpoint under ``ckpt_dir``, or None.

    Tries the ``latest`` pointer first, then every ``step-*`` directory from newest to oldest; temporary
    directories, directories whose manifest is missing or does not match, and unreadable state are skipped.
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return None
    candidates: list[Path] = []
    try:
        pointed = (ckpt_dir / LATEST).read_text().strip()
        if _STEP_DIR.match(pointed):
            candidates.append(ckpt_dir / pointed)
    except OSError:
        pass
    candidates += reversed(_step_dirs(ckpt_dir))
    seen: set[Path] = set()
    for path in candidates:
        if path in seen:
            continue
        seen.add(path)
        ckpt = _verify(path)
        if ckpt is not None:
            return ckpt
    return None


def load_step(ckpt_dir: str | Path, step: int) -> Checkpoint | None:
    """The complete, intact checkpoint of ``step`` under ``ckpt_dir``, or None (absent, pruned or damaged)."""
    path = Path(ckpt_dir) / f"step-{step:08d}"
    return _verify(path) if path.is_dir() else None


def available_steps(ckpt_dir: str | Path) -> list[int]:
    """Steps of the checkpoint directories under ``ckpt_dir`` (complete or not), oldest first."""
    return [int(_STEP_DIR.match(p.name).group(1)) for p in _step_dirs(Path(ckpt_dir))]  # type: ignore[union-attr]


def load_weights(model: Any, ckpt: Checkpoint) -> None:
    """Load the model weights of ``ckpt`` into ``model`` (strict: every parameter must match)."""
    device = next(model.parameters()).device
    tensors = load_file(str(ckpt.path / "model.safetensors"), device=str(device))
    for alias, canonical in ckpt.state["tied"].items():
        tensors[alias] = tensors[canonical]
    model.load_state_dict(tensors, strict=True)


def restore(learner: Learner, ckpt: Checkpoint) -> None:
    """Load weights, optimizer state, RNG states and ``policy_version`` of ``ckpt`` into ``learner``."""
    device = next(learner.model.parameters()).device
    load_weights(learner.model, ckpt)

    opt_tensors = load_file(str(ckpt.path / "optimizer.safetensors"), device=str(device))
    learner.optimizer.load_state_dict(_unflatten_optimizer(opt_tensors, ckpt.state["optimizer"]))
    trace_opt = getattr(learner, "trace_optimizer", None)
    if trace_opt is not None and "trace_optimizer" in ckpt.state:
        trace_tensors = load_file(str(ckpt.path / _OPTIONAL[0]), device=str(device))
        trace_opt.load_state_dict(_unflatten_optimizer(trace_tensors, ckpt.state["trace_optimizer"]))
    elif trace_opt is not None:
        logger.info(
            "%s has no trace-step optimizer state (learner.trace_lr was 0): the trace step starts fresh", ckpt.path
        )

    anchor = ckpt.state.get("anchor")
    if anchor is not None and hasattr(learner, "anchor_pool"):
        from node.seams import TrainSample

        learner.anchor_pool = [TrainSample([int(t) for t in p], [int(t) for t in c], 0.0) for p, c in anchor["rows"]]
        learner.anchor_seen = int(anchor["seen"])
    buffer = ckpt.state.get("trace_buffer")
    if buffer is not None and hasattr(learner, "trace_buffer"):
        from node.seams import TrainSample

        learner.trace_buffer = [  # checkpoints before the source was kept hold three fields: source ""
            TrainSample([int(t) for t in row[0]], [int(t) for t in row[1]], 0.0, family=str(row[2]), trace=True,
                        source=str(row[3]) if len(row) > 3 else "")
            for row in buffer
        ]  # fmt: skip
        learner.trace_keys = {(tuple(r.prompt_ids), tuple(r.completion_ids)) for r in learner.trace_buffer}
    _restore_rng(load_file(str(ckpt.path / "rng.safetensors")), ckpt.state["rng"])
    learner.policy_version = int(ckpt.policy_version)
    logger.info("restored %s (policy_version %d)", ckpt.path, learner.policy_version)


# ----------------------------------------------------------------------------------------------------------
# State dicts without pickle


def _dedupe_shared(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors that share storage (tied embeddings) are written once; returns (tensors, alias -> canonical)."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))
        if t.numel() > 0 and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().to("cpu").contiguous().clone()
    return tensors, aliases


def _flatten_optimizer(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, pstate in sd["state"].items():
        for key, value in pstate.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.detach().to("cpu").contiguous().clone()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    meta = {"param_groups": sd["param_groups"], "scalars": scalars, "ids": [str(i) for i in sd["state"]]}
    return tensors, meta


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {int(i): {} for i in meta["ids"]}
    for name, t in tensors.items():
        idx, key = name.split(".", 1)
        state[int(idx)][key] = t
    for idx, values in meta["scalars"].items():
        state[int(idx)].update(values)
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else dict(g) for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def _capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    version, internal, gauss = random.getstate()
    meta: dict[str, Any] = {"python": [version, list(internal), gauss]}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        meta["numpy"] = [kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]
    except ImportError:  # numpy is optional for this module
        pass
    return tensors, meta


def _restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, internal, gauss = meta["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in meta:
        import numpy as np

        kind, keys, pos, has_gauss, cached = meta["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


# ----------------------------------------------------------------------------------------------------------
# Files


def _describe(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"size": path.stat().st_size, "sha256": digest}


def _verify(path: Path) -> Checkpoint | None:
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        files = manifest["files"]
        if not set(_FILES) <= set(files) <= set(_FILES) | set(_OPTIONAL):
            raise ValueError("manifest lists the wrong files")
        for name, expected in files.items():
            if _describe(path / name) != expected:
                raise ValueError(f"{name} does not match the manifest")
        state = json.loads((path / "state.json").read_text())
        if state.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format version {state.get('format_version')}")
        return Checkpoint(
            path=path,
            step=int(state["step"]),
            policy_version=int(state["policy_version"]),
            extra=state.get("extra") or {},
            state=state,
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("ignoring checkpoint %s: %s", path, e)
        return None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(path: Path) -> None:
    """Remove a directory so that no reader ever sees it half-deleted under its real name."""
    trash = path.with_name(f".trash-{path.name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _remove_stale_temporaries(ckpt_dir: Path) -> None:
    """Leftovers of an interrupted save or prune (one writer per run directory is assumed)."""
    for p in ckpt_dir.iterdir():
        if p.name.startswith((".tmp-", ".trash-", f".{LATEST}.tmp-")):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _step_dirs(ckpt_dir: Path) -> list[Path]:
    """``step-*`` directories, oldest step first."""
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def _prune(ckpt_dir: Path, keep: int) -> None:
    for old in _step_dirs(ckpt_dir)[:-keep]:
        _discard(old)
