"""What a disk bank's I/O costs the machine, with no teacher compute (``scripts/bench_bank_io.py``).

A pass reads every teacher's weights and Adam moments from a disk bank and writes them
back, chunk by chunk, through :class:`dclens.datalens.bank_stream.ChunkStream` (the
prefetching, write-behind stream a training step uses), but computes nothing: what is
left is the I/O alone.  Per pass: wall seconds, the CPU seconds of this process (all its
threads), and the CPU seconds of the whole machine (``/proc/stat``: this process plus the
kernel's own writeback and reclaim threads, which buffered I/O runs on the same cores as
the teachers).  Divided by the GiB moved (read plus written), these say what streaming
the bank takes from a training step running beside it.

Before each pass the bank's files are written out and dropped from the page cache
(``posix_fadvise(DONTNEED)``), so every read comes from the disk, as it does for a bank
larger than RAM, whichever I/O mode moves it.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import tempfile
import time
from typing import Any

from dclens.datalens import networks, teacher_bank, teachers
from dclens.datalens.bank_stream import ChunkStream

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class BankIOOptions:
    """A bank-I/O measurement.

    Attributes:
      teachers: teachers in the bank (all on disk: no RAM tier).
      chunk: teachers per chunk (the preset's teacher_chunk is 10).
      passes: timed passes per I/O mode.
      modes: ``"buffered"`` (through the page cache) and/or ``"direct"`` (O_DIRECT where
        the file system takes it; each result says in ``direct_io`` whether it did).
      shape: the teachers' image shape (Fashion-MNIST's by default).
      directory: where the bank's files go (default: a temporary folder here, removed).
    """

    teachers: int = 400
    chunk: int = 10
    passes: int = 2
    modes: tuple[str, ...] = ("buffered", "direct")
    shape: networks.ImageShape = networks.ImageShape(28, 28, 1, 10)
    directory: str | None = None


def _machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine spent not idle (``/proc/stat``, cumulative)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)       # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _drop_page_cache(bank: teacher_bank.TeacherBank, directory: str) -> None:
    bank.flush()
    for name in teacher_bank.TeacherBank.FILES:
        descriptor = os.open(os.path.join(directory, f"{name}.npy"), os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def stream_pass(bank: teacher_bank.TeacherBank, chunk: int) -> None:
    """Reads every chunk (weights and moments) and writes it back unchanged."""
    with ChunkStream(bank, chunk, with_adam=True) as stream:
        for part in stream:
            stream.write_back(part, part.state)


def measure_mode(options: BankIOOptions, mode: str, directory: str) -> dict[str, Any]:
    """Passes of one I/O mode over a fresh bank in ``directory``."""
    if mode not in ("buffered", "direct"):
        raise ValueError(f"unknown bank I/O mode {mode!r}; use 'buffered' or 'direct'")
    layout = teachers.ParamLayout.for_shape(options.shape)
    bank = teacher_bank.TeacherBank.create(layout, options.teachers, seed=0,
                                           directory=directory,
                                           # direct where the file system takes it:
                                           direct_io=None if mode == "direct" else False)
    moved = 2 * 3 * options.teachers * teacher_bank.padded_columns(layout.size) * 4
    passes = []
    for _ in range(options.passes):
        _drop_page_cache(bank, directory)
        wall, process, machine = (time.perf_counter(), _process_cpu_seconds(),
                                  _machine_busy_seconds())
        stream_pass(bank, options.chunk)
        bank.flush()                                 # the writes are on the disk
        wall = time.perf_counter() - wall
        process = _process_cpu_seconds() - process
        machine = _machine_busy_seconds() - machine
        passes.append({"wall_seconds": wall, "process_cpu_seconds": process,
                       "machine_cpu_seconds": machine,
                       "gib_per_second": moved / GIB / wall,
                       "process_cpu_seconds_per_gib": process / (moved / GIB),
                       "machine_cpu_seconds_per_gib": machine / (moved / GIB)})
    return {"mode": mode, "direct_io": bank.direct_io, "teachers": options.teachers,
            "chunk": options.chunk, "gib_moved_per_pass": moved / GIB, "passes": passes}


def measure(options: BankIOOptions) -> list[dict[str, Any]]:
    """:func:`measure_mode` for each of ``options.modes``, each on its own fresh bank."""
    if options.teachers < 1 or options.chunk < 1 or options.passes < 1:
        raise ValueError(f"teachers, chunk and passes must be >= 1, got {options.teachers}, "
                         f"{options.chunk}, {options.passes}")
    results = []
    with tempfile.TemporaryDirectory(prefix="dclens-bank-io-",
                                     dir=options.directory or os.getcwd()) as root:
        for mode in options.modes:
            folder = os.path.join(root, mode)
            results.append(measure_mode(options, mode, folder))
            for name in teacher_bank.TeacherBank.FILES:       # disk room for the next mode
                os.remove(os.path.join(folder, f"{name}.npy"))
    return results
