#!/usr/bin/env python
"""Choose the downstream classifier's learning rate on screening runs (tuning split): ``dclens.cli.tune_classifier`` (``python scripts/tune_classifier.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("tune_classifier"))
