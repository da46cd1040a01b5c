"""Wall-clock accounting of a generator step by phase (used by DataLens and scripts/bench.py).

A :class:`PhaseTimer` sums ``time.perf_counter`` intervals per phase name.  TensorFlow on
CPU runs eagerly and synchronously, and every phase ends on a value that has been computed,
so an interval covers the work done in it.  Phases that run in a background thread (teacher
state I/O overlapped with compute) are added with :meth:`PhaseTimer.add` and reported
separately from the main thread's wall time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

#: Phases of one generator step, in the order they are reported.
PHASES = (
    "generator_forward",   # G renders the teachers' fake batches and the query batches
    "teacher_training",    # d_step Adam steps of every teacher
    "image_gradients",     # every teacher's gradient for the queried fake images
    "voting",              # TopAgg: every teacher's top-k signs, summed chunk by chunk
    "noise",               # TopAgg: Gaussian noise on the vote sum, threshold
    "student_update",      # the generator's Adam step on the voted targets
    "teacher_io",          # main thread waiting for teacher state reads/writes
)
#: Seconds the background I/O thread spent reading and writing (overlapped with compute).
BACKGROUND_IO = "teacher_io_background"


class PhaseTimer:
    """Seconds per phase since the last :meth:`take` (thread-safe)."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Adds the wall time of the ``with`` body to ``name``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def take(self) -> dict[str, float]:
        """The seconds per phase so far, and a reset to zero."""
        with self._lock:
            seconds, self._seconds = self._seconds, {}
        return seconds
