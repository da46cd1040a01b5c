#!/usr/bin/env python
"""Runs dclens beside the authors' TF1 DataLens code, step for step, and compares them: ``dclens.cli.side_by_side`` (``python scripts/side_by_side.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("side_by_side"))
