"""dclens' command-line tools, one module each (``dclens.cli.main`` is the authors'
``main.py`` with their flag names).  ``scripts/<name>.py`` and the console entry points
(:mod:`dclens.cli.entry`) run them through :func:`run`, which sets TensorFlow's
environment before the tool (and so TensorFlow) is imported."""

from __future__ import annotations

import importlib
from typing import Sequence

from dclens.common import tf_env

#: The tools that never import TensorFlow (their results need only the accountant).
WITHOUT_TENSORFLOW = frozenset({"privacy", "plot_privacy"})


def run(name: str, argv: Sequence[str] | None = None) -> int:
    """Runs the tool ``dclens.cli.<name>``: sets the command line's TensorFlow environment
    first (:func:`dclens.common.tf_env.prepare_cli_environment`, before TensorFlow is
    imported), then returns the tool's ``main(argv)`` exit status."""
    tf_env.prepare_cli_environment()
    if name not in WITHOUT_TENSORFLOW:
        tf_env.import_tensorflow_quietly()
    tool = importlib.import_module(f"dclens.cli.{name}")
    return tool.main() if argv is None else tool.main(list(argv))
