#!/usr/bin/env python
"""Publishes GS-WGAN runs to results/gswgan/ and rewrites its table: ``dclens.cli.gswgan_report`` (``python scripts/gswgan_report.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("gswgan_report"))
