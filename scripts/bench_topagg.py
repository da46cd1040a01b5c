#!/usr/bin/env python
"""Times TopAgg's vote step (summed_votes): the pure-TF reference vs the custom op: ``dclens.cli.bench_topagg`` (``python scripts/bench_topagg.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("bench_topagg"))
