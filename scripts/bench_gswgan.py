#!/usr/bin/env python
"""Times GS-WGAN's two phases on this machine and projects the paper's run from them: ``dclens.cli.bench_gswgan`` (``python scripts/bench_gswgan.py --help``)."""

import sys

from dclens.cli import run

if __name__ == "__main__":
    sys.exit(run("bench_gswgan"))
