"""Where a run came from: the command line, the dclens commit and the versions of the
packages that decide its numbers, recorded in every run's config.json."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys

from dclens.common import machine
from dclens.common.paths import REPO_ROOT

#: The packages whose versions are recorded.
PACKAGES = ("tensorflow", "keras", "numpy", "dp-accounting", "scipy")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git(*args: str) -> str | None:
    """``git args`` in the dclens checkout: its stripped output, None if it fails."""
    try:
        done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> dict[str, object] | None:
    """The dclens checkout's commit and whether tracked files had uncommitted changes
    (untracked files, e.g. a run's outputs under results/, do not count); None outside a
    git checkout."""
    head = git("rev-parse", "HEAD")
    if head is None:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head, "uncommitted_changes": bool(status)}


def provenance() -> dict[str, object]:
    """{"command", "git", "python", "packages", "machine"} for config.json; "machine" is
    the CPU by name, its vector extensions and its core count (they decide TF's float32
    bits and the run's speed)."""
    return {"command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
            "git": commit(), "python": platform.python_version(),
            "packages": {name: _version(name) for name in PACKAGES},
            "machine": {"cpu": machine.cpu_model_name(),
                        "cpu_vector_extensions": machine.cpu_vector_extensions(),
                        "cpu_count": os.cpu_count()}}
