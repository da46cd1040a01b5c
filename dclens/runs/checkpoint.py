"""Atomic, complete-or-absent checkpoints of a run's state.

A checkpoint is a folder ``ckpt-<step>`` (``step`` = generator steps completed) holding one
``.npy`` file per array and ``state.json``.  It is written as ``.tmp-ckpt-<step>-<pid>``:
every file is fsynced, ``state.json`` is written last, then the folder is renamed to its
final name and the parent folder fsynced.  A folder named ``ckpt-<step>`` is therefore
always complete; leftovers of a crash (``.tmp-ckpt-*``) are ignored and removed.  Only the
newest ``keep`` checkpoints are kept; older ones are removed after a newer one is complete.

The store knows nothing about DataLens: it saves named arrays and a JSON-able state dict
(see :meth:`dclens.datalens.train.DataLens.state_arrays` for what a run puts in).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from typing import Any, Callable, Mapping

import numpy as np

from dclens.common import export

STATE_FILE = "state.json"
CHECKPOINT_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d+)$")
_ARRAY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read."""


class CheckpointSpaceError(CheckpointError):
    """The disk has no room for the next checkpoint (nothing was written)."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk: its folder, step and state dict."""

    path: str
    step: int
    state: dict[str, Any]

    def array_names(self) -> list[str]:
        return sorted(self.state["arrays"])

    def load_array(self, name: str, *, mmap: bool = False) -> np.ndarray:
        """One saved array (memory-mapped read-only when ``mmap``), checked against state."""
        if name not in self.state["arrays"]:
            raise CheckpointError(f"checkpoint {self.path} has no array {name!r} (it has "
                                  f"{self.array_names()})")
        path = os.path.join(self.path, f"{name}.npy")
        try:
            array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise CheckpointError(f"cannot read {path} ({error}); the checkpoint is damaged: "
                                  "move it aside to resume from an older one, or --restart"
                                  ) from error
        want = self.state["arrays"][name]
        if list(array.shape) != want["shape"] or str(array.dtype) != want["dtype"]:
            raise CheckpointError(f"{path} holds {array.dtype}{list(array.shape)}, but "
                                  f"{STATE_FILE} says {want['dtype']}{want['shape']}; the "
                                  "checkpoint is damaged")
        return array


def _save_array(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as stream:
        np.save(stream, array, allow_pickle=False)
        stream.flush()
        os.fsync(stream.fileno())


class CheckpointStore:
    """The checkpoints of one run, in ``directory``.

    Args:
      directory: the folder of checkpoint folders (created on the first save).
      keep: how many complete checkpoints to keep (>= 1).
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int = 1):
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an integer >= 1, got {keep!r}")
        self.directory = os.fspath(directory)
        self.keep = keep

    def _complete(self) -> list[tuple[int, str]]:
        if not os.path.isdir(self.directory):
            return []
        found = []
        for name in os.listdir(self.directory):
            match = _NAME.match(name)
            if match and os.path.isfile(os.path.join(self.directory, name, STATE_FILE)):
                found.append((int(match.group(1)), os.path.join(self.directory, name)))
        return sorted(found)

    def remove_partial(self) -> list[str]:
        """Deletes the temporary folders a crash left behind; returns their paths."""
        if not os.path.isdir(self.directory):
            return []
        removed = []
        for name in os.listdir(self.directory):
            if name.startswith(".tmp-ckpt-"):
                path = os.path.join(self.directory, name)
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        return removed

    def save(self, step: int, arrays: Mapping[str, np.ndarray], state: Mapping[str, Any], *,
             before_commit: Callable[[], None] | None = None) -> Checkpoint:
        """Writes checkpoint ``ckpt-<step>`` atomically and prunes old ones.

        Args:
          step: generator steps completed.
          arrays: name -> array; names must be simple file names.
          state: JSON-serialisable run state (stored with the arrays' shapes and dtypes).
          before_commit: called when every file is durable but before the rename (fault
            injection in tests).
        """
        for name in arrays:
            if not _ARRAY_NAME.match(name):
                raise ValueError(f"array name {name!r} is not a simple file name")
        os.makedirs(self.directory, exist_ok=True)
        self._make_room(sum(np.asarray(a).nbytes for a in arrays.values()) + (1 << 20))
        final = os.path.join(self.directory, f"ckpt-{step:06d}")
        temporary = os.path.join(self.directory, f".tmp-ckpt-{step:06d}-{os.getpid()}")
        shutil.rmtree(temporary, ignore_errors=True)
        os.makedirs(temporary)
        try:
            described = {}
            for name, array in arrays.items():
                array = np.asarray(array)
                _save_array(os.path.join(temporary, f"{name}.npy"), array)
                described[name] = {"shape": list(array.shape), "dtype": str(array.dtype)}
            record = {"version": CHECKPOINT_VERSION, "step": step, "arrays": described,
                      **dict(state)}
            with open(os.path.join(temporary, STATE_FILE), "w") as stream:
                json.dump(record, stream, indent=2, sort_keys=True)
                stream.flush()
                os.fsync(stream.fileno())
            export.fsync_directory(temporary)
            if before_commit is not None:
                before_commit()
            replaced = None
            if os.path.exists(final):          # the same step saved again (e.g. final state)
                replaced = os.path.join(self.directory, f".tmp-ckpt-replaced-{step:06d}")
                shutil.rmtree(replaced, ignore_errors=True)
                os.rename(final, replaced)
            os.rename(temporary, final)
            export.fsync_directory(self.directory)
            if replaced is not None:
                shutil.rmtree(replaced, ignore_errors=True)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        for _, path in self._complete()[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        return Checkpoint(final, step, record)

    def _make_room(self, needed: int) -> None:
        """Removes older checkpoints early if the new one would not fit beside them.

        A crash while the new one is written then leaves no checkpoint (the run restarts
        from step 0; the journal still counts every spend).  Raises
        :class:`CheckpointSpaceError` if even that is not enough.
        """
        complete = self._complete()
        while shutil.disk_usage(self.directory).free < needed and complete:
            shutil.rmtree(complete.pop(0)[1], ignore_errors=True)
        free = shutil.disk_usage(self.directory).free
        if free < needed:
            raise CheckpointSpaceError(
                f"a checkpoint needs {needed / 2**30:.1f} GiB but {self.directory} has "
                f"{free / 2**30:.1f} GiB free; free disk space or use a --checkpoint_dir on "
                "a larger disk")

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint, or None."""
        complete = self._complete()
        if not complete:
            return None
        return self._read(*complete[-1])

    def at(self, step: int) -> Checkpoint | None:
        """The complete checkpoint of ``step``, or None."""
        for saved, path in self._complete():
            if saved == step:
                return self._read(saved, path)
        return None

    @staticmethod
    def _read(step: int, path: str) -> Checkpoint:
        state_path = os.path.join(path, STATE_FILE)
        try:
            with open(state_path) as stream:
                state = json.load(stream)
        except (OSError, ValueError) as error:
            raise CheckpointError(f"cannot read {state_path} ({error}); move {path} aside to "
                                  "resume from an older checkpoint, or --restart") from error
        if state.get("version") != CHECKPOINT_VERSION or state.get("step") != step:
            raise CheckpointError(f"{state_path} is not a version-{CHECKPOINT_VERSION} dclens "
                                  f"checkpoint of step {step}")
        return Checkpoint(path, step, state)
