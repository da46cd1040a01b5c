"""One pass over a teacher bank, chunk by chunk, with the state I/O overlapped with compute.

While chunk i is being computed, one background thread reads chunk i+1 from the bank into
a staging buffer and writes chunk i-1's new state back::

    stream = ChunkStream(bank, chunk_size, with_adam=True, timer=timer)
    with stream:
        for chunk in stream:                  # chunk.state: numpy arrays, valid until
            new_state = compute(chunk.state)  # the next iteration (copy what you keep)
            stream.write_back(chunk, new_state)
    # leaving the block waits for every write: the bank is complete again

Reads and writes share one thread and run in the order they were asked for, so a row is
never read while an earlier write of it is pending, and writes land in bank order.  Rows
held in RAM (a bank in RAM, or the resident rows of a disk bank) are not read at all: the
chunk is a view of them, and only their write-back runs in the background (a pass never
visits a chunk twice, and :meth:`close` waits for every write before the next pass).
The main thread's waits are timed as the ``teacher_io`` phase, the background thread's
busy time as ``teacher_io_background``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Callable, Iterator

import numpy as np

from dclens.common.profiling import BACKGROUND_IO, PhaseTimer
from dclens.datalens.teacher_bank import TeacherBank
from dclens.datalens.teachers import TeacherState


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Teachers [start, stop) and their state (numpy; Adam moments None if not read)."""

    start: int
    stop: int
    state: TeacherState


class ChunkStream:
    """Iterates a bank's chunks with prefetching reads and background write-back.

    Args:
      bank: the teacher bank.
      chunk_size: teachers per chunk.
      with_adam: read the Adam moments too (training); False reads weights only (votes).
      timer: where the I/O waits and background seconds are added (optional).
      overlap: False does every read and write in the calling thread (for comparison).
    """

    def __init__(self, bank: TeacherBank, chunk_size: int, *, with_adam: bool,
                 timer: PhaseTimer | None = None, overlap: bool = True):
        self.bank = bank
        self.ranges = list(bank.chunks(chunk_size))
        self.chunk_size = chunk_size
        self.with_adam = with_adam
        self.timer = timer if timer is not None else PhaseTimer()
        self._executor = (concurrent.futures.ThreadPoolExecutor(1, "teacher-io")
                          if overlap else None)
        self._pending: list[concurrent.futures.Future] = []
        self._background = 0.0

    # ----------------------------------------------------------------- I/O work
    def _timed(self, work: Callable[[], object]) -> object:
        started = time.perf_counter()
        try:
            return work()
        finally:
            self._background += time.perf_counter() - started

    def _submit(self, work: Callable[[], object]) -> concurrent.futures.Future:
        if self._executor is None:
            future: concurrent.futures.Future = concurrent.futures.Future()
            with self.timer.phase("teacher_io"):
                future.set_result(work())
            return future
        return self._executor.submit(self._timed, work)

    def _buffers(self) -> TeacherState:
        # the files' padded row layout: read and written back with no copy
        return self.bank.staging(self.chunk_size, with_adam=self.with_adam)

    def _read(self, start: int, stop: int, buffers: TeacherState) -> TeacherState:
        if self.with_adam:
            return self.bank.read_into(start, stop, buffers)
        weights = self.bank.read_weights_into(start, stop, buffers.weights[:stop - start])
        return TeacherState(weights, None, None, np.array(self.bank.steps[start:stop]))

    # ----------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Chunk]:
        bank, staging, turn = self.bank, [], 0
        pending: concurrent.futures.Future | None = None
        for index, (start, stop) in enumerate(self.ranges):
            if bank.in_ram(start, stop):
                # rows in RAM: views, but only once earlier writes of them have landed
                state = bank.row_views(start, stop, with_adam=self.with_adam)
            else:
                if pending is None:
                    pending = self._prefetch(start, stop, staging, turn)
                with self.timer.phase("teacher_io"):
                    state = pending.result()
                turn, pending = turn + 1, None
            following = self.ranges[index + 1] if index + 1 < len(self.ranges) else None
            if following is not None and not bank.in_ram(*following):
                pending = self._prefetch(*following, staging, turn)
            yield Chunk(start, stop, state)

    def _prefetch(self, start: int, stop: int, staging: list[TeacherState],
                  turn: int) -> concurrent.futures.Future:
        """Queues the read of rows [start, stop) into staging buffer ``turn % 2``."""
        while len(staging) < 2:
            staging.append(self._buffers())
        buffers = staging[turn % 2]
        return self._submit(lambda: self._read(start, stop, buffers))

    def write_back(self, chunk: Chunk, state: TeacherState) -> None:
        """Queues the chunk's new state (tensors or arrays; not modified afterwards)."""
        self._pending.append(self._submit(lambda: self.bank.write(chunk.start, chunk.stop,
                                                                  state)))
        # One look at each write: a finished one raises its I/O error now, an unfinished
        # one is kept for close().  (Two passes, one collecting the finished writes and
        # one keeping the unfinished, dropped a write that finished between them, and
        # with it its error.)
        unfinished = []
        for future in self._pending:
            if future.done():
                future.result()
            else:
                unfinished.append(future)
        self._pending = unfinished

    def close(self) -> None:
        """Waits for every queued write (raising the first I/O error) and stops the thread."""
        try:
            with self.timer.phase("teacher_io"):
                for future in self._pending:
                    future.result()
        finally:
            self._pending = []
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self.timer.add(BACKGROUND_IO, self._background)
            self._background = 0.0

    def __enter__(self) -> "ChunkStream":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
