"""Chooses the downstream classifier's learning rate on screening runs (tuning split).

  python scripts/tune_classifier.py runs/tables/RUN1 runs/tables/RUN2 \\
      --learning_rates 1e-3 1e-4 --out results/beyond/classifier

Each RUN must be a finished screening run (trained with --training_records tuning, so
scored on the tuning holdout): any other run is refused, because a choice read from its
scores would look at private records or the test set. Every candidate learning rate
trains the authors' classifier on every run's samples (the default schedule otherwise:
Adam, batch 256, 20 epochs; no IS/FID); the one with the highest mean val is chosen.
<out>/<run>/<candidate>.json keeps each evaluation (a repeated call reuses them, so an
interrupted call resumes), <out>/summary.json and <out>/README.md the table (and, for
an --out of the form <beyond>/classifier/<set> or <beyond>/rescored/<group>,
<beyond>/README.md is regenerated: a rescored group's records give the screen's levers
their val at the paper-scale rows' classifier rate). Then
evaluate private runs with the chosen rate unchanged:
python scripts/evaluate.py RUN --learning_rate <chosen>. On a tie the earlier learning
rate is kept, so give the default's (1e-3) first. The choice holds for the number of
samples it was made with (the classifier's steps per epoch grow with it): evaluate a
larger run with --max_samples set to that number to keep the schedule the same.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from dclens.experiments import beyond, classifier_tuning
from dclens.evaluation import classifiers, evaluate
from dclens.runs.output_checks import RunDirError, check_output_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tune_classifier.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="screening run directories (samples.npz, config.json)")
    parser.add_argument("--learning_rates", type=float, nargs="+", default=[1e-3, 1e-4],
                        metavar="LR", help="candidate learning rates, the default's first "
                        "[default: 1e-3 1e-4]")
    parser.add_argument("--epochs", type=int, default=classifiers.DEFAULT_SCHEDULE.epochs,
                        help="classifier epochs of every candidate [default: %(default)s]")
    parser.add_argument("--max_samples", type=int, help="evaluate a seeded random subset of "
                        "this many samples of each run (a quick look)")
    parser.add_argument("--out", required=True, help="folder of the records and the table")
    parser.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)   # runs may follow the flags
    error = _check(args)
    if error:
        print(f"tune_classifier.py: error: {error}", file=sys.stderr)
        return 2
    try:
        check_output_dir(args.out, "--out")
        base = classifiers.Schedule(epochs=args.epochs)
        candidates = classifier_tuning.learning_rate_candidates(args.learning_rates, base=base)
        settings = evaluate.EvalSettings(quality=False, max_samples=args.max_samples)
        log = _progress_only if args.quiet else print
        records = classifier_tuning.evaluate_candidates(
            args.runs, candidates, out_dir=args.out, settings=settings, log=log)
        summary = classifier_tuning.summarise(records, candidates)
    except (classifier_tuning.TuningError, classifiers.ScheduleError,
            evaluate.EvaluationError, RunDirError) as failure:
        print(f"tune_classifier.py: error: {failure}", file=sys.stderr)
        return 2
    classifier_tuning.write_summary(summary, args.out)
    parent = os.path.dirname(os.path.abspath(args.out))
    if os.path.basename(parent) in (beyond.CLASSIFIER_DIR, beyond.RESCORED_DIR):
        # results/beyond/classifier/<set>: results/beyond/README.md shows every choice;
        # results/beyond/rescored/<group>: its screen shows the rescored val.
        beyond_dir = os.path.dirname(parent)
        print(f"summary: {beyond.write_readme(beyond_dir, os.path.dirname(beyond_dir))}")
    for row in summary["rows"]:
        print(f"{row['candidate']}: val {row['val_mean']:.4f} over {len(row['runs'])} runs")
    print(f"chosen: {summary['chosen']} -> {args.out}/README.md")
    return 0


def _progress_only(line: str) -> None:
    """With --quiet: the one line per evaluation, not the per-epoch ones."""
    if line.startswith("[tune]"):
        print(line, flush=True)


def _check(args: argparse.Namespace) -> str | None:
    for rate in args.learning_rates:
        if not math.isfinite(rate) or rate <= 0:
            return f"--learning_rates must be finite numbers > 0, got {rate!r}"
    if args.epochs < 1:
        return f"--epochs must be >= 1, got {args.epochs!r}"
    if args.max_samples is not None and args.max_samples < 2:
        return f"--max_samples must be >= 2, got {args.max_samples!r}"
    return None


if __name__ == "__main__":
    sys.exit(main())
