"""Ctrl-C (or SIGTERM) during a long run: stop at the next step boundary, after a checkpoint.

A DataLens step spends privacy before its noise is drawn (the write-ahead journal), so a
run killed between checkpoints keeps those spends counted but loses their steps: at the
paper scale, where one checkpoint is ~27 GB and runs checkpoint every 50 steps, an
interrupt could cost a third of the budget.  :class:`GracefulStop` turns the first
SIGINT or SIGTERM into a request that the training loop reads between steps
(``train_run(..., should_stop=stop)``): it checkpoints the step it has and stops, so a
resume loses nothing.  A second Ctrl-C stops at once (a ``KeyboardInterrupt`` where the
process is; the spends since the last checkpoint then count as lost, as after a crash).

Signal handlers belong to the process, so the command-line tools install this one, for
the length of one training call; the library takes only the callable.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Callable

#: The signals that ask for a stop at the next step boundary.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _write_stderr(text: str) -> None:
    """Unbuffered: a handler may run while the progress bar is inside a buffered write."""
    try:
        os.write(sys.stderr.fileno(), text.encode())
    except (OSError, ValueError, AttributeError):     # no real stderr (captured): best effort
        print(text, end="", file=sys.stderr)


class GracefulStop:
    """Context manager: the first SIGINT/SIGTERM sets :attr:`requested`; a second SIGINT or
    SIGTERM raises ``KeyboardInterrupt``.  Calling the object returns :attr:`requested`.

    Outside the main thread (where Python cannot install handlers) it installs nothing and
    never requests a stop: Ctrl-C then interrupts as before.  A signal the process ignores
    when the block starts stays ignored (a shell starts background jobs, ``cmd &``, with
    SIGINT ignored, so that the terminal's Ctrl-C is not theirs).
    """

    def __init__(self, tool: str, *, notify: Callable[[str], None] = _write_stderr):
        self.tool = tool
        self.notify = notify
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def __call__(self) -> bool:
        return self.requested

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for number in STOP_SIGNALS:
                if signal.getsignal(number) is not signal.SIG_IGN:
                    self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        if self.requested:
            self._restore()
            raise KeyboardInterrupt(f"{name} again: stopping at once")
        self.requested, self.signal_name = True, name
        self.notify(f"\n{self.tool}: {name}: stopping after the current step, with a "
                    "checkpoint, so that a resume loses nothing (press Ctrl-C again to "
                    "stop at once: the privacy spent since the last checkpoint then stays "
                    "counted with its steps lost)\n")
