"""Per-step metrics: an append-only JSONL file that survives crashes, and a live terminal view.

Knows nothing about what the numbers mean; the runtime decides what to log. Each line is flushed as it is
written (and fsynced every few lines), so a node killed with SIGKILL loses at most its last step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections import deque
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


class JsonlWriter:
    """Append JSON objects, one per line; each line is written as it comes, fsynced every ``fsync_every`` lines.

    A full disk (or quota, or an I/O error) does not stop the node: lines that cannot be written wait in memory,
    oldest first (at most ``MAX_BACKLOG_BYTES``; past that the oldest are dropped and counted), and are written
    before the next line once space is back. One warning line when writing starts failing, one when it recovers.
    """

    #: Lines kept in memory while the disk refuses them (then the oldest are dropped).
    MAX_BACKLOG_BYTES = 16 << 20

    def __init__(self, path: str | Path, fsync_every: int = 10) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fsync_every = fsync_every
        self._since_sync = 0
        self._backlog: deque[bytes] = deque()
        self._backlog_bytes = 0
        self._head_partial = False  # the backlog's first line is the rest of a line partly written already
        self._failing = False
        #: Lines dropped because the backlog was full while the disk refused writes.
        self.dropped = 0

    def _repair_tail(self) -> None:
        """A SIGKILL mid-write can leave a partial last line; cut it so every line parses."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        with self.path.open("r+b") as f:
            f.truncate(cut)
        logger.warning("%s: dropped a partial last line left by an interrupted write", self.path)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    @property
    def pending(self) -> int:
        """Lines waiting in memory for the disk."""
        return len(self._backlog)

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(_clean(record), separators=(",", ":")) + "\n").encode("utf-8")
        self._backlog.append(line)
        self._backlog_bytes += len(line)
        while self._backlog_bytes > self.MAX_BACKLOG_BYTES and len(self._backlog) > 1:
            # never the rest of a partly written line: the file would keep a broken line
            victim = 1 if self._head_partial else 0
            self._backlog_bytes -= len(self._backlog[victim])
            del self._backlog[victim]
            self.dropped += 1
        if self._drain():
            self._since_sync += 1
            if self._since_sync >= self._fsync_every:
                self.sync()

    def _drain(self) -> bool:
        """Write the backlog; False (logged once) while the disk refuses it. A partial write keeps the rest of its
        line at the head of the backlog, so the file only ever gains whole lines once writing succeeds."""
        try:
            while self._backlog:
                data = self._backlog[0]
                n = os.write(self._fd, data)
                self._backlog_bytes -= n
                if n < len(data):
                    self._backlog[0] = data[n:]
                    self._head_partial = True
                else:
                    self._backlog.popleft()
                    self._head_partial = False
        except OSError as e:
            if not self._failing:
                logger.warning(
                    "%s: cannot write (%s); keeping new lines in memory until the disk accepts them",
                    self.path,
                    e.strerror or e,
                )
            self._failing = True
            return False
        if self._failing:
            logger.warning("%s: writing again (%d lines dropped meanwhile)", self.path, self.dropped)
            self._failing = False
        return True

    def sync(self) -> None:
        if self.closed or not self._drain():
            return
        try:
            os.fsync(self._fd)
        except OSError as e:
            logger.warning("%s: fsync failed (%s)", self.path, e.strerror or e)
        self._since_sync = 0

    def close(self) -> None:
        if self.closed:
            return
        self.sync()
        if self._backlog:
            logger.warning("%s: %d lines could not be written before closing", self.path, len(self._backlog))
        os.close(self._fd)
        self._fd = -1


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL file written by :class:`JsonlWriter` (skips a trailing partial line)."""
    out: list[dict[str, Any]] = []
    path = Path(path)
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("%s: skipping an unreadable line", path)
    return out


def truncate_after_step(path: str | Path, step: int) -> int:
    """Keep only records with ``step <= step`` (on resume, steps after the checkpoint are redone)."""
    path = Path(path)
    rows = read_jsonl(path)
    keep = [r for r in rows if r.get("step", -1) <= step]
    if len(keep) != len(rows):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in keep), encoding="utf-8")
        tmp.replace(path)
    return len(rows) - len(keep)


class LiveView:
    """A rich progress bar with the live reward, peers and traffic, shown only on a terminal."""

    def __init__(self, total: int | None, start: int = 0, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress = None
        self._heldout: float | None = None  # the latest held-out accuracy (evaluation steps only carry it)
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            transient=False,
        )
        self._task = self._progress.add_task("train", total=total, completed=start, info="")
        self._progress.start()

    def update(self, m: dict[str, Any]) -> None:
        if self._progress is None:
            return
        if "heldout_accuracy" in m:
            self._heldout = float(m["heldout_accuracy"])
        heldout = "" if self._heldout is None else f"held-out {self._heldout:.3f}  "
        info = (
            f"reward {m.get('reward_mean', 0):.3f}  {heldout}peers {m.get('peers', 0)}  "
            f"in {m.get('received', 0)} out {m.get('published', 0)}  rejected {m.get('rejected', 0)}"
        )
        self._progress.update(self._task, completed=m.get("step", 0), info=info)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
