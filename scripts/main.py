#!/usr/bin/env python
"""dclens command line, with the flag names of the DataLens authors' main.py: ``dclens.cli.main`` (``python scripts/main.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("main"))
