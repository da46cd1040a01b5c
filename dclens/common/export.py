"""Writing a run's outputs atomically: samples, the authors' pickle layout, JSON, PNG grids.

Every file is written to a temporary name in the same directory, fsynced, renamed over
the final name and the directory fsynced, so a crash never leaves a half-written output
behind and a completed write survives a power loss.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import tempfile
from typing import Any, Callable, Iterator

import numpy as np


def fsync_directory(path: str | os.PathLike) -> None:
    """Makes a rename or creation inside ``path`` durable (no-op where unsupported)."""
    try:
        handle = os.open(os.fspath(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


#: The name prefix of :func:`atomic_path`'s temporary files (a kill can leave one behind).
TEMPORARY_PREFIX = ".tmp-"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary path beside ``path``; renames it to ``path`` if the block succeeds."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = os.path.splitext(path)[1]
    handle, temporary = tempfile.mkstemp(prefix=TEMPORARY_PREFIX, suffix=suffix,
                                         dir=directory)
    os.close(handle)
    try:
        yield temporary
        with open(temporary, "rb+") as stream:
            os.fsync(stream.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)   # mkstemp makes 0600 files
        os.replace(temporary, path)
        fsync_directory(directory)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def file_sha256(path: str | os.PathLike, *, chunk: int = 16 << 20) -> str:
    """The SHA-256 of a file's bytes (hex), read ``chunk`` bytes at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Calls ``write(stream)`` on a temporary file that becomes ``path`` when it is complete."""
    with atomic_path(path) as temporary:
        with open(temporary, mode) as stream:
            write(stream)


def write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write(path, lambda s: json.dump(data, s, indent=2, sort_keys=True), mode="w")


def write_samples_npz(path: str | os.PathLike, images: np.ndarray, labels: np.ndarray) -> None:
    """``x`` float32 [N, H, W, C] in [0, 1] and ``y`` int64 [N] class labels."""
    atomic_write(path, lambda s: np.savez(s, x=images.astype(np.float32),
                                          y=labels.astype(np.int64)))


def authors_rows(images: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The authors' row format: flattened pixels in [0, 1] followed by the one-hot label."""
    flat = images.reshape(len(images), -1).astype(np.float32)
    return np.concatenate([flat, np.eye(num_classes, dtype=np.float32)[labels]], axis=1)


def authors_pickle_paths(directory: str | os.PathLike, epsilon: float | None,
                         num_files: int = 10) -> list[str]:
    """``eps-1.00.data-0.pkl`` ... as the authors name them; ``non_private`` when no budget."""
    stem = "non_private.data" if epsilon is None else f"eps-{epsilon:.2f}.data"
    return [os.path.join(os.fspath(directory), f"{stem}-{i}.pkl") for i in range(num_files)]


#: An authors'-layout pickle: its set's stem and its index.
_AUTHORS_PICKLE = re.compile(r"((?:eps-[0-9.]+|non_private)\.data)-\d+\.pkl")


def set_aside_other_pickle_sets(directory: str | os.PathLike, keep: list[str]) -> list[str]:
    """Moves every authors'-layout pickle in ``directory`` that is not in ``keep`` (another
    budget's set, e.g. from before a run was extended) into ``<directory>/superseded/``, so
    it cannot be mistaken for the run's samples; nothing is deleted.  Returns the moved
    file names."""
    directory = os.fspath(directory)
    kept = {os.path.basename(path) for path in keep}
    moved = []
    for name in sorted(os.listdir(directory)):
        if _AUTHORS_PICKLE.fullmatch(name) and name not in kept:
            os.makedirs(os.path.join(directory, "superseded"), exist_ok=True)
            os.replace(os.path.join(directory, name),
                       os.path.join(directory, "superseded", name))
            moved.append(name)
    return moved


def write_authors_pickles(directory: str | os.PathLike, images: np.ndarray, labels: np.ndarray,
                          *, num_classes: int, epsilon: float | None,
                          num_files: int = 10) -> list[str]:
    """Writes the samples as ``num_files`` pickles of equal slices of rows (authors' layout).

    Each file holds a float32 array [rows, H*W*C + num_classes]; plain pickles, which both
    ``pickle.load`` and the authors' ``joblib.load`` read.
    """
    paths = authors_pickle_paths(directory, epsilon, num_files)
    slices = np.array_split(np.arange(len(images)), num_files)
    for path, index in zip(paths, slices):
        rows = authors_rows(images[index], labels[index], num_classes)
        atomic_write(path, lambda s, rows=rows: pickle.dump(rows, s, protocol=4))
    return paths


def read_authors_pickles(paths: list[str], image_shape: tuple[int, int, int],
                         num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`write_authors_pickles`: (images [N, H, W, C], labels [N])."""
    rows = []
    for path in paths:
        with open(path, "rb") as stream:
            rows.append(np.asarray(pickle.load(stream), dtype=np.float32))
    data = np.concatenate(rows)
    dim = int(np.prod(image_shape))
    if data.shape[1] != dim + num_classes:
        raise ValueError(f"{paths[0]}: rows have {data.shape[1]} columns, expected "
                         f"{dim} pixels + {num_classes} label columns")
    return data[:, :dim].reshape(-1, *image_shape), data[:, dim:].argmax(axis=1)


def image_grid(images: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Tiles images [rows*cols, H, W, C] into one [rows*H, cols*W, C] array (1-pixel gaps)."""
    n, h, w, c = images.shape
    if n != rows * cols:
        raise ValueError(f"need {rows * cols} images for a {rows}x{cols} grid, got {n}")
    grid = np.ones((rows * (h + 1) - 1, cols * (w + 1) - 1, c), np.float32)
    for index in range(n):
        r, q = divmod(index, cols)
        grid[r * (h + 1):r * (h + 1) + h, q * (w + 1):q * (w + 1) + w] = images[index]
    return grid


def write_grid_png(path: str | os.PathLike, grid: np.ndarray, *, title: str = "",
                   row_labels: list[str] | None = None) -> None:
    """Saves a grid (from :func:`image_grid`) as a PNG with matplotlib (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    height, width = grid.shape[:2]
    figure = pyplot.figure(figsize=(max(4.0, width / 40 + 1.5), max(3.0, height / 40 + 0.6)),
                           dpi=100)
    axes = figure.add_subplot(1, 1, 1)
    picture = grid[..., 0] if grid.shape[-1] == 1 else grid
    axes.imshow(np.clip(picture, 0, 1), cmap="gray" if grid.shape[-1] == 1 else None,
                vmin=0, vmax=1, interpolation="nearest")
    axes.set_xticks([])
    if row_labels:
        step = height / len(row_labels)
        axes.set_yticks([step * (i + 0.5) for i in range(len(row_labels))])
        axes.set_yticklabels(row_labels, fontsize=7)
    else:
        axes.set_yticks([])
    if title:
        axes.set_title(title, fontsize=8)
    figure.tight_layout()
    atomic_write(path, lambda s: figure.savefig(s, format="png"))
    pyplot.close(figure)
