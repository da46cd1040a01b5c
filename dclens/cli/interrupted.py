"""What a tool prints when the user presses Ctrl-C during a run: one line saying where the
run stopped, what is kept and the command that resumes it (the run directory is crash-safe:
the ledger is written ahead of every release and checkpoints are complete or absent)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from typing import Sequence

from dclens.runs.checkpoint import CheckpointError, CheckpointStore
from dclens.runs.rundir import RunPaths

#: The exit status of a process ended by SIGINT (128 + 2), as shells report it.
EXIT_INTERRUPTED = 130


def _spent_steps(paths: RunPaths) -> int | None:
    """The steps (DataLens, DP-SGD) or iterations (GS-WGAN) privacy.json records."""
    try:
        with open(paths.privacy) as stream:
            record = json.load(stream)
    except (OSError, ValueError):
        return None
    for key in ("steps", "iterations_spent"):
        if isinstance(record.get(key), int):
            return record[key]
    return None


def resume_command(tool: str, argv: Sequence[str]) -> str:
    """The command line that goes on where ``scripts/<tool>`` was stopped: the same one."""
    return shlex.join(["python", f"scripts/{tool}", *argv])


def message(tool: str, run_dir: str, argv: Sequence[str]) -> str:
    """``<tool>: interrupted at step N; kept: ...; resume with: <command>``."""
    paths = RunPaths(run_dir)
    steps = _spent_steps(paths)
    try:
        latest = (CheckpointStore(paths.checkpoints).latest()
                  if os.path.isdir(paths.checkpoints) else None)
    except CheckpointError:         # a damaged one says so when the run is resumed
        latest = None
    where = "before the first step" if not steps else f"at step {steps}"
    kept = (f"the privacy ledger ({paths.journal}) and the checkpoint of step {latest.step}"
            + (" (nothing to redo)" if steps is not None and latest.step == steps else "")
            if latest is not None else
            f"the privacy ledger ({paths.journal}); no checkpoint yet, so a resume starts "
            "over and the spends so far stay counted")
    if not os.path.exists(paths.journal):
        kept = "nothing (no spend was made)"
    command = resume_command(tool, argv)
    return f"{tool}: interrupted {where}; kept: {kept}; resume with: {command}"


def report(tool: str, run_dir: str, argv: Sequence[str] | None) -> int:
    """Prints :func:`message` to stderr; returns :data:`EXIT_INTERRUPTED`."""
    print(message(tool, run_dir, sys.argv[1:] if argv is None else argv), file=sys.stderr)
    return EXIT_INTERRUPTED
