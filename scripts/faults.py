#!/usr/bin/env python
"""Fault injection: SIGKILL a small training run, resume it, compare with an uninterrupted run: ``dclens.cli.faults`` (``python scripts/faults.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("faults"))
