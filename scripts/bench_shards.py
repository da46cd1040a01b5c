#!/usr/bin/env python
"""The sharded teachers (``main.py --shards``, dclens/datalens/sharded.py): cost and projection; JSON: ``dclens.cli.bench_shards`` (``python scripts/bench_shards.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("bench_shards"))
