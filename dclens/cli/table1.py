"""Summarises the paper-config Table 1 runs in results/: mean +- sd per protocol.

  python scripts/table1.py                      # results/*/report.json -> results/README.md
  python scripts/table1.py --print              # the table on stdout only

Reads every report.json under --results whose run is at the paper config, groups them by
(dataset, epsilon), adds the tuned configurations run at the paper scale (every report in
<results>/beyond/paper-scale/, one row per configuration, marked "beyond the paper"; see
results/beyond/README.md) and another method's runs at the paper scale (DP-MERF:
<results>/beyond/merf/<run>/, marked "another method"), and writes the table (val, sen, the authors' protocol with range 1
and 10; mean +- sample sd over runs; one line per run with commit, CPU and generator
initialisation) between the table1 markers of --markdown, plus a figure of every run's
real-test accuracy per classifier epoch (table1.png beside it). Reports are made by
scripts/reproduce.py; the authors' protocol is added with reproduce.py --add_authors.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from dclens.experiments import beyond, table1
from dclens.runs.output_checks import RunDirError, check_writable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="table1.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    parser.add_argument("--results", default="results", help="folder of reproduction "
                        "reports, one sub-folder per run [default: results]")
    parser.add_argument("--markdown", help="file whose table1 section is (re)written "
                        "[default: <results>/README.md]")
    parser.add_argument("--print", dest="print_only", action="store_true",
                        help="print the table instead of writing files")
    return parser


def unwritable_markdown(markdown: str) -> str | None:
    """Why the section and the figure beside ``markdown`` cannot be written, or None;
    checked before either is written."""
    folder = os.path.dirname(os.path.abspath(markdown))
    if os.path.isdir(markdown):
        return (f"--markdown {markdown!r} is a directory; give the markdown file to write, "
                f"e.g. {os.path.join(markdown, 'README.md')}")
    if not os.path.isdir(folder):
        return (f"--markdown {markdown!r}: its folder {folder!r} does not exist; create it "
                f"or choose another file")
    try:
        check_writable(folder, "--markdown")
    except RunDirError as error:
        return str(error)
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not os.path.isdir(args.results):
        print(f"table1.py: error: --results {args.results!r} is not a folder; pass the folder "
              f"that holds the reproduction reports (results/<name>/report.json)",
              file=sys.stderr)
        return 2
    try:
        runs = table1.collect(args.results)
        beyond_dir = os.path.join(args.results, "beyond")
        tuned = [dataclasses.replace(run, name=f"beyond/{beyond.PAPER_SCALE_DIR}/{run.name}")
                 for run in beyond.tuned_runs(beyond_dir)]
        tuned += [dataclasses.replace(run, name=f"beyond/{beyond.MERF_DIR}/{run.name}")
                  for run in beyond.merf_runs(beyond_dir)]
    except table1.ReportError as error:
        print(f"table1.py: error: {error}", file=sys.stderr)
        return 2
    if not runs:
        print(f"table1.py: error: no paper-config report.json under {args.results!r}; run "
              f"scripts/reproduce.py <dataset> --eps E first", file=sys.stderr)
        return 2
    if args.print_only:
        print(table1.render(runs + tuned))
        return 0
    markdown = args.markdown or os.path.join(args.results, "README.md")
    problem = unwritable_markdown(markdown)
    if problem is not None:
        print(f"table1.py: error: {problem}", file=sys.stderr)
        return 2
    figure = os.path.join(os.path.dirname(os.path.abspath(markdown)), "table1.png")
    try:        # the section first: its marker check refuses before anything is written
        table1.write_section(markdown, table1.render(runs + tuned, figure="table1.png"))
    except ValueError as error:
        print(f"table1.py: error: {error}", file=sys.stderr)
        return 2
    table1.plot(runs, figure)
    print(f"{len(runs)} paper-config runs, {len(tuned)} tuned -> {markdown} and {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
