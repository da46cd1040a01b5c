#!/usr/bin/env python
"""Reproduce a row of the DataLens paper's Table 1: train -> samples -> evaluate -> report: ``dclens.cli.reproduce`` (``python scripts/reproduce.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("reproduce"))
