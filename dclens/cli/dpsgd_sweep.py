"""Runs a grid of private classifier settings and chooses one on held-out validation data.

  python scripts/dpsgd_sweep.py --method gm --target_eps 1 --grid learning_rate=0.5,2,4 \\
      --root runs/dpsgd/sweep/gm-eps1
  python scripts/dpsgd_sweep.py --method topagg --target_eps 1 --grid learning_rate=1,2 \\
      --grid clip=1,4 --root runs/dpsgd/sweep/topagg-eps1

Every grid point is a scripts/dpsgd.py run (same flags, same defaults) in its own folder
under --root; repeating the command resumes the unfinished points and reads back the
finished ones. --root/sweep.json lists every point (validation and test accuracy, epsilon,
sigma) and the chosen one: the best validation accuracy; the test set takes no part.

Privacy: each point's epsilon covers that run alone. Choosing among the points is a further
use of the private data that no epsilon covers; run the chosen settings afresh (or fix the
settings before looking at the data) for a number to publish.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from dclens.cli import common_flags
from dclens.common import tf_env
from dclens.cli.dpsgd_flags import add_config_arguments
from dclens.dpsgd.sweep import GRID_SETTINGS
from dclens import data
from dclens.runs import rundir
from dclens.runs.checkpoint import CheckpointError
from dclens.cli.dpsgd_flags import config_from_args
from dclens.dpsgd.config import DpsgdConfigError
from dclens.dpsgd.sweep import SweepError, expand, parse_grid, run_sweep
from dclens.runs.journal import JournalError


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(
        prog="dpsgd_sweep.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    parser.add_argument("--root", required=True,
                        help="the sweep's folder: one run folder per point, and sweep.json")
    parser.add_argument("--grid", action="append", required=True, metavar="NAME=V1,V2,...",
                        help=f"values of one setting (repeatable; the grid is every "
                             f"combination); NAME is one of {', '.join(sorted(GRID_SETTINGS))}")
    add_config_arguments(parser)
    common_flags.add_quiet(parser, "no progress lines")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    try:
        grid = parse_grid(args.grid)
        base = config_from_args(args)
        expand(base, grid)                  # every point checked before any training
    except (DpsgdConfigError, SweepError) as error:
        parser.error(str(error))
    log = (lambda _: None) if args.quiet else (lambda line: print(line, flush=True))
    try:
        summary = run_sweep(base, grid, args.root, log=log, progress=not args.quiet)
    except (DpsgdConfigError, data.DataError, rundir.RunDirError, JournalError,
            CheckpointError) as error:
        print(f"dpsgd_sweep.py: error: {error}", file=sys.stderr)
        return 2
    chosen = summary["chosen"]
    print(f"chosen on validation: {chosen['name']} (validation "
          f"{chosen['validation_at_chosen']:.4f}, test {chosen['test_at_chosen']:.4f}, epsilon "
          f"{chosen['epsilon']:.4f}) of {len(summary['rows'])} points | "
          f"{pathlib.Path(args.root) / 'sweep.json'}")
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
