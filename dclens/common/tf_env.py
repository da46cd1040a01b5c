"""What dclens' command-line tools set for TensorFlow, before TensorFlow is imported.

Only the scripts in ``scripts/`` call :func:`prepare_cli_environment`, first thing under
``if __name__ == "__main__"``; the library never touches the process's environment.  It
sets two variables, each only where the user has not set it already:

* ``TF_ENABLE_ONEDNN_OPTS=1``.  TF turns its oneDNN CPU kernels on by default only on
  some CPUs (AVX-512-class); on others (e.g. AVX2-only EPYCs) they are off.  dclens runs
  either way (:mod:`dclens.datalens.teacher_conv` picks a convolution path that works), but oneDNN
  makes the teachers' training about 1.5x faster on an AVX2 EPYC (docs/performance.md).
  ``TF_ENABLE_ONEDNN_OPTS=0 python scripts/main.py ...`` turns it off.
* ``TF_CPP_MIN_LOG_LEVEL=3``: TF's C++ logs stay quiet (on a CPU-only machine they
  include ``failed call to cuInit``, which is harmless but reads like a failure).  Errors
  still reach the user as Python exceptions.  While this default is in force, the lines
  TF prints to stderr during its import (before its logging is set up, ignoring the log
  level) are dropped too.  Set ``TF_CPP_MIN_LOG_LEVEL=0`` to see all of TF's logs.

This module imports nothing of TensorFlow at module level.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
LOG_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
CLI_DEFAULTS = {ONEDNN_VARIABLE: "1", LOG_LEVEL_VARIABLE: "3"}


def prepare_cli_environment() -> dict[str, str]:
    """Sets :data:`CLI_DEFAULTS` where unset; returns the variables it set.

    Does nothing (and returns {}) if TensorFlow is already imported: its settings are read
    at import, and changing them afterwards would only mislead.
    """
    if "tensorflow" in sys.modules:
        return {}
    applied = {}
    for name, value in CLI_DEFAULTS.items():
        if name not in os.environ:
            os.environ[name] = value
            applied[name] = value
    return applied


@contextlib.contextmanager
def _stderr_discarded() -> Iterator[None]:
    """Points file descriptor 2 at /dev/null for the block (C++ writes included)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow, dropping its import-time stderr lines if the log level is the
    CLI default (3); a user who set another level sees everything."""
    if "tensorflow" in sys.modules:
        return
    if os.environ.get(LOG_LEVEL_VARIABLE) == CLI_DEFAULTS[LOG_LEVEL_VARIABLE]:
        with _stderr_discarded():
            import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    else:
        import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
