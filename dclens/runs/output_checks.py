"""Checks of the paths a command will write, made before any work (outputs are written at
the end, after minutes or hours), and of whose run a run directory holds.

This module imports no TensorFlow (``table1.py`` and ``privacy.py`` use it) and creates
nothing: a refused path is left as it was.
"""

from __future__ import annotations

import json
import os
import tempfile


class RunDirError(RuntimeError):
    """The output directory cannot be used for this run (nothing was changed)."""


#: What wrote a run directory, by the ``kind`` of its config.json (:func:`run_kind`).
RUN_KINDS = {"dpsgd": "a private classifier run (scripts/dpsgd.py)",
             "gswgan": "a GS-WGAN run (scripts/gswgan.py)",
             "datalens": "a DataLens run (scripts/main.py, reproduce.py or tables.py)"}


def check_writable(path: str, flag: str) -> None:
    """The nearest existing ancestor of ``path`` must be a folder we can create files in
    (probed: ``os.access`` says yes to root even on read-only mounts).

    Raises:
      RunDirError: naming ``flag``, ``path`` and what to do.
    """
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise RunDirError(f"{flag} {path!r} cannot be created: {ancestor!r} is a "
                          "file, not a directory; choose another path")
    try:
        with tempfile.TemporaryFile(dir=ancestor, prefix=".dclens-probe-"):
            pass
    except OSError as error:
        raise RunDirError(f"{flag} {path!r} is not writable (cannot create a file "
                          f"in {ancestor!r}: {error.strerror}); choose a writable "
                          "directory") from error


def check_output_dir(path: str, flag: str = "--out") -> None:
    """Refuses an output folder that is a file or cannot be created or written.

    Raises:
      RunDirError: naming ``flag``, ``path`` and what to do.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunDirError(f"{flag} {path!r} exists and is not a directory; choose "
                          "another path")
    check_writable(path, flag)


def check_output_file(path: str, flag: str, example: str) -> None:
    """Refuses an output file whose path is a folder or whose folder cannot be written
    (``example``: a file name to suggest inside a folder given by mistake).

    Raises:
      RunDirError: naming ``flag``, ``path`` and what to do.
    """
    if os.path.isdir(path):
        raise RunDirError(f"{flag} {path!r} is a directory; give the file to write, "
                          f"e.g. {os.path.join(path, example)}")
    if os.path.exists(path):        # overwritten: its folder must take the new file
        path = os.path.dirname(os.path.abspath(path))
    check_writable(path, flag)


def run_kind(run_dir: str) -> str | None:
    """The kind of dclens run in ``run_dir``: the ``kind`` its config.json records, in
    lower case (a key of :data:`RUN_KINDS`), or ``datalens`` for a DataLens run of an
    older dclens that records none; None without a readable config.json (the trainers'
    own checks name that case)."""
    try:
        with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as stream:
            saved = json.load(stream)
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict):
        return None
    if isinstance(saved.get("kind"), str):
        return saved["kind"].lower()
    config = saved.get("config")
    if isinstance(config, dict) and "train" in config and "topagg" in config:
        return "datalens"
    return None


def check_run_kind(run_dir: str, kind: str, *, flag: str = "--run_dir",
                   restart: bool = True) -> None:
    """Refuses a run directory that holds another tool's run: resuming it with this tool's
    settings is impossible, and the settings-difference message would list every field of
    both.  ``restart``: the tool has --restart to set the old run aside.

    Raises:
      RunDirError: naming both kinds and what to do.
    """
    found = run_kind(run_dir)
    if found is None or found == kind:
        return
    what = RUN_KINDS.get(found, f"a run of kind {found!r}")
    raise RunDirError(
        f"{flag} {run_dir!r} holds {what}, not {RUN_KINDS[kind]}, so it cannot be resumed "
        f"here; choose a new {flag}" + (", or pass --restart to set it aside and start over"
                                        if restart else "") + " (nothing was changed)")
