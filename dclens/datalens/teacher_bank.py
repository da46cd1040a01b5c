"""The teacher bank: every teacher's weights and Adam state, in RAM or on disk.

Three float32 arrays [N, P] (weights, Adam's first and second moments; P parameters per
teacher) and the per-teacher Adam step counts.  Each teacher has its own row (never shared:
sharing Adam's moments between teachers would make one teacher's update depend on another
teacher's data and break the one-teacher sensitivity of TopAgg).  In RAM, or in ``.npy``
files streamed chunk by chunk with explicit positional reads and writes (optionally with
the first teachers held in RAM), so only one chunk of teachers is ever materialised as
TensorFlow tensors (:mod:`dclens.datalens.bank_stream`).
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Iterator

import numpy as np
import tensorflow as tf

from dclens.datalens.teachers import ParamLayout, TeacherState, initial_teacher_weights


class BankSpaceError(OSError):
    """The disk has no room for a disk-backed teacher bank (checked before any step)."""


class _RowFile:
    """Positional row I/O on one ``.npy`` file (``os.preadv``/``os.pwritev``).

    Streaming rows through explicit reads and writes instead of the memory map keeps the
    mapped pages out of the process's resident set: a bank larger than RAM is read and
    written one chunk at a time through the page cache, never all mapped at once.
    """

    def __init__(self, array: np.memmap):
        self.path = array.filename
        self.offset = int(array.offset)
        self.row_bytes = int(array.strides[0])
        self.fd = os.open(self.path, os.O_RDWR)

    def read(self, start: int, out: np.ndarray) -> None:
        view, position = memoryview(out).cast("B"), self.offset + start * self.row_bytes
        while len(view):
            count = os.preadv(self.fd, [view], position)
            if count <= 0:
                raise OSError(f"short read from {self.path} at byte {position}")
            view, position = view[count:], position + count

    def write(self, start: int, rows: np.ndarray) -> None:
        view = memoryview(np.ascontiguousarray(rows)).cast("B")
        position = self.offset + start * self.row_bytes
        while len(view):
            count = os.pwritev(self.fd, [view], position)
            view, position = view[count:], position + count

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


def bank_bytes(layout: ParamLayout, num_teachers: int) -> int:
    """Bytes of a bank: weights and two Adam moments in float32 plus int64 step counts."""
    return num_teachers * (3 * 4 * layout.size + 8)


class TeacherBank:
    """Weights and Adam state of N teachers, stored as [N, P] float32 arrays.

    ``directory=None`` keeps them in RAM.  Otherwise they are ``.npy`` files in
    ``directory`` (weights.npy, adam_m.npy, adam_v.npy, steps.npy), streamed chunk by chunk
    with positional reads and writes (:meth:`read_into`, :meth:`write`; see
    :mod:`dclens.datalens.bank_stream`), so a bank larger than memory never has to be resident, and
    the first ``resident_rows`` teachers are kept in RAM (a tier in front of the files:
    those rows cost no disk traffic per step; :meth:`sync` copies them to the files).  The
    files are preallocated: a disk too small fails at creation (:class:`BankSpaceError`),
    not in the middle of a run.

    ``weights``, ``adam_m``, ``adam_v``: the whole [N, P] arrays, for checkpoints and tests.
    For a bank in RAM or on disk without a resident tier they are the (writable) arrays or
    memory maps themselves; with a resident tier they are synced first and read-only (write
    through :meth:`assign`/:meth:`write`).
    """

    FILES = ("weights", "adam_m", "adam_v", "steps")

    def __init__(self, weights: np.ndarray, adam_m: np.ndarray, adam_v: np.ndarray,
                 steps: np.ndarray, layout: ParamLayout, *, resident_rows: int = 0):
        n, p = weights.shape
        if p != layout.size or adam_m.shape != (n, p) or adam_v.shape != (n, p) \
                or steps.shape != (n,):
            raise ValueError(f"inconsistent teacher bank: weights {weights.shape}, adam_m "
                             f"{adam_m.shape}, adam_v {adam_v.shape}, steps {steps.shape}, "
                             f"layout size {layout.size}")
        self.layout = layout
        self.steps = steps
        self._arrays = (weights, adam_m, adam_v)
        self._files = ([_RowFile(a) for a in self._arrays]
                       if all(isinstance(a, np.memmap) and a.filename for a in self._arrays)
                       else None)
        resident = min(max(int(resident_rows), 0), n) if self._files is not None else 0
        self._resident = tuple(np.empty((resident, p), np.float32) for _ in range(3))
        for which in range(3 if resident else 0):   # positional reads: no mapped pages
            self._files[which].read(0, self._resident[which])
        self._dirty = False

    # ----------------------------------------------------------------- whole arrays
    def _whole(self, which: int) -> np.ndarray:
        if not self.resident_rows:
            return self._arrays[which]
        self.sync()
        view = self._arrays[which].view()
        view.flags.writeable = False
        return view

    @property
    def weights(self) -> np.ndarray:
        return self._whole(0)

    @property
    def adam_m(self) -> np.ndarray:
        return self._whole(1)

    @property
    def adam_v(self) -> np.ndarray:
        return self._whole(2)

    @property
    def num_teachers(self) -> int:
        return self._arrays[0].shape[0]

    @property
    def on_disk(self) -> bool:
        """Whether the arrays are files streamed with positional I/O."""
        return self._files is not None

    @property
    def resident_rows(self) -> int:
        """Rows [0, resident_rows) of a disk bank live in RAM (0 for a bank in RAM)."""
        return len(self._resident[0])

    @classmethod
    def create(cls, layout: ParamLayout, num_teachers: int, *, seed: int,
               directory: str | os.PathLike | None = None, resident_rows: int = 0,
               init_chunk: int = 256, first_teacher: int = 0,
               total_teachers: int | None = None) -> "TeacherBank":
        """A freshly initialised bank (teacher i's initial weights depend on (seed, i)).

        ``first_teacher`` / ``total_teachers``: this bank holds teachers [first_teacher,
        first_teacher + num_teachers) of a run of ``total_teachers`` (default: all of
        them), initialised exactly as those rows of the whole run's bank are (a shard).
        """
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be >= 1, got {num_teachers!r}")
        total = num_teachers if total_teachers is None else total_teachers
        if not 0 <= first_teacher <= total - num_teachers:
            raise ValueError(f"teachers [{first_teacher}, {first_teacher + num_teachers}) "
                             f"are not within a run of {total} teachers")
        shape = (num_teachers, layout.size)
        arrays = {}
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            reused = sum(os.path.getsize(path) for path in
                         (os.path.join(directory, f"{name}.npy") for name in cls.FILES)
                         if os.path.exists(path))     # a previous bank's files are replaced
            _check_space(directory, bank_bytes(layout, num_teachers) - reused)
        for name in cls.FILES:
            dims = (num_teachers,) if name == "steps" else shape
            dtype = np.int64 if name == "steps" else np.float32
            if directory is None:
                arrays[name] = np.zeros(dims, dtype)
            else:
                path = os.path.join(directory, f"{name}.npy")
                arrays[name] = np.lib.format.open_memmap(path, mode="w+", dtype=dtype,
                                                         shape=dims)
                _preallocate(path, arrays[name])
        seeds = np.random.SeedSequence(seed).spawn(math.ceil(total / init_chunk))
        bank = cls(arrays["weights"], arrays["adam_m"], arrays["adam_v"], arrays["steps"],
                   layout, resident_rows=resident_rows)
        last = first_teacher + num_teachers
        for index in range(first_teacher // init_chunk, math.ceil(last / init_chunk)):
            start = index * init_chunk                  # the whole run's init chunk ...
            stop = min(start + init_chunk, total)
            rows = initial_teacher_weights(layout, stop - start,
                                           np.random.default_rng(seeds[index]))
            keep = slice(max(start, first_teacher) - start, min(stop, last) - start)
            bank._write_rows(0, max(start, first_teacher) - first_teacher, rows[keep])
        return bank

    def chunks(self, chunk_size: int) -> Iterator[tuple[int, int]]:
        """(start, stop) teacher ranges of at most chunk_size teachers."""
        if chunk_size < 1:
            raise ValueError(f"chunk size must be >= 1, got {chunk_size!r}")
        for start in range(0, self.num_teachers, chunk_size):
            yield start, min(start + chunk_size, self.num_teachers)

    # ----------------------------------------------------------------- rows
    def _split(self, start: int, stop: int) -> int:
        """The row where [start, stop) leaves the RAM-resident part."""
        return min(max(self.resident_rows, start), stop)

    def in_ram(self, start: int, stop: int) -> bool:
        """Whether rows [start, stop) are held in RAM (no I/O needed to read them)."""
        return self._files is None or stop <= self.resident_rows

    def row_views(self, start: int, stop: int, *, with_adam: bool = True
                  ) -> "TeacherState":
        """Views (no copy) of rows [start, stop), which must be :meth:`in_ram`; steps is
        a copy.  Adam moments are None unless ``with_adam``."""
        if not self.in_ram(start, stop):
            raise ValueError(f"rows {start}:{stop} are not in RAM")
        source = self._arrays if self._files is None else self._resident
        views = [a[start:stop] for a in source]
        if not with_adam:
            views[1:] = [None, None]
        return TeacherState(*views, np.array(self.steps[start:stop]))

    def _read_rows(self, which: int, start: int, out: np.ndarray) -> None:
        stop = start + len(out)
        if self._files is None:
            np.copyto(out, self._arrays[which][start:stop])
            return
        split = self._split(start, stop)
        if split > start:
            np.copyto(out[:split - start], self._resident[which][start:split])
        if stop > split:
            self._files[which].read(split, out[split - start:])

    def _write_rows(self, which: int, start: int, rows: np.ndarray) -> None:
        stop = start + len(rows)
        if self._files is None:
            target = self._arrays[which][start:stop]
            if not _same_memory(target, rows):      # rows updated in place: nothing to copy
                target[...] = rows
            return
        rows = np.asarray(rows, np.float32)
        split = self._split(start, stop)
        if split > start:
            target = self._resident[which][start:split]
            if not _same_memory(target, rows[:split - start]):
                target[...] = rows[:split - start]
            self._dirty = True
        if stop > split:
            self._files[which].write(split, rows[split - start:])

    def read(self, start: int, stop: int) -> "TeacherState":
        """Rows [start, stop) as tensors (copies)."""
        buffers = TeacherState(*(np.empty((stop - start, self.layout.size), np.float32)
                                 for _ in range(3)), np.empty(stop - start, np.int64))
        return TeacherState(*(tf.constant(a) for a in self.read_into(start, stop, buffers)))

    def read_into(self, start: int, stop: int, buffers: "TeacherState") -> "TeacherState":
        """Copies rows [start, stop) into the leading rows of numpy ``buffers``; returns
        views of exactly stop - start rows."""
        n = stop - start
        out = TeacherState(*(b[:n] for b in buffers))
        for which in range(3):
            self._read_rows(which, start, out[which])
        out.steps[...] = self.steps[start:stop]
        return out

    def read_weights_into(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Copies the weights of rows [start, stop) into ``out`` [stop - start, P]."""
        self._read_rows(0, start, out)
        return out

    def write(self, start: int, stop: int, state: "TeacherState") -> None:
        """Stores rows [start, stop) (tensors or arrays)."""
        for which in range(3):
            rows = np.asarray(state[which])
            if rows.shape != (stop - start, self.layout.size):
                raise ValueError(f"rows {start}:{stop} need shape "
                                 f"{(stop - start, self.layout.size)}, got {rows.shape}")
            self._write_rows(which, start, rows)
        self.steps[start:stop] = np.asarray(state.steps)

    def assign(self, name: str, array: np.ndarray, *, rows_per_copy: int = 64) -> None:
        """Replaces one of FILES with ``array`` (same shape), ``rows_per_copy`` rows at a
        time, so a memory-mapped source is never resident all at once."""
        target = self.steps if name == "steps" else self._arrays[self._index(name)]
        if array.shape != target.shape:
            raise ValueError(f"{name} needs shape {target.shape}, got {array.shape}")
        if name == "steps":
            target[...] = array
            return
        for start in range(0, self.num_teachers, rows_per_copy):
            self._write_rows(self._index(name), start, array[start:start + rows_per_copy])

    @staticmethod
    def _index(name: str) -> int:
        return ("weights", "adam_m", "adam_v").index(name)

    def sync(self) -> None:
        """Copies the RAM-resident rows to the files (no-op if none changed)."""
        if self._dirty:
            for which in range(3):
                self._files[which].write(0, self._resident[which])
            self._dirty = False

    def flush(self) -> None:
        """Makes a disk bank's files complete and durable."""
        if self._files is None:
            return
        self.sync()
        if isinstance(self.steps, np.memmap):
            self.steps.flush()
        for row_file in self._files:
            os.fsync(row_file.fd)


def _check_space(directory: str | os.PathLike, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise BankSpaceError(
            f"a disk-backed teacher bank needs {needed / 1e9:.1f} GB in {directory}, only "
            f"{free / 1e9:.1f} GB are free; free space there, point the bank at a larger "
            f"disk, or use fewer teachers")


def _preallocate(path: str, array: np.memmap) -> None:
    """Reserves the file's blocks now (a memory map would otherwise fail with SIGBUS when
    the disk fills mid-run)."""
    size = int(array.offset) + array.nbytes
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        raise BankSpaceError(f"cannot reserve {size / 1e9:.1f} GB for {path}: {error}"
                             ) from error
    finally:
        os.close(fd)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether b is exactly the array a (same buffer, shape and strides)."""
    return (isinstance(b, np.ndarray) and a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])
