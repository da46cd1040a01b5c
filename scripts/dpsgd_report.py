#!/usr/bin/env python
"""Publishes private-classifier runs and sweeps to results/dpsgd/ and rewrites its table: ``dclens.cli.dpsgd_report`` (``python scripts/dpsgd_report.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("dpsgd_report"))
