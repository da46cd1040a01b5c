#!/usr/bin/env python
"""Privacy calculator for DataLens' TopAgg: epsilon, step budget or calibrated sigma: ``dclens.cli.privacy`` (``python scripts/privacy.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("privacy"))
