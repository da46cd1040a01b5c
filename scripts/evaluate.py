#!/usr/bin/env python
"""Evaluate synthetic data: train the authors' classifier on it, test on the real test set: ``dclens.cli.evaluate`` (``python scripts/evaluate.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("evaluate"))
