#!/usr/bin/env python
"""Trains a classifier privately on the real data: DP-SGD, TopAgg for DP-SGD, or GEP: ``dclens.cli.dpsgd`` (``python scripts/dpsgd.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("dpsgd"))
