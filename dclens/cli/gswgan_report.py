"""Publishes GS-WGAN runs to results/gswgan/ and rewrites its table.

  python scripts/gswgan_report.py add runs/gswgan/fmnist-eps1-tiny
  python scripts/gswgan_report.py render

add copies a finished run's report.json and its evaluation (scripts/evaluate.py; add
--protocol authors --range 1 for the authors' column) with the small files beside them
(config, privacy, figures; not the samples) to results/gswgan/<name>/ (--name, default
the run folder's name); then it rewrites, and render alone rewrites, the table between
the markers of results/gswgan/README.md: one row per run with what its epsilon is worth
(proven, NOT proven, or NOT private), the other accounting's epsilon for the same spends,
its scale against the paper's config, and its evaluation. Text outside the markers is
left as written.
"""

from __future__ import annotations

import argparse
import sys

from dclens.common import tf_env
from dclens.common.paths import REPO_ROOT
from dclens.gswgan import report

RESULTS = str(REPO_ROOT / "results" / "gswgan")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gswgan_report.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    parser.add_argument("action", choices=("add", "render"))
    parser.add_argument("folders", nargs="*", help="finished, evaluated run folders (add)")
    parser.add_argument("--name", help="the published name (one folder only)")
    parser.add_argument("--results", default=RESULTS,
                        help="the results folder [default: results/gswgan]")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.action == "render" and args.folders:
        parser.error(f"render takes no folders (got {args.folders}); use add")
    if args.action == "add" and not args.folders:
        parser.error("add needs at least one run folder")
    if args.name and len(args.folders) != 1:
        parser.error(f"--name {args.name!r} names one folder, got {len(args.folders)}")

    try:
        for folder in args.folders:
            print(f"published {report.publish_run(folder, args.results, args.name)}")
        print(f"rewrote {report.write(args.results)}")
    except (report.ReportError, OSError) as error:
        print(f"gswgan_report.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()    # the config's defaults import dp_accounting
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
