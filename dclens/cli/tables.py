"""Runs one of the paper's analysis tables: every row at one shared scale, a report each,
and one table with the paper's numbers beside ours.

  python scripts/tables.py --table 7 fashion_mnist --checkpoint_every 25   # paper scale
  python scripts/tables.py --table 5 fashion_mnist --teachers 400 --train_epochs 20
  python scripts/tables.py --table 4b fashion_mnist --teachers 400 --dry_run
  python scripts/tables.py --table 7 fashion_mnist --teachers 200 --max_records 3000 --matched_noise
  python scripts/tables.py --table 7 fashion_mnist --row fashion_mnist-eps1-no_topk   # one row
  python scripts/tables.py --table 7 fashion_mnist --render      # the table so far, no training
  python scripts/tables.py --table levers fashion_mnist --teachers 200 --max_records 3000 --matched_noise --training_records tuning
  python scripts/tables.py --table 6 fashion_mnist --bench results/tables/bench-table6-fmnist-eps1-4000-t200.json

Tables: 7 (ablation: - top-k, - stochastic quantisation, - threshold), 5 (TopAgg vs
D2P-Fed vs FetchSGD; their seconds per epoch are Table 6), 4k / 4t / 4b (Table 4(a):
top-k, teachers, beta); levers (beyond the paper: exact accounting, generator averaging;
it chooses hyper-parameters, so it runs on the tuning split only, and it also rewrites
README.md in the folder above its own -- results/beyond/README.md by default -- from
every levers table there, the paper-scale runs in its paper-scale/ folder and the Table 1
reports one folder further up).  All at epsilon = 1 (the paper's).  Table 6 alone is no training:
it is read from a scripts/bench.py report that ran one configuration with several
--aggregation values (see that script), into results/tables/table6-<dataset>/.  Each row is a reproduction
(scripts/reproduce.py) in results/tables/<table>-<dataset>[-scale]/<row>/ with its run in
runs/tables/<row>/; a finished row is read back, an unfinished one resumed, so a table
may span several sessions; table.md is rewritten after every row, the rows not yet run
marked so.  A row that another table at the same scale already finished (e.g. Table 7's
"- threshold" is Table 4(b)'s "beta = 0") is copied from there, not trained again.  The
classifier and evaluation flags are reproduce.py's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from dclens.cli import common_flags, graceful_stop, interrupted
from dclens.data import splits
from dclens.common import tf_env

from dclens.cli.evaluate import add_eval_arguments, settings_from_args
from dclens.experiments import beyond, tables
from dclens.experiments import paper_rows
from dclens.runs.output_checks import RunDirError, check_output_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tables.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    add = parser.add_argument
    add("dataset", choices=("mnist", "fashion_mnist", "celebA-gender"))
    add("--table", required=True, choices=("7", "5", "6", "4k", "4t", "4b", "levers"))
    add("--bench", help="Table 6: the scripts/bench.py JSON report to read")
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--scale", type=float, help="fraction of the paper's teachers")
    scale.add_argument("--teachers", type=int, help="teachers of every row (Table 4t's rows "
                       "keep the paper's ratios to it)")
    add("--matched_noise", action="store_true", help="with --scale / --teachers below "
        "the paper's: sigma scaled with the teachers (sigma x N / 4000) and one budget, "
        "the epsilon the paper's steps then cost: the paper's noise relative to the vote "
        "sum, so the rows can differ (NOT epsilon = 1; the table says so)")
    add("--train_epochs", type=int, help="cap every row's training at N epochs")
    add("--training_records", choices=[r.value for r in splits.TrainingRecords],
        help="which training records every row reads: all (the paper's); tuning (the "
             "tuning split, scored on its holdout instead of the test set: required by "
             "the levers table, which chooses hyper-parameters); private (all but the "
             "tuning split) [default: all]")
    add("--num_samples", type=int, help="synthetic samples per row (paper: 100000)")
    common_flags.add_data(parser)
    add("--teacher_chunk", type=int)
    add("--checkpoint_every", type=int, default=10)
    add("--out", help="table directory (default results/tables/<table>-<dataset>[-scale])")
    add("--dry_run", action="store_true", help="print each row's options and exit")
    add("--repeats", type=int, default=1, help="run every row N times (independent seeds; "
        "runs after the first are named -rep2, -rep3, ...) and show each row's mean and "
        "sd: single runs differ by about 0.07 in val between seeds at reduced scales")
    add("--row", action="append", dest="rows", metavar="NAME",
        help="train only this row (its run name, as --dry_run prints it; repeatable; with "
        "--repeats N the row's first name selects its N runs, NAME-rep2 that one alone); "
        "the other rows are read back if finished, else left 'not run'")
    add("--render", action="store_true", help="train nothing: write table.md from the "
        "finished rows, the others marked 'not run'")
    common_flags.add_quiet(parser)
    add_eval_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    if (args.table == "6") != (args.bench is not None):
        parser.error("--bench FILE goes with --table 6 (and only with it): Table 6 is read "
                     "from a scripts/bench.py report, e.g. python scripts/bench.py --config "
                     "fmnist-eps1-4000 --teachers 200 --aggregation topk_stochastic_sign "
                     "--aggregation klevel --aggregation fetchsgd --out bench.json")
    if args.rows and args.render:
        parser.error("--render trains nothing; --row NAME trains that row: give one of them")
    if args.table == "6" and (args.rows or args.render):
        parser.error("--row and --render are for the accuracy tables; Table 6 is read "
                     "from --bench")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1 (runs per row), got {args.repeats}")
    if args.checkpoint_every < 1:
        parser.error(f"--checkpoint_every must be >= 1 (generator steps between checkpoints), "
                     f"got {args.checkpoint_every}")
    try:        # checked for every table: a nonsensical number is refused, not ignored
        base = paper_rows.ReproduceOptions(
            dataset=args.dataset, eps=1, scale=args.scale, teachers=args.teachers,
            epochs=args.train_epochs, num_samples=args.num_samples,
            max_records=args.max_records, data_dir=args.data_dir,
            teacher_chunk=args.teacher_chunk, training_records=args.training_records)
        if args.matched_noise and args.table != "6":
            base = tables.matched_noise(base)
    except paper_rows.ReproduceError as error:
        parser.error(str(error))
    if args.table == "6":
        out = args.out or os.path.join("results", "tables", f"table6-{args.dataset}")
        try:
            check_output_dir(out)
            summary = tables.write_table6(args.bench, args.dataset, out)
        except (paper_rows.ReproduceError, RunDirError) as error:
            print(f"tables.py: error: {error}", file=sys.stderr)
            return 2
        for row in summary["rows"]:
            print(f"{row['row']}: {row['seconds_per_epoch']:.1f} s/epoch, "
                  f"{row['ratio_to_topagg']:.2f}x TopAgg (paper {row['paper_ratio_to_topagg']})")
        print(f"table: {os.path.join(out, 'table.md')}")
        return 0

    scale_tag = base.default_name()[len(f"{args.dataset}-eps1"):]
    out = args.out or (os.path.join("results", "beyond", f"levers-{args.dataset}{scale_tag}")
                       if args.table in tables.SCREENING_TABLES else
                       os.path.join("results", "tables",
                                    f"table{args.table}-{args.dataset}{scale_tag}"))
    if args.dry_run:
        for row in tables.TABLES[args.table][1]:
            for options in tables.repeated(tables.row_options(base, row), args.repeats):
                changed = {k: v for k, v in dataclasses.asdict(options).items()
                           if v is not None and k not in ("dataset", "eps")}
                print(f"{row.label}: {options.default_name()} {changed}")
        print(f"table directory: {out}")
        return 0
    log = (lambda _: None) if args.quiet else (lambda line: print(line, flush=True))
    try:
        settings = settings_from_args(args, args.dataset)
        check_output_dir(out)
        summary = tables.run_table(args.table, base, out_dir=out, log=log,
                                   settings=settings, cache_dir=args.cache_dir,
                                   progress=not args.quiet,
                                   checkpoint_every=args.checkpoint_every,
                                   only=args.rows, train=not args.render,
                                   repeats=args.repeats,
                                   training_stop=graceful_stop.GracefulStop("tables.py"))
    except (paper_rows.ReproduceError, RunDirError, ValueError, OSError) as error:
        print(f"tables.py: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stopped:
        where = f" ({stopped})" if str(stopped) else ""
        print(f"tables.py: interrupted{where}; the finished rows are kept, and the same "
              f"command goes on from them (a row's run resumes from its checkpoint): "
              f"{interrupted.resume_command('tables.py', sys.argv[1:] if argv is None else argv)}",
              file=sys.stderr)
        return interrupted.EXIT_INTERRUPTED
    if args.table in tables.SCREENING_TABLES:
        # results/beyond/README.md: this table beside the others and the paper-scale runs.
        beyond_dir = os.path.dirname(os.path.abspath(out))
        print(f"summary: {beyond.write_readme(beyond_dir, os.path.dirname(beyond_dir))}")
    for row in summary["rows"]:
        if row["status"] != "finished":
            print(f"{row['row']}: not run | paper {row['paper']}")
            continue
        print(f"{row['row']}: val {row['val']:.4f} | sen {row['sen']:.4f} | paper "
              f"{row['paper']}")
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # before TensorFlow is imported; see dclens/common/tf_env.py
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
