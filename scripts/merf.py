#!/usr/bin/env python
"""DP-MERF: a generator fitted to one private release of the class-conditional mean embedding: ``dclens.cli.merf`` (``python scripts/merf.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("merf"))
