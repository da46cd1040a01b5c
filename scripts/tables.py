#!/usr/bin/env python
"""Runs one of the paper's analysis tables: every row at one shared scale, a report each,: ``dclens.cli.tables`` (``python scripts/tables.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("tables"))
