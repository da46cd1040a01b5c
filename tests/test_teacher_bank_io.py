"""A disk bank's row files (dclens.datalens.teacher_bank): padded rows, direct and buffered I/O.

The slow, obviously correct reference is a numpy mirror of the file: every read must return
the mirror's rows, every write must change exactly the written rows of the file (each
teacher's bytes, padding included, are its own: a write of some teachers never changes a
byte of another's), whichever way the bytes move -- one system call on a staging view, a
scatter/gather of plain rows, or a bounce buffer -- and with O_DIRECT or through the page
cache.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

from dclens.datalens import networks, teacher_bank, teachers

COLUMNS = 1500          # 6000 bytes: rows padded to 8192, so every row has padding


def _direct_supported(directory) -> bool:
    path = os.path.join(directory, "probe.npy")
    teacher_bank.create_row_file(path, 1, COLUMNS)
    try:
        teacher_bank._RowFile(teacher_bank.create_row_file(path, 1, COLUMNS), direct=True)
        return True
    except OSError:
        return False


@pytest.fixture(params=[False, True], ids=["buffered", "direct"])
def row_file(request, tmp_path):
    if request.param and not _direct_supported(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    array = teacher_bank.create_row_file(tmp_path / "rows.npy", 9, COLUMNS)
    rows = teacher_bank._RowFile(array, direct=request.param)
    assert rows.direct == request.param
    return rows


def _destinations(n: int):
    """Arrays [n, COLUMNS] of every kind a caller may hand over."""
    staging = teacher_bank.aligned_rows(n + 2, COLUMNS, teacher_bank.padded_columns(COLUMNS))
    ram = np.zeros((n + 3, COLUMNS), np.float32)          # rows packed: no padding after them
    fortran = np.zeros((n, COLUMNS), np.float32, order="F")  # rows not contiguous
    return {"staging": staging[1:1 + n], "packed rows": ram[1:1 + n], "fortran": fortran}


def _file_rows(row_file) -> np.ndarray:
    return np.load(row_file.path)


@pytest.mark.parametrize("kind", ["staging", "packed rows", "fortran"])
@pytest.mark.parametrize("start,n", [(0, 1), (0, 9), (3, 4), (8, 1)])
def test_writes_change_exactly_their_rows_and_reads_return_them(row_file, kind, start, n):
    rng = np.random.default_rng(start * 10 + n)
    mirror = rng.normal(size=(9, COLUMNS)).astype(np.float32)
    row_file.write(0, mirror)
    before = _file_rows(row_file)
    np.testing.assert_array_equal(before[:, :COLUMNS], mirror)
    assert not before[:, COLUMNS:].any()                    # padding: zeros

    source = _destinations(n)[kind]
    source[...] = rng.normal(size=(n, COLUMNS))
    row_file.write(start, source)
    mirror[start:start + n] = source
    after = _file_rows(row_file)
    np.testing.assert_array_equal(after[:, :COLUMNS], mirror)
    assert not after[:, COLUMNS:].any()
    others = np.ones(9, bool)
    others[start:start + n] = False
    assert after[others].tobytes() == before[others].tobytes()   # every byte of the others

    out = _destinations(n)[kind]
    row_file.read(start, out)
    np.testing.assert_array_equal(out, mirror[start:start + n])


def test_a_read_into_one_row_of_a_packed_array_leaves_its_neighbours(row_file):
    """The coincidence a padded copy would hit: row 0 of a packed [3, P] array starts where
    a padded buffer's row would, but the bytes after it are row 1's, not padding."""
    row_file.write(0, np.full((9, COLUMNS), 7.0, np.float32))
    packed = np.arange(3 * COLUMNS, dtype=np.float32).reshape(3, COLUMNS)
    untouched = packed[1:].copy()
    row_file.read(2, packed[:1])
    assert (packed[0] == 7.0).all()
    np.testing.assert_array_equal(packed[1:], untouched)


def test_a_staging_view_moves_in_one_piece_without_a_copy(row_file, monkeypatch):
    staging = teacher_bank.aligned_rows(4, COLUMNS, teacher_bank.padded_columns(COLUMNS))
    calls = []
    real_preadv = os.preadv
    monkeypatch.setattr(teacher_bank.os, "preadv",
                        lambda fd, buffers, position: calls.append(len(buffers))
                        or real_preadv(fd, buffers, position))
    row_file.read(2, staging[1:4])
    assert calls == [1]


@pytest.mark.parametrize("rows, wants_huge_pages", [(400, True), (2, False)])
def test_large_staging_buffers_ask_for_huge_pages(monkeypatch, rows, wants_huge_pages):
    # numpy asks for transparent huge pages for its large arrays (the RAM bank's); the
    # staging buffers the fused kernel trains in must too, or a streamed chunk's tens of
    # MB run on 4 KiB pages.  Buffers under one huge page are left alone.
    if not hasattr(teacher_bank.mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this platform")
    advised = []
    monkeypatch.setattr(teacher_bank._PaddedBuffer, "madvise",
                        lambda self, advice, *rest: advised.append((advice, len(self))),
                        raising=False)
    padded = teacher_bank.padded_columns(COLUMNS)
    staging = teacher_bank.aligned_rows(rows, COLUMNS, padded)
    size = rows * padded * 4
    assert (size >= 2 << 20) == wants_huge_pages
    assert advised == ([(teacher_bank.mmap.MADV_HUGEPAGE, size)] if wants_huge_pages else [])
    assert not staging.any()
    # and the mapping is private: a shared anonymous one is shmem, which huge pages skip
    flags = _mapping_flags(staging.ctypes.data)
    if flags is not None:
        assert "sh" not in flags, flags


def _mapping_flags(address: int) -> list[str] | None:
    """The VmFlags of the mapping holding ``address`` (Linux), else None."""
    try:
        text = pathlib.Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    inside = False
    for line in text.splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None


def test_rows_of_other_layouts_are_not_taken_for_staging_views():
    padded = teacher_bank.padded_columns(COLUMNS) * 4
    staging = teacher_bank.aligned_rows(3, COLUMNS, padded // 4)
    assert teacher_bank._raw_rows(staging, padded) is not None
    assert len(teacher_bank._raw_rows(staging[1:], padded)) == 2 * padded
    assert teacher_bank._raw_rows(staging, padded + 4096) is None      # other row size
    assert teacher_bank._raw_rows(staging[:, 1:], padded) is None      # mid-row start
    assert teacher_bank._raw_rows(np.zeros((3, COLUMNS), np.float32), padded) is None
    assert teacher_bank._raw_rows(staging.copy(), padded) is None


@pytest.mark.parametrize("direct_io", [False, None])
def test_disk_bank_files_hold_the_ram_banks_rows(tmp_path, direct_io):
    layout = teachers.ParamLayout.for_shape(networks.ImageShape(8, 8, 3, 2))
    ram = teacher_bank.TeacherBank.create(layout, 5, seed=3)
    disk = teacher_bank.TeacherBank.create(layout, 5, seed=3, directory=tmp_path,
                                           resident_rows=2, direct_io=direct_io)
    assert disk.direct_io is (False if direct_io is False else disk.direct_io)
    np.testing.assert_array_equal(disk.weights, ram.weights)
    assert not disk.weights.flags.writeable        # write through assign / write
    on_disk = np.load(tmp_path / "adam_v.npy")
    assert on_disk.shape == (5, teacher_bank.padded_columns(layout.size))
    assert on_disk.shape[1] * 4 % teacher_bank.BLOCK == 0
    assert teacher_bank.bank_file_bytes(layout, 5) >= sum(
        os.path.getsize(tmp_path / f"{name}.npy") for name in teacher_bank.TeacherBank.FILES)


def test_direct_io_required_on_misaligned_rows_is_refused_by_name(tmp_path):
    array = np.lib.format.open_memmap(tmp_path / "plain.npy", mode="w+", dtype=np.float32,
                                      shape=(2, COLUMNS))
    with pytest.raises(ValueError, match="not 4096-byte aligned for direct I/O"):
        teacher_bank._RowFile(array, direct=True)
    assert not teacher_bank._RowFile(array, direct=None).direct


def test_a_bounce_buffer_smaller_than_the_rows_moves_them_in_several_trips(row_file,
                                                                           monkeypatch):
    monkeypatch.setattr(teacher_bank, "_BOUNCE_BYTES", 2 * row_file.row_bytes)
    rows = np.random.default_rng(5).normal(size=(5, COLUMNS)).astype(np.float32)
    row_file.write(3, rows)                                  # trips of 2, 2 and 1 rows
    np.testing.assert_array_equal(_file_rows(row_file)[3:8, :COLUMNS], rows)
    out = np.zeros((5, COLUMNS), np.float32)
    row_file.read(3, out)
    np.testing.assert_array_equal(out, rows)
