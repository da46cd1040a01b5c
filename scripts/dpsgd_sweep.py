#!/usr/bin/env python
"""Runs a grid of private classifier settings and chooses one on held-out validation data: ``dclens.cli.dpsgd_sweep`` (``python scripts/dpsgd_sweep.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("dpsgd_sweep"))
