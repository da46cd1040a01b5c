"""Progress of a long loop: a tqdm bar on a terminal, periodic plain lines elsewhere.

A bar redraws one line with carriage returns; written to a log file or a pipe (a job
under nohup, a cluster's scheduler, CI) that is one unreadable line.  When the stream is
not a terminal, :func:`progress_bar` returns a :class:`PlainProgress` instead: one line
``<desc>: <done>/<total> <unit> (<rate> <unit>/s) <postfix>`` at the first update, at
most every ``every_seconds`` after that, and at the end.  Both take ``update(n)``,
``set_postfix(...)`` and ``close()``; what goes into the postfix is the caller's choice
(only released or public quantities, see each trainer).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

#: Seconds between two plain progress lines.
PLAIN_EVERY_SECONDS = 30.0


class PlainProgress:
    """Progress as plain, periodic lines (see the module docstring)."""

    def __init__(self, total: int, *, initial: int = 0, unit: str = "step",
                 desc: str | None = None, stream: TextIO = sys.stderr,
                 every_seconds: float = PLAIN_EVERY_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.n, self.unit = total, initial, unit
        self.desc = desc or "progress"
        self.stream, self.every, self.clock = stream, every_seconds, clock
        self.postfix: dict[str, Any] = {}
        self.started = self.clock()
        self.initial = initial
        self.printed_at: float | None = None
        self.printed_n: int | None = None

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if self.printed_at is None or now - self.printed_at >= self.every or \
                self.n >= self.total:
            self._print(now)

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, **fields: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **fields}

    def close(self) -> None:
        if self.printed_n != self.n:
            self._print(self.clock())

    def _print(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = (self.n - self.initial) / elapsed
        fields = " ".join(f"{k}={v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.n}/{self.total} {self.unit} ({rate:.3g} {self.unit}/s)"
              + (f" {fields}" if fields else ""), file=self.stream, flush=True)
        self.printed_at, self.printed_n = now, self.n


def progress_bar(total: int, *, initial: int = 0, unit: str = "step", desc: str | None = None,
                 stream: TextIO | None = None):
    """A tqdm bar when ``stream`` (default stderr) is a terminal, else :class:`PlainProgress`."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        from tqdm import tqdm  # pylint: disable=import-outside-toplevel  (third-party)
        return tqdm(total=total, initial=initial, unit=unit, desc=desc, dynamic_ncols=True,
                    file=stream)
    return PlainProgress(total, initial=initial, unit=unit, desc=desc, stream=stream)
