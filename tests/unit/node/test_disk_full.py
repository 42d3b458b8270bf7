"""A full disk: a failed checkpoint leaves the previous one loadable (one warning line), and the JSONL logs keep
every line in memory until the disk takes them again. ENOSPC is injected at the write calls; the real-disk check
(a tiny tmpfs under a running node) is ``tests/integration/test_chaos_disk.py``."""

from __future__ import annotations

import errno
import json
import logging
import os

import pytest

import node.learn.checkpoint as ckpt_mod
import node.telemetry.metrics as metrics_mod
from node.learn.checkpoint import load_latest, save_checkpoint, save_or_report
from node.telemetry.metrics import JsonlWriter, read_jsonl
from tests.unit.node.test_checkpoint import batch, make_learner, params


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_checkpoint_on_a_full_disk_leaves_the_previous_one_loadable(tmp_path, monkeypatch, caplog):
    lrn = make_learner()
    lrn.step(batch(0))
    save_checkpoint(tmp_path, lrn, step=1, extra={"totals": {"a": 1}})
    before = params(lrn)
    lrn.step(batch(1))

    real_save = ckpt_mod.save_file
    calls = {"n": 0}

    def fill_then_fail(tensors, path):
        calls["n"] += 1
        if calls["n"] == 2:  # the model file landed; the disk fills up during the optimizer's
            with open(path, "wb") as f:
                f.write(b"\0" * 1000)
            _enospc()
        return real_save(tensors, path)

    monkeypatch.setattr(ckpt_mod, "save_file", fill_then_fail)
    with caplog.at_level(logging.WARNING, logger="node.learn.checkpoint"):
        assert save_or_report(tmp_path, lrn, step=2) is None
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, lines
    assert "checkpoint of step 2 failed (No space left on device)" in lines[0]
    assert "step 1 is still the latest, verified loadable" in lines[0]
    # the half-written temporary is gone at once (it held the space), the previous checkpoint is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000001"]
    prev = load_latest(tmp_path)
    assert prev is not None and prev.step == 1 and prev.extra == {"totals": {"a": 1}}
    fresh = make_learner(seed=5)
    ckpt_mod.restore(fresh, prev)
    assert all((params(fresh)[k] == v).all() for k, v in before.items())

    monkeypatch.setattr(ckpt_mod, "save_file", real_save)  # space is back: the next checkpoint goes through
    assert save_or_report(tmp_path, lrn, step=3) is not None
    assert load_latest(tmp_path).step == 3


def test_a_failed_first_checkpoint_says_there_is_no_earlier_one(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(ckpt_mod, "save_file", _enospc)
    with caplog.at_level(logging.WARNING, logger="node.learn.checkpoint"):
        assert save_or_report(tmp_path, make_learner(), step=1) is None
    assert "there is no earlier one" in caplog.records[-1].getMessage()
    assert load_latest(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == []


def test_jsonl_lines_wait_in_memory_while_the_disk_is_full(tmp_path, monkeypatch, caplog):
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path, fsync_every=1)
    w.write({"step": 1})
    real_write = os.write
    state = {"full": True, "partial": True}

    def full_disk(fd, data):
        if state["partial"]:  # the first refused write lands half a line, as a filling disk does
            state["partial"] = False
            return real_write(fd, data[:5])
        if state["full"]:
            _enospc()
        return real_write(fd, data)

    monkeypatch.setattr(metrics_mod.os, "write", full_disk)
    with caplog.at_level(logging.WARNING, logger="node.telemetry.metrics"):
        for step in (2, 3, 4):
            w.write({"step": step})
        assert w.pending == 3
        state["full"] = False
        w.write({"step": 5})
    assert w.pending == 0
    w.close()
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3, 4, 5]
    assert all(json.loads(line) for line in path.read_text().splitlines())
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("cannot write (No space left on device)" in m for m in msgs) == 1, msgs
    assert sum("writing again" in m for m in msgs) == 1, msgs


def test_jsonl_backlog_is_bounded(tmp_path, monkeypatch):
    w = JsonlWriter(tmp_path / "r.jsonl")
    monkeypatch.setattr(JsonlWriter, "MAX_BACKLOG_BYTES", 200)
    monkeypatch.setattr(metrics_mod.os, "write", _enospc)
    for step in range(50):
        w.write({"step": step, "pad": "x" * 20})
    assert w.pending < 10 and w.dropped == 50 - w.pending
    monkeypatch.undo()
    w.close()
    steps = [r["step"] for r in read_jsonl(tmp_path / "r.jsonl")]
    assert steps == list(range(50 - len(steps), 50)), steps  # the newest lines survive, in order


def test_a_full_backlog_never_drops_the_rest_of_a_partly_written_line(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    w = JsonlWriter(path)
    monkeypatch.setattr(JsonlWriter, "MAX_BACKLOG_BYTES", 200)
    real_write = os.write
    state = {"partial": True}

    def filling(fd, data):
        if state["partial"]:  # half a line lands, then the disk is full
            state["partial"] = False
            return real_write(fd, data[:7])
        _enospc()

    monkeypatch.setattr(metrics_mod.os, "write", filling)
    for step in range(50):
        w.write({"step": step, "pad": "x" * 20})
    assert w.dropped > 0
    monkeypatch.undo()
    w.close()
    lines = path.read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # the half-written line was completed, none is broken
    steps = [json.loads(line)["step"] for line in lines]
    assert steps[0] == 0 and steps[1:] == list(range(50 - len(steps) + 1, 50)), steps


def test_safetensors_reports_a_full_disk_as_an_oserror(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    def rust_error(*_a, **_k):  # what safetensors raises when the disk fills under it
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(ckpt_mod, "save_file", rust_error)
    with pytest.raises(OSError) as e:
        save_checkpoint(tmp_path, make_learner(), step=1)
    assert e.value.errno == errno.ENOSPC
    assert save_or_report(tmp_path, make_learner(), step=1) is None


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_every_refused_write_is_reported_not_raised(tmp_path, monkeypatch, code):
    def refuse(*_a, **_k):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(ckpt_mod, "save_file", refuse)
    assert save_or_report(tmp_path, make_learner(), step=1) is None
