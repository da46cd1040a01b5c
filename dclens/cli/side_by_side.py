"""Runs dclens beside the authors' TF1 DataLens code, step for step, and compares them.

  python scripts/side_by_side.py --authors_repo ../shared/authors-datalens
  python scripts/side_by_side.py --steps 6 --teachers 4 --records 15 --nostochastic
  python scripts/side_by_side.py --nothreshold --nostochastic   # their --signsgd_nothresh
  python scripts/side_by_side.py --seeds 10    # seeds 0-9: every check's margin over draws

Both get the same data and partitions (the authors' partitioner on a class-balanced
subset of the real Fashion-MNIST), the same initial weights, latents, labels,
stochastic-sign uniforms and DP noise (their numpy draws, replayed into dclens through
dclens.datalens.draws), and the authors' per-teacher fake batches.  After every generator step it
prints and records the differences of the teachers' losses and weights, the image
gradients, the vote sums, the noisy update, the generator's weights and
epsilon (dclens/parity/side_by_side.py states the float32 tolerances).  Exit status 0
when every step agrees, 1 when one does not, 2 on bad input.  The runs' noise is replayed
and known: nothing here is private.

Whole runs (--whole_runs N): each side trains N times from its own seed to the end of one
budget, with fresh noise (real, equal epsilons), at one configuration; every run is
evaluated alike (val, sen, FID, label agreement, the authors' protocol) and the
distributions are compared (mean +- sd, Welch 95% intervals, per-step curves, seconds per
step) in a generated README.  Resumable: run the same command again.

  python scripts/side_by_side.py --whole_runs 5 --noise_matched 1 --teachers 200
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import shlex
import sys
from typing import Sequence

from dclens.common import tf_env
from dclens.common.paths import REPO_ROOT
from dclens.common import export, reporting
from dclens.data import DataError
from dclens.evaluation import authors_protocol, classifiers, evaluate
from dclens.evaluation import quality
from dclens.parity import (seed_sweep, side_by_side, tf1_compat, whole_run, whole_run_report,
                           whole_run_study)
from dclens.runs.output_checks import RunDirError, check_output_file

DEFAULT_REPO = REPO_ROOT.parent / "shared" / "authors-datalens"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False,
                                     prog="side_by_side.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors_repo", default=str(DEFAULT_REPO),
                        help="the authors' DataLens checkout (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=5, help="generator steps to compare")
    parser.add_argument("--teachers", type=int, default=4, help="teachers (batch_teachers)")
    parser.add_argument("--records", type=int, default=15, help="records per teacher")
    parser.add_argument("--batch_size", type=int, default=30)
    parser.add_argument("--topk", type=int, default=50)
    parser.add_argument("--sigma", type=float, default=40.0)
    parser.add_argument("--thresh", type=float, default=0.5)
    parser.add_argument("--d_step", type=int, default=2)
    parser.add_argument("--pretrain_teacher", type=int, default=3)
    parser.add_argument("--max_grad", type=float, default=1e-5)
    parser.add_argument("--z_dim", type=int, default=10)
    parser.add_argument("--stochastic", dest="stochastic", action="store_true", default=True,
                        help="stochastic sign (default); --nostochastic: deterministic")
    parser.add_argument("--nostochastic", dest="stochastic", action="store_false",
                        help=argparse.SUPPRESS)
    parser.add_argument("--threshold", dest="threshold", action="store_true", default=True,
                        help="the authors' --signsgd: the noisy vote sum thresholded at "
                             "--thresh x teachers (default); --nothreshold: their "
                             "--signsgd_nothresh, the noisy vote sum / --topk released "
                             "(--thresh unused), against dclens' no_threshold (with "
                             "--stochastic) or no_threshold_sign (with --nostochastic)")
    parser.add_argument("--nothreshold", dest="threshold", action="store_false",
                        help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0,
                        help="dclens' initial weights, the replayed noise and the authors' "
                             "numpy draws (latents, labels, uniforms): the same seed gives "
                             "the same report")
    parser.add_argument("--data_dir", help="Fashion-MNIST location (default: the Debian "
                                           "package's)")
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--free_running", action="store_true",
                        help="dclens continues from its own state instead of the authors' "
                             "after each step: shows how round-off separates the two "
                             "trajectories (reported, not judged)")
    parser.add_argument("--perturb", choices=("noise", "weights"),
                        help="change one of dclens' inputs, to see the harness flag it")
    parser.add_argument("--seeds", type=int, metavar="N",
                        help="the lockstep comparison at seeds --seed ... --seed + N - 1 "
                             "(each other draws and initial weights): every checked "
                             "quantity's median and maximum over the seeds beside its "
                             "tolerance; exit status 1 if a seed disagrees")
    whole = parser.add_argument_group(
        "whole runs", "train each side --whole_runs times from its own seed to the end of "
        "one budget, evaluate every run alike and compare the distributions "
        "(dclens/parity/whole_run.py); resumable: run the same command again")
    whole.add_argument("--whole_runs", type=int, metavar="N",
                       help="runs per side (the study; at least 5 for a comparison)")
    whole.add_argument("--noise_matched", type=int, choices=(1, 10), metavar="EPS",
                       help="the paper's Fashion-MNIST configuration at epsilon EPS with "
                            "--teachers instead of 4000: sigma x teachers / 4000 and the "
                            "budget of the paper's steps (the analysis tables' reduced "
                            "scale; NOT epsilon EPS); ignores the flags it sets")
    whole.add_argument("--max_eps", type=float,
                       help="the budget both sides stop at (without --noise_matched)")
    whole.add_argument("--samples", type=int, default=20_000,
                       help="samples written and evaluated per run (default %(default)s)")
    whole.add_argument("--study_dir", default=str(REPO_ROOT / "runs" / "whole-runs"),
                       help="the runs (default %(default)s)")
    whole.add_argument("--results", default=str(REPO_ROOT / "results" / "side-by-side" /
                                                "whole-runs"),
                       help="where the generated README, summary and curves go "
                            "(default %(default)s)")
    whole.add_argument("--phases", default="train,evaluate,authors_protocol",
                       help="comma-separated, in order: train, evaluate, authors_protocol "
                            "(default: all)")
    whole.add_argument("--threads", type=int,
                       help="TensorFlow threads of this process (intra- and inter-op; "
                            "default: TensorFlow's, every core). The authors_protocol phase "
                            "can run in several processes at once, each on the runs it "
                            "claims: on a 2-core CPU two with --threads 1 did up to 1.8x "
                            "the epochs per hour of one with both cores (docs/authors.md)")
    whole.add_argument("--only", metavar="RUNS",
                       help="comma-separated runs to work on now, e.g. dclens-1,authors-2 "
                            "(default: every run of the study); other processes may work "
                            "on the others")
    whole.add_argument("--restore_from", metavar="RESULTS",
                       help="first seed --study_dir from a published study (its --results "
                            "folder, e.g. results/side-by-side/whole-runs) when runs/ was "
                            "lost: finished runs are copied, the others retrained from "
                            "their seeds and checked step for step against their "
                            "published records")
    whole.add_argument("--smoke", action="store_true",
                       help="evaluation at a smoke-test size (1-epoch classifiers, 200 test "
                            "images): checks the path, its numbers mean nothing")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses values the harness would otherwise take into minutes of TF1 training
    (SideBySideConfig checks the counts and the partition)."""
    if not (math.isfinite(args.sigma) and args.sigma > 0):
        parser.error(f"--sigma must be a finite number > 0, got {args.sigma!r}; it is the "
                     "std of the Gaussian noise on the vote sums, e.g. 40")
    if not 0 <= args.thresh < 1:
        parser.error(f"--thresh must be in [0, 1), got {args.thresh!r}; votes pass at "
                     "thresh x teachers, e.g. 0.5")
    if not (math.isfinite(args.max_grad) and args.max_grad > 0):
        parser.error(f"--max_grad must be a finite number > 0, got {args.max_grad!r}; it is "
                     "the gradient clip bound (the paper uses 1e-5)")
    for name in ("pretrain_teacher", "seed"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be an integer >= 0, got {getattr(args, name)}")
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds must be an integer >= 1, got {args.seeds}")


def whole_run_config(parser: argparse.ArgumentParser,
                     args: argparse.Namespace) -> whole_run.WholeRunConfig:
    if args.noise_matched is not None:
        return whole_run.WholeRunConfig.noise_matched(
            args.teachers, eps=args.noise_matched, records=args.records, samples=args.samples,
            data_dir=args.data_dir)
    if args.max_eps is None:
        parser.error("--whole_runs needs a budget: --max_eps EPS, or --noise_matched 1|10 "
                     "for the paper's configuration at a reduced scale")
    return whole_run.WholeRunConfig.with_budget(
        args.max_eps, args.samples, teachers=args.teachers, records=args.records,
        batch_size=args.batch_size, topk=args.topk, sigma=args.sigma, thresh=args.thresh,
        d_step=args.d_step, pretrain_teacher=args.pretrain_teacher, max_grad=args.max_grad,
        stochastic=args.stochastic, z_dim=args.z_dim, data_dir=args.data_dir)


def smoke_evaluation(samples: int) -> tuple[evaluate.EvalSettings,
                                            authors_protocol.AuthorsProtocol]:
    """Evaluation settings that only check the path (tests)."""
    settings = evaluate.EvalSettings(
        schedule=classifiers.Schedule(epochs=1, batch_size=64), test_limit=200,
        quality_samples=min(100, samples), domain=quality.DomainSettings(
            schedule=classifiers.Schedule(epochs=1, batch_size=128), train_limit=500))
    rows = min(10_000, samples)
    return settings, authors_protocol.AuthorsProtocol(range=1, rows_per_pickle=rows,
                                                      rows=10 * rows, epochs=1)


def run_whole(parser: argparse.ArgumentParser, args: argparse.Namespace,
              argv: list[str]) -> int:
    phases = tuple(p for p in args.phases.split(",") if p)
    unknown = sorted(set(phases) - set(whole_run_study.PHASES))
    if unknown or not phases:
        parser.error(f"--phases takes {', '.join(whole_run_study.PHASES)}; got "
                     f"{args.phases!r}")
    if args.whole_runs < 1:
        parser.error(f"--whole_runs must be an integer >= 1, got {args.whole_runs}")
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be an integer >= 1, got {args.threads}")
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    try:
        config = whole_run_config(parser, args)
        evaluation, authors = (smoke_evaluation(config.samples) if args.smoke else
                               (evaluate.EvalSettings(
                                   quality_samples=min(10_000, config.samples)),
                                authors_protocol.AuthorsProtocol(range=1)))
        study = whole_run_study.Study(args.study_dir, config, args.authors_repo,
                                      runs=args.whole_runs, root_seed=args.seed,
                                      evaluation=evaluation, authors=authors,
                                      only=None if args.only is None else tuple(
                                          name for name in args.only.split(",") if name))
        tf1_compat.check_repo(args.authors_repo)
        summary = whole_run_study.run_study(study, data_dir=args.data_dir, phases=phases,
                                            restore_from=args.restore_from,
                                            log=functools.partial(print, flush=True))
    except (side_by_side.SideBySideError, tf1_compat.AuthorsCodeError, DataError,
            RunDirError, evaluate.EvaluationError, reporting.ReportError) as error:
        print(f"side_by_side.py: error: {error}", file=sys.stderr)
        return 2
    readme = whole_run_report.publish(
        summary, args.results, command=shlex.join(["python", "scripts/side_by_side.py", *argv]),
        date=datetime.date.today().isoformat(), study_dir=args.study_dir)
    print(f"report: {readme}")
    return 0


def _report_seeds(sweep: dict, out: str | None) -> int:
    """Prints the sweep's summary (one line per step and quantity); writes it to ``out``."""
    for step, rows in sweep["summary"].items():
        for name, row in rows.items():
            held = ("reported only" if row["tolerance"] is None
                    else f"tolerance {row['tolerance']:g}")
            print(f"{step}  {name:34s} median {row['median']:.2e}  max {row['max']:.2e} "
                  f"(seed {row['seed_of_max']})  {held}")
    bad = sweep["disagreeing_seeds"]
    print(f"{sweep['seeds'] - len(bad)} of {sweep['seeds']} seeds agree"
          + (f"; disagreeing: {bad}" if bad else "") + f" ({sweep['seconds']:.0f} s)")
    if out:
        export.write_json(out, sweep)
        print(f"report: {out}")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    if args.whole_runs is not None and not args.threshold:
        parser.error("--nothreshold is a lockstep comparison only: whole runs train the "
                     "thresholded sign; drop --nothreshold or --whole_runs")
    if args.seeds is not None and (args.free_running or args.perturb
                                   or args.whole_runs is not None):
        parser.error("--seeds repeats the judged lockstep comparison: drop --free_running, "
                     "--perturb and --whole_runs")
    if args.whole_runs is not None:
        return run_whole(parser, args, list(sys.argv[1:] if argv is None else argv))

    try:
        config = side_by_side.SideBySideConfig(
            teachers=args.teachers, records=args.records, steps=args.steps,
            batch_size=args.batch_size, topk=args.topk, sigma=args.sigma,
            thresh=args.thresh, d_step=args.d_step, pretrain_teacher=args.pretrain_teacher,
            max_grad=args.max_grad, stochastic=args.stochastic, threshold=args.threshold,
            z_dim=args.z_dim, seed=args.seed, data_dir=args.data_dir)
        if args.out:        # written at the end: refuse a path that cannot take it now
            check_output_file(args.out, "--out", "side_by_side.json")
        if args.seeds is not None:
            sweep = seed_sweep.run_seeds(config, args.authors_repo, args.seeds,
                                         log=functools.partial(print, flush=True))
        else:
            report = side_by_side.run_side_by_side(config, args.authors_repo,
                                                   perturb=args.perturb,
                                                   free_running=args.free_running)
    except (side_by_side.SideBySideError, tf1_compat.AuthorsCodeError, DataError,
            RunDirError) as error:
        print(f"side_by_side.py: error: {error}", file=sys.stderr)
        return 2
    if args.seeds is not None:
        return _report_seeds(sweep, args.out)
    verdict = {True: "all steps agree", False: "DISAGREEMENT",
               None: "free-running trajectories (not judged)"}[report["agree"]]
    print(f"{verdict} ({len(report['steps'])} steps, {report['seconds']:.0f} s)")
    if args.out:
        export.write_json(args.out, report)
        print(f"report: {args.out}")
    else:
        print(json.dumps(report["steps"][-1]["checks"]))
    return 1 if report["agree"] is False else 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # before TensorFlow is imported; see dclens/common/tf_env.py
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
