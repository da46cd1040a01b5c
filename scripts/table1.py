#!/usr/bin/env python
"""Summarises the paper-config Table 1 runs in results/: mean +- sd per protocol: ``dclens.cli.table1`` (``python scripts/table1.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("table1"))
