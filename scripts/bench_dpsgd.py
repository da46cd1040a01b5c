#!/usr/bin/env python
"""The private-classifier step's parts (dclens/dpsgd): seconds each, and NormTopK's fast: ``dclens.cli.bench_dpsgd`` (``python scripts/bench_dpsgd.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("bench_dpsgd"))
