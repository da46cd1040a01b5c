#!/usr/bin/env python
"""Epsilon per generator step of a run (paper Fig. 2): the spent, data-independent bound: ``dclens.cli.plot_privacy`` (``python scripts/plot_privacy.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("plot_privacy"))
