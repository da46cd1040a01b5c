#!/usr/bin/env python
"""The cost of streaming a disk teacher bank, buffered and O_DIRECT; prints JSON: ``dclens.cli.bench_bank_io`` (``python scripts/bench_bank_io.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("bench_bank_io"))
