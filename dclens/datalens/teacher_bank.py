"""The teacher bank: every teacher's weights and Adam state, in RAM or on disk.

Three float32 arrays [N, P] (weights, Adam's first and second moments; P parameters per
teacher) and the per-teacher Adam step counts.  Each teacher has its own row (never shared:
sharing Adam's moments between teachers would make one teacher's update depend on another
teacher's data and break the one-teacher sensitivity of TopAgg).  In RAM, or in ``.npy``
files streamed chunk by chunk with explicit positional reads and writes (optionally with
the first teachers held in RAM), so only one chunk of teachers is ever materialised as
TensorFlow tensors (:mod:`dclens.datalens.bank_stream`).  On disk every row is padded to
whole 4096-byte blocks: no disk block holds two teachers' state, and rows can move past
the page cache (``O_DIRECT``) straight into and out of the chunk's staging buffers.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import shutil
import struct
from typing import Iterator

import numpy as np
import tensorflow as tf

from dclens.datalens.teachers import ParamLayout, TeacherState, initial_teacher_weights


class BankSpaceError(OSError):
    """The disk has no room for a disk-backed teacher bank (checked before any step)."""


#: Disk banks are read and written in whole blocks of this many bytes: each teacher's row
#: is padded to a multiple of it and the rows start at a multiple of it in the file, so no
#: disk block ever holds two teachers' state, and the rows can be moved with ``O_DIRECT``
#: (which needs file offsets, lengths and memory addresses aligned to the device's
#: logical block, 512 or 4096 bytes).
BLOCK = 4096

#: Bytes moved per bounce-buffer trip when a buffer cannot take direct I/O itself.
_BOUNCE_BYTES = 32 << 20

#: Rows per buffered scatter/gather call (a row and its padding are two of IOV_MAX = 1024).
_ROWS_PER_CALL = 256


def padded_columns(columns: int) -> int:
    """float32 columns of a disk bank's row of ``columns`` parameters (whole blocks)."""
    return -(-columns * 4 // BLOCK) * BLOCK // 4


class _PaddedBuffer(mmap.mmap):
    """Anonymous (zeroed, page-aligned) memory holding rows ``row_bytes`` apart, the bytes
    after each row's parameters being that row's own padding: the marker that lets
    :func:`_raw_rows` move a view's padding with its rows without touching anyone else's."""

    row_bytes: int


def _ask_for_huge_pages(buffer: mmap.mmap) -> None:
    """Asks the kernel to back a private anonymous buffer with transparent huge pages, as
    numpy does for its own large arrays: the fused kernel trains a chunk in place in its
    staging buffer, and with 4 KiB pages its tens of MB outrun the TLB (where transparent
    huge pages are off or the call is missing, nothing changes but the speed)."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None and len(buffer) >= 2 << 20:
        with contextlib.suppress(OSError):
            buffer.madvise(advice)


def aligned_rows(rows: int, columns: int, padded: int | None = None) -> np.ndarray:
    """A zeroed float32 [rows, columns] view of a page-aligned [rows, padded] buffer (the
    staging layout of a disk bank's rows: :meth:`_RowFile.read` and
    :meth:`_RowFile.write` move such views with one system call and no copy)."""
    padded = columns if padded is None else padded
    # private, not mmap's default MAP_SHARED: shared anonymous memory is shmem, which
    # transparent huge pages skip unless the machine's shmem setting allows them
    buffer = _PaddedBuffer(-1, max(rows * padded * 4, 1), flags=mmap.MAP_PRIVATE)
    buffer.row_bytes = padded * 4
    _ask_for_huge_pages(buffer)
    whole = np.frombuffer(buffer, np.float32, count=rows * padded).reshape(rows, padded)
    return whole[:, :columns]


def _raw_rows(array: np.ndarray, row_bytes: int) -> memoryview | None:
    """The bytes of ``array``'s rows with each row's padding, if ``array`` [n, P] is whole
    rows of an :func:`aligned_rows` buffer whose rows are ``row_bytes`` apart; else None
    (any other array: the bytes after its rows may belong to someone else)."""
    if not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.ndim != 2:
        return None
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    owner = getattr(root.base, "obj", None)
    if not isinstance(owner, _PaddedBuffer) or owner.row_bytes != row_bytes:
        return None
    n, columns = array.shape
    low, first = root.ctypes.data, array.ctypes.data
    if (n > 1 and array.strides[0] != row_bytes) or (columns > 1 and array.strides[1] != 4) \
            or (first - low) % row_bytes or columns * 4 > row_bytes \
            or first + n * row_bytes > low + root.nbytes:
        return None
    return memoryview(root.view(np.uint8))[first - low:first - low + n * row_bytes]


def create_row_file(path: str | os.PathLike, rows: int, columns: int) -> np.memmap:
    """A preallocated ``.npy`` of float32 [rows, padded_columns(columns)] whose data starts
    at byte :data:`BLOCK` (the header padded with spaces, as the format allows), returned
    as a memory map of its [rows, columns] parameters."""
    padded = padded_columns(columns)
    prefix = b"\x93NUMPY\x01\x00"
    header = repr({"descr": np.dtype(np.float32).str, "fortran_order": False,
                   "shape": (rows, padded)}).encode("latin1")
    room = BLOCK - len(prefix) - 2
    header = header + b" " * (room - len(header) - 1) + b"\n"
    with open(path, "wb") as file:
        file.write(prefix + struct.pack("<H", len(header)) + header)
    _preallocate(path, BLOCK + rows * padded * 4)
    whole = np.memmap(path, np.float32, mode="r+", offset=BLOCK, shape=(rows, padded))
    return whole[:, :columns]


class _RowFile:
    """Positional row I/O on one bank file (:func:`create_row_file`'s layout).

    Streaming rows through explicit reads and writes instead of the memory map keeps the
    mapped pages out of the process's resident set: a bank larger than RAM is read and
    written one chunk at a time, never all mapped at once.  With ``direct`` the file is
    opened ``O_DIRECT``: rows move between the disk and the process's buffers without the
    page cache (whose copies, allocation and reclaim otherwise cost ~1.6 CPU-seconds per
    GiB on a 2-core EPYC, on the cores the teachers compute on); ``direct=None`` uses it
    where the file system takes it and falls back to buffered I/O elsewhere (tmpfs, some
    network file systems).  An array that is not a staging view (:func:`aligned_rows`)
    moves through a bounce buffer or row by row; the bytes on disk are the same any way.
    """

    def __init__(self, array: np.memmap, *, direct: bool | None = None):
        self.path = array.filename
        self.offset = int(array.offset)
        self.row_bytes = int(array.strides[0])
        self.columns = int(array.shape[1])
        self.direct = False
        aligned = self.offset % BLOCK == 0 and self.row_bytes % BLOCK == 0
        if direct and not aligned:
            raise ValueError(f"{self.path}: rows at byte {self.offset}, {self.row_bytes} "
                             f"bytes apart, are not {BLOCK}-byte aligned for direct I/O")
        if direct is not False and aligned and hasattr(os, "O_DIRECT"):
            self.direct = self._try_direct(required=bool(direct))
        if not self.direct:
            self.fd = os.open(self.path, os.O_RDWR)
        self._padding = np.zeros(max(self.row_bytes - 4 * self.columns, 0), np.uint8)

    def _try_direct(self, *, required: bool) -> bool:
        """Opens the file O_DIRECT and reads one block to see that the file system takes it."""
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_DIRECT)
        except OSError as error:
            if required:
                raise OSError(f"{self.path}: this file system refuses O_DIRECT ({error}); "
                              f"use buffered bank I/O (direct_io=None or False)") from error
            return False
        probe = mmap.mmap(-1, BLOCK)
        try:
            os.preadv(self.fd, [probe], 0)
            return True
        except OSError as error:
            os.close(self.fd)
            del self.fd                   # never closed again by __del__ (it may be reused)
            if required:
                raise OSError(f"{self.path}: direct reads fail on this file system "
                              f"({error}); use buffered bank I/O") from error
            return False

    # ----------------------------------------------------------------- transfers
    def _transfer(self, call, buffers: list, position: int, what: str) -> None:
        """Moves every byte of ``buffers`` at ``position`` (retrying short transfers)."""
        views = [memoryview(b).cast("B") for b in buffers]
        while views:
            count = call(self.fd, views, position)
            if count <= 0:
                raise OSError(f"short {what} of {self.path} at byte {position}")
            position += count
            while views and count >= len(views[0]):
                count -= len(views[0])
                views.pop(0)
            if views and count:
                views[0] = views[0][count:]

    def _row_buffers(self, rows: np.ndarray, padding: np.ndarray) -> list:
        """Scatter/gather buffers for buffered I/O: each row of ``rows`` [n, P] (which must
        be contiguous), then ``padding`` for the bytes after it on disk."""
        buffers = []
        for row in rows:
            buffers.append(row)
            if len(padding):
                buffers.append(padding)
        return buffers

    def _bounce_trips(self, n: int, position: int) -> Iterator[tuple[int, np.ndarray, int]]:
        """O_DIRECT's way in and out for an array that is not a staging view: (first row,
        rows of one aligned bounce buffer of at most _BOUNCE_BYTES, file position) per
        trip over ``n`` rows starting at byte ``position``."""
        bounce = aligned_rows(max(1, min(n, _BOUNCE_BYTES // self.row_bytes)),
                              self.columns, self.row_bytes // 4)
        for first in range(0, n, len(bounce)):
            yield (first, bounce[:min(len(bounce), n - first)],
                   position + first * self.row_bytes)

    def read(self, start: int, out: np.ndarray) -> None:
        """Rows [start, start + len(out)) of the file into ``out`` [n, P]."""
        position, n = self.offset + start * self.row_bytes, len(out)
        if n == 0:
            return
        raw = _raw_rows(out, self.row_bytes)
        if raw is not None and (not self.direct or _aligned(raw)):
            self._transfer(os.preadv, [raw], position, "read")      # one call, no copy
        elif not self.direct:
            target = out if _rows_contiguous(out) else np.empty(out.shape, np.float32)
            scratch = np.empty_like(self._padding)
            for first in range(0, n, _ROWS_PER_CALL):
                self._transfer(os.preadv,
                               self._row_buffers(target[first:first + _ROWS_PER_CALL], scratch),
                               position + first * self.row_bytes, "read")
            if target is not out:
                out[...] = target
        else:
            for first, bounce, at in self._bounce_trips(n, position):
                self._transfer(os.preadv, [_raw_rows(bounce, self.row_bytes)], at, "read")
                out[first:first + len(bounce)] = bounce

    def write(self, start: int, rows: np.ndarray) -> None:
        """``rows`` [n, P] into rows [start, start + n) of the file (their padding zero)."""
        position, n = self.offset + start * self.row_bytes, len(rows)
        if n == 0:
            return
        raw = _raw_rows(rows, self.row_bytes)
        if raw is not None and (not self.direct or _aligned(raw)):
            self._transfer(os.pwritev, [raw], position, "write")    # one call, no copy
        elif not self.direct:
            source = rows if _rows_contiguous(rows) else np.ascontiguousarray(rows)
            for first in range(0, n, _ROWS_PER_CALL):
                self._transfer(os.pwritev,
                               self._row_buffers(source[first:first + _ROWS_PER_CALL],
                                                 self._padding),
                               position + first * self.row_bytes, "write")
        else:
            for first, bounce, at in self._bounce_trips(n, position):
                bounce[...] = rows[first:first + len(bounce)]
                self._transfer(os.pwritev, [_raw_rows(bounce, self.row_bytes)], at, "write")

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


def _rows_contiguous(rows: np.ndarray) -> bool:
    """Whether each row of a float32 [n, P] array is contiguous in memory."""
    return rows.dtype == np.float32 and (rows.shape[1] <= 1 or rows.strides[1] == 4)


def _aligned(raw: memoryview) -> bool:
    """Whether a buffer's address and length suit O_DIRECT."""
    address = np.frombuffer(raw, np.uint8).ctypes.data if len(raw) else 0
    return address % BLOCK == 0 and len(raw) % BLOCK == 0


def bank_bytes(layout: ParamLayout, num_teachers: int) -> int:
    """Bytes of a bank: weights and two Adam moments in float32 plus int64 step counts."""
    return num_teachers * (3 * 4 * layout.size + 8)


def bank_file_bytes(layout: ParamLayout, num_teachers: int) -> int:
    """Disk bytes of a disk bank: three files of padded rows behind a one-block header, and
    the step counts (at most one block of header)."""
    return 3 * (BLOCK + num_teachers * padded_columns(layout.size) * 4) \
        + BLOCK + 8 * num_teachers


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

    On disk each teacher's row is padded to whole :data:`BLOCK`-byte blocks (no block holds
    two teachers' state); ``direct_io`` moves the rows with ``O_DIRECT``, past the page
    cache (None, the default: where the file system takes it; True: required; False:
    never; see :class:`_RowFile`).

    ``weights``, ``adam_m``, ``adam_v``: the whole [N, P] arrays, for checkpoints and tests.
    For a bank in RAM they are the (writable) arrays themselves; on disk they are read-only
    memory maps, the resident tier synced first (write through :meth:`assign`/:meth:`write`).
    """

    FILES = ("weights", "adam_m", "adam_v", "steps")

    def __init__(self, weights: np.ndarray, adam_m: np.ndarray, adam_v: np.ndarray,
                 steps: np.ndarray, layout: ParamLayout, *, resident_rows: int = 0,
                 direct_io: bool | None = None):
        n, p = weights.shape
        if p != layout.size or adam_m.shape != (n, p) or adam_v.shape != (n, p) \
                or steps.shape != (n,):
            raise ValueError(f"inconsistent teacher bank: weights {weights.shape}, adam_m "
                             f"{adam_m.shape}, adam_v {adam_v.shape}, steps {steps.shape}, "
                             f"layout size {layout.size}")
        self.layout = layout
        self.steps = steps
        self._arrays = (weights, adam_m, adam_v)
        self._files = ([_RowFile(a, direct=direct_io) for a in self._arrays]
                       if all(isinstance(a, np.memmap) and a.filename for a in self._arrays)
                       else None)
        resident = min(max(int(resident_rows), 0), n) if self._files is not None else 0
        self._resident = tuple(np.empty((resident, p), np.float32) for _ in range(3))
        for which in range(3 if resident else 0):   # positional reads: no mapped pages
            self._files[which].read(0, self._resident[which])
        self._dirty = False

    # ----------------------------------------------------------------- whole arrays
    def _whole(self, which: int) -> np.ndarray:
        if self._files is None:
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
    def direct_io(self) -> bool:
        """Whether the files are read and written with O_DIRECT (no page cache)."""
        return self._files is not None and all(f.direct for f in self._files)

    def staging(self, rows: int, *, with_adam: bool) -> "TeacherState":
        """Buffers for up to ``rows`` teachers' state read from disk: float32 [rows, P]
        views laid out as the files' padded rows, which :meth:`read_into` fills and
        :meth:`write` stores with one system call each and no copy (Adam moments None
        unless ``with_adam``)."""
        padded = self._files[0].row_bytes // 4 if self._files is not None else None
        def rows_of() -> np.ndarray:
            return aligned_rows(rows, self.layout.size, padded)
        moments = (rows_of(), rows_of()) if with_adam else (None, None)
        return TeacherState(rows_of(), *moments, np.empty(rows, np.int64))

    @property
    def resident_rows(self) -> int:
        """Rows [0, resident_rows) of a disk bank live in RAM (0 for a bank in RAM)."""
        return len(self._resident[0])

    @classmethod
    def create(cls, layout: ParamLayout, num_teachers: int, *, seed: int,
               directory: str | os.PathLike | None = None, resident_rows: int = 0,
               init_chunk: int = 256, first_teacher: int = 0,
               total_teachers: int | None = None,
               direct_io: bool | None = None, shared_init: bool = False) -> "TeacherBank":
        """A freshly initialised bank (teacher i's initial weights depend on (seed, i)).

        ``first_teacher`` / ``total_teachers``: this bank holds teachers [first_teacher,
        first_teacher + num_teachers) of a run of ``total_teachers`` (default: all of
        them), initialised exactly as those rows of the whole run's bank are (a shard).
        ``shared_init``: every teacher gets the same initial weights: one teacher's draw
        from the seed's first init stream (so every shard draws the same row).
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
            _check_space(directory, bank_file_bytes(layout, num_teachers) - reused)
        for name in cls.FILES:
            dims = (num_teachers,) if name == "steps" else shape
            dtype = np.int64 if name == "steps" else np.float32
            if directory is None:
                arrays[name] = np.zeros(dims, dtype)
            elif name == "steps":
                path = os.path.join(directory, f"{name}.npy")
                arrays[name] = np.lib.format.open_memmap(path, mode="w+", dtype=dtype,
                                                         shape=dims)
                _preallocate(path, int(arrays[name].offset) + arrays[name].nbytes)
            else:
                arrays[name] = create_row_file(os.path.join(directory, f"{name}.npy"), *shape)
        seeds = np.random.SeedSequence(seed).spawn(math.ceil(total / init_chunk))
        bank = cls(arrays["weights"], arrays["adam_m"], arrays["adam_v"], arrays["steps"],
                   layout, resident_rows=resident_rows, direct_io=direct_io)
        last = first_teacher + num_teachers
        # shared_init: one teacher's draw from the first chunk's stream, for every row
        shared = (initial_teacher_weights(layout, 1, np.random.default_rng(seeds[0]))
                  if shared_init else None)
        for index in range(first_teacher // init_chunk, math.ceil(last / init_chunk)):
            start = index * init_chunk                  # the whole run's init chunk ...
            stop = min(start + init_chunk, total)
            if shared is not None:
                rows = np.broadcast_to(shared, (stop - start, layout.size))
            else:
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


def _preallocate(path: str | os.PathLike, size: int) -> None:
    """Reserves the file's first ``size`` bytes now (a memory map would otherwise fail with
    SIGBUS when the disk fills mid-run)."""
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
