"""A step counter with an ETA for people waiting on long runs (simulator seeds, benchmarks), on stderr.

On a terminal one line is rewritten in place; elsewhere (CI logs, pipes) a line is printed about every 10%
of the way, so a log never floods. Knows nothing about what is being counted.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class StepProgress:
    """Prints ``label: step k/N (p%), elapsed m:ss, ETA m:ss``; :meth:`update` per step, :meth:`done` at the end."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        min_interval_s: float = 0.2,
    ) -> None:
        self.label = label
        self.total = max(1, int(total))
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.min_interval_s = min_interval_s
        self._t0 = time.monotonic()
        self._last_write = float("-inf")
        self._last_decile = -1
        self._k = 0
        self._open_line = False

    def line(self, k: int) -> str:
        elapsed = time.monotonic() - self._t0
        text = f"{self.label}: step {k}/{self.total} ({100 * k // self.total}%), elapsed {_clock(elapsed)}"
        if 0 < k < self.total:
            text += f", ETA {_clock(elapsed / k * (self.total - k))}"
        return text

    def update(self, k: int) -> None:
        """Record that ``k`` steps are done (printed when due: throttled on a terminal, per 10% elsewhere)."""
        self._k = k
        now = time.monotonic()
        if self.tty:
            if now - self._last_write >= self.min_interval_s or k >= self.total:
                self.stream.write("\r\x1b[2K" + self.line(k))
                self.stream.flush()
                self._last_write = now
                self._open_line = True
            return
        decile = 10 * k // self.total
        if decile > self._last_decile and k < self.total:
            self._last_decile = decile
            self.stream.write(self.line(k) + "\n")
            self.stream.flush()

    def done(self, summary: str | None = None) -> None:
        """Finish the line (on a terminal) and print ``summary`` (default: the final count and time)."""
        text = summary if summary is not None else self.line(self._k)
        if self.tty and self._open_line:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        self.stream.flush()
        self._open_line = False
