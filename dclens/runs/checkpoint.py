"""Atomic, complete-or-absent checkpoints of a run's state.

A checkpoint is a folder ``ckpt-<step>`` (``step`` = generator steps completed) holding one
``.npy`` file per array and ``state.json``.  It is written as ``.tmp-ckpt-<step>-<pid>``:
every file is fsynced, ``state.json`` is written last, then the folder is renamed to its
final name and the parent folder fsynced.  A folder named ``ckpt-<step>`` is therefore
always complete; leftovers of a crash (``.tmp-ckpt-*``) are ignored and removed.  Only the
newest ``keep`` checkpoints are kept (two by default, so that a damaged newest one leaves an
older one to resume from); older ones are removed after a newer one is complete.

Integrity: a folder that is complete can still be damaged later (a bad disk, a copy cut
short, a stray write).  ``state.json`` records the SHA-256 of every array file as it was
written, and a SHA-256 of its own content (``state_sha256``); reading an array or the state
recomputes them and refuses a mismatch by file name, before anything of it is used.  A
run's disk-backed teacher bank is scratch space rewritten every step; its durable copy is
the checkpoint's teacher arrays, which are checksummed like every other array, and a resume
restores the bank from them.

The store knows nothing about DataLens: it saves named arrays and a JSON-able state dict
(see :meth:`dclens.datalens.train.DataLens.state_arrays` for what a run puts in).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from typing import Any, Callable, Mapping

import numpy as np

from dclens.common import export

STATE_FILE = "state.json"
CHECKPOINT_VERSION = 2
#: Checkpoints of version 1 (before checksums) are still read, without the integrity check.
_READABLE_VERSIONS = (1, 2)
_STATE_DIGEST = "state_sha256"
_READ_CHUNK = 16 << 20
_NAME = re.compile(r"^ckpt-(\d+)$")
_ARRAY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read."""


class CheckpointSpaceError(CheckpointError):
    """The disk has no room for the next checkpoint (nothing was written)."""


class CheckpointDamaged(CheckpointError):
    """A complete checkpoint's bytes are not those that were written (checksum mismatch)."""


def _state_sha256(record: Mapping[str, Any]) -> str:
    """SHA-256 of the state's canonical JSON, without its own digest field."""
    body = {key: value for key, value in record.items() if key != _STATE_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _damaged(path: str, what: str) -> CheckpointDamaged:
    folder = os.path.dirname(path)
    return CheckpointDamaged(
        f"{path} is damaged: {what}. Nothing of it was used. Move {folder} aside (e.g. "
        f"mv {folder} {folder}.damaged) to resume from the checkpoint before it (the ledger "
        "keeps counting the spends made since), or pass --restart")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk: its folder, step and state dict."""

    path: str
    step: int
    state: dict[str, Any]

    def array_names(self) -> list[str]:
        return sorted(self.state["arrays"])

    def load_array(self, name: str, *, mmap: bool = False) -> np.ndarray:
        """One saved array (memory-mapped read-only when ``mmap``), checked against state.

        Raises:
          CheckpointDamaged: the file's SHA-256 is not the one recorded when it was written.
        """
        if name not in self.state["arrays"]:
            raise CheckpointError(f"checkpoint {self.path} has no array {name!r} (it has "
                                  f"{self.array_names()})")
        path = os.path.join(self.path, f"{name}.npy")
        recorded = self.state["arrays"][name].get("sha256")
        if recorded is not None:
            try:
                actual = export.file_sha256(path, chunk=_READ_CHUNK)
            except OSError as error:
                raise CheckpointError(f"cannot read {path} ({error}); the checkpoint is "
                                      "damaged: move it aside to resume from an older one, "
                                      "or --restart") from error
            if actual != recorded:
                raise _damaged(path, f"its SHA-256 is {actual[:16]}..., but {STATE_FILE} "
                                     f"recorded {recorded[:16]}... when it was written")
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


class _HashingWriter:
    """A write-only stream that hashes what passes through it to a real file."""

    def __init__(self, stream):
        self.stream = stream
        self.digest = hashlib.sha256()

    def write(self, data) -> int:
        self.digest.update(data)
        return self.stream.write(data)


def _save_array(path: str, array: np.ndarray) -> str:
    """Writes ``array`` as ``.npy`` durably; returns the SHA-256 of the bytes written."""
    with open(path, "wb") as stream:
        writer = _HashingWriter(stream)
        np.save(writer, array, allow_pickle=False)
        stream.flush()
        os.fsync(stream.fileno())
    return writer.digest.hexdigest()


class CheckpointStore:
    """The checkpoints of one run, in ``directory``.

    Args:
      directory: the folder of checkpoint folders (created on the first save).
      keep: how many complete checkpoints to keep (>= 1; two, so that a damaged newest one
        leaves one to resume from; the disk cost is one more copy of the run's state, and
        older ones are removed early when the disk has no room for the next).
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int = 2):
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
                digest = _save_array(os.path.join(temporary, f"{name}.npy"), array)
                described[name] = {"shape": list(array.shape), "dtype": str(array.dtype),
                                   "sha256": digest}
            record = {"version": CHECKPOINT_VERSION, "step": step, "arrays": described,
                      **dict(state)}
            record[_STATE_DIGEST] = _state_sha256(record)
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
        self._remove_oldest_while_short(self._complete(), needed)
        free = shutil.disk_usage(self.directory).free
        if free < needed:
            raise CheckpointSpaceError(
                f"a checkpoint needs {needed / 2**30:.1f} GiB but {self.directory} has "
                f"{free / 2**30:.1f} GiB free; free disk space or put the run directory on "
                "a larger disk")

    def make_room_beside_latest(self, needed: int) -> list[str]:
        """Removes checkpoints older than the newest while the disk has less than
        ``needed`` bytes free; returns their paths.

        For what a finished run writes after its final checkpoint (samples, pickles, the
        generator): the newest checkpoint is enough to write them again, so an older one
        is only a spare.  The newest is never removed; if the room is still short, the
        caller's writes fail as they would have, and the run stays resumable.
        """
        return self._remove_oldest_while_short(self._complete()[:-1], needed)

    def _remove_oldest_while_short(self, candidates: list[tuple[int, str]],
                                   needed: int) -> list[str]:
        """Removes ``candidates`` (complete checkpoints, oldest first) one by one while the
        disk has less than ``needed`` bytes free; returns the removed paths."""
        removed = []
        for _, path in candidates:
            if shutil.disk_usage(self.directory).free >= needed:
                break
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        return removed

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
        if not isinstance(state, dict) or state.get("version") not in _READABLE_VERSIONS \
                or state.get("step") != step:
            raise CheckpointError(f"{state_path} is not a version-{CHECKPOINT_VERSION} dclens "
                                  f"checkpoint of step {step}")
        if state["version"] >= 2:
            recorded = state.get(_STATE_DIGEST)
            if recorded != _state_sha256(state):
                raise _damaged(state_path, f"its content does not match its {_STATE_DIGEST} "
                                           "(recorded when it was written)")
            missing = [name for name, described in state.get("arrays", {}).items()
                       if "sha256" not in described]
            if missing:
                raise _damaged(state_path, f"it records no SHA-256 for {missing}")
        return Checkpoint(path, step, state)
