"""Publishes private-classifier runs and sweeps to results/dpsgd/ and rewrites its table.

  python scripts/dpsgd_report.py add runs/dpsgd/gm-eps1
  python scripts/dpsgd_report.py add_sweep runs/dpsgd/sweep/gm-eps1
  python scripts/dpsgd_report.py render

add copies a finished run's report.json to results/dpsgd/<name>.json (--name, default the
run folder's name); add_sweep copies a sweep's sweep.json to results/dpsgd/sweeps/ and each
finished point's report beside the runs. Both then rewrite, and render alone rewrites, the
table between the markers of results/dpsgd/README.md: one row per method, budget and
settings, mean +- sd over its runs. The text outside the markers is left as written.
"""

from __future__ import annotations

import argparse
import sys

from dclens.common import tf_env
from dclens.common.paths import REPO_ROOT
from dclens.dpsgd import report

RESULTS = str(REPO_ROOT / "results" / "dpsgd")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpsgd_report.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    parser.add_argument("action", choices=("add", "add_sweep", "render"))
    parser.add_argument("folders", nargs="*", help="run folders (add) or sweep roots (add_sweep)")
    parser.add_argument("--name", help="the published name (one folder only)")
    parser.add_argument("--results", default=RESULTS,
                        help="the results folder [default: results/dpsgd]")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.action == "render" and args.folders:
        parser.error(f"render takes no folders (got {args.folders}); use add or add_sweep")
    if args.action != "render" and not args.folders:
        parser.error(f"{args.action} needs at least one folder")
    if args.name and len(args.folders) != 1:
        parser.error(f"--name {args.name!r} names one folder, got {len(args.folders)}")

    try:
        for folder in args.folders:
            publish = report.publish_run if args.action == "add" else report.publish_sweep
            written = publish(folder, args.results, args.name)
            for path in [written] if isinstance(written, str) else written:
                print(f"published {path}")
        print(f"rewrote {report.write(args.results)}")
    except (report.ReportError, ValueError, OSError) as error:
        print(f"dpsgd_report.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()    # the settings' defaults import TensorFlow
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
