#!/usr/bin/env python
"""Seconds per DataLens generator step by phase, for named configurations; prints JSON: ``dclens.cli.bench`` (``python scripts/bench.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("bench"))
