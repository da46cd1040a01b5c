#!/usr/bin/env python
"""Trains GS-WGAN (Chen et al., NeurIPS 2020) on dclens' data, ledger and journal: ``dclens.cli.gswgan`` (``python scripts/gswgan.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("gswgan"))
