"""Reproduce a row of the DataLens paper's Table 1: train -> samples -> evaluate -> report.

    python scripts/reproduce.py fashion_mnist --eps 1                # the paper config
    python scripts/reproduce.py fashion_mnist --eps 10 --teachers 200  # scaled: NOT the paper's
    python scripts/reproduce.py fashion_mnist --eps 1 --scale 0.05 --non_private  # eps=inf row
    python scripts/reproduce.py fashion_mnist --eps 1 --skip_train   # evaluate the run again

Writes report.md, report.json, evaluation.png, epsilon.png and samples.png into --out
(default results/<name>); the training run (samples.npz, generator, the authors' pickles)
goes to --run_dir (default runs/reproduce/<name>). A scaled run (--scale/--teachers, or any
other deviation) is marked "NOT the paper config" in the report, with every deviation listed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys

from dclens.cli import common_flags, graceful_stop, interrupted
from dclens.data import splits
from dclens.datalens import config as cfg
from dclens.privacy.accounting import Conversion
from dclens.common import tf_env  # noqa: E402


from dclens.cli import evaluate as _EVAL_CLI
from dclens.evaluation import classifiers, evaluate
from dclens.datalens import config, run
from dclens import data
from dclens.runs import output_checks
from dclens.experiments import reproduce
from dclens.experiments import beyond, paper_rows, table1
from dclens.evaluation import authors_protocol
add_eval_arguments, settings_from_args = _EVAL_CLI.add_eval_arguments, _EVAL_CLI.settings_from_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reproduce.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1],
        allow_abbrev=False)
    add = parser.add_argument
    add("dataset", choices=("mnist", "fashion_mnist", "celebA-gender"),
        help="the Table 1 row's dataset")
    add("--eps", type=int, choices=(1, 10), required=True, help="the row's epsilon budget")
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument("--scale", type=float, help="fraction of the paper's teachers (quick, "
                       "NOT the paper config)")
    scale.add_argument("--teachers", type=int, help="number of teachers (NOT the paper "
                       "config unless it equals the paper's)")
    add("--non_private", action="store_true", help="no noise, no budget, as many steps as the "
        "private config allows: the eps=inf reference row (NOT private)")
    add("--train_epochs", type=int, help="cap DataLens training at N epochs (NOT the paper "
        "config)")
    add("--num_samples", type=int, help="synthetic samples (paper: 100000)")
    common_flags.add_data(parser, what=" for DataLens")
    common_flags.add_seed(parser, "fix every random draw of training (DP noise included: the "
                          "outputs must not be published as private); default OS entropy")
    add("--teacher_chunk", type=int, help="teachers processed together (memory only)")
    add("--checkpoint_every", type=int, default=10, help="generator steps between "
        "checkpoints (default 10; a 4000-teacher checkpoint is ~27 GB, so paper-scale runs "
        "may want 25)")
    add("--aggregation", help="an analysis row: aggregation instead of the paper's "
        "topk_stochastic_sign (no_topk, topk_sign, no_threshold, no_threshold_sign, klevel, "
        "fetchsgd)")
    add("--thresh", type=float, help="an analysis row: beta instead of the paper's")
    add("--topk", type=int, help="an analysis row: top-k instead of the paper's")
    add("--sigma_scale", type=float, help="the paper's sigma times this factor in (0, 1], "
        "the budget raised to what the paper's steps then cost: with --teachers N and "
        "N / 4000 here, the paper's noise relative to the vote sum at a reduced scale (NOT "
        "the row's epsilon; the report says which)")
    add("--balanced_partition", action="store_true", help="a fidelity option: the authors' "
        "class-balanced partition (their --shuffle) instead of the index partition; the "
        "run's epsilon is then NOT a proven guarantee (one replaced record can move many "
        "records between teachers)")
    add("--fake_rendering", choices=[r.value for r in cfg.FakeRendering], help="a fidelity "
        "option: teacher_labels renders each teacher's fake batch from its own labels, as "
        "the authors (about 2x slower at the paper config) [default: class_grid]")
    add("--conversion", choices=[c.value for c in Conversion], help="beyond the "
        "paper: how the budget is accounted (pld: exactly, more steps for the same "
        "epsilon) [default: the paper's classic]")
    add("--generator_ema", type=float, metavar="DECAY", help="beyond the paper: sample a "
        "moving average of the generator's weights (post-processing)")
    add("--train_learning_rate", type=float, metavar="LR", help="beyond the paper: the "
        "Adam learning rate of teachers and generator and the voted update's step "
        "[default: the paper's 1e-3]")
    add("--class_guidance", type=float, metavar="LAMBDA", help="beyond the paper: each "
        "teacher's vote also descends lambda times its own label cross-entropy (its "
        "logits over the labels of one image read as a classifier) [default: 0, the "
        "paper's]")
    add("--class_guidance_form", choices=["cross_entropy", "margin"], help="beyond the "
        "paper: the class term of --class_guidance: each teacher's label cross-entropy, or "
        "its margin (its logit for the label minus its mean over the labels: the teachers' "
        "terms then add up to their summed logits' margin) [default: cross_entropy]")
    add("--mismatch_negatives", type=int, metavar="M", help="beyond the paper: the last "
        "M slots of each teacher's fake batch hold its own records under a wrong label, "
        "scored as fake (matching-aware teachers; the same sensitivity) [default: 0, the "
        "paper's]")
    add("--sigma_factor", type=float, metavar="F", help="beyond the paper: the run's sigma "
        "(after --sigma_scale) times F under the same epsilon budget: about F^2 times the "
        "steps, each noisier (F > 1) or less noisy (F < 1) [default: 1, the paper's]")
    add("--train_batch_size", type=int, metavar="B", help="beyond the paper: the training "
        "batch (each teacher's real and fake halves, and the images voted on per step) "
        "instead of the paper's 30 cut to the partition size, under the same epsilon "
        "budget: fewer queries per step, more steps [default: the paper's]")
    add("--shared_teacher_init", action="store_true", help="beyond the paper: every "
        "teacher starts from the same initial weights instead of its own draw "
        "(data-independent; the same sensitivity)")
    add("--teacher_steps", type=int, metavar="S", help="beyond the paper: each teacher's "
        "Adam steps per generator step (the authors' --d_step; on its own partition, the "
        "same sensitivity; the teachers' compute grows with S) [default: the paper's 2]")
    add("--generator_width", type=float, metavar="W", help="beyond the paper: the "
        "generator W times as wide as the paper's (64 W filters, 1024 W dense units; 64 W "
        "a whole number, e.g. 0.5 or 2; data-independent, the same sensitivity) "
        "[default: 1, the paper's]")
    add("--generator_upsampling", choices=[u.value for u in cfg.GeneratorUpsampling],
        help=common_flags.GENERATOR_UPSAMPLING_HELP + " [default: transpose, the paper's]")
    add("--warm_start", metavar="RUN", help=common_flags.WARM_START_HELP)
    add("--teacher_width", type=float, metavar="W", help="beyond the paper: the teacher "
        "discriminators W times as wide as the paper's (32 W filters, 256 W dense units; "
        "32 W a whole number, e.g. 0.5 or 2; data-independent, the same sensitivity; the "
        "teachers' compute and bank grow with W) [default: 1, the paper's]")
    add("--query_batch", type=int, metavar="Q", help="beyond the paper: Q fake images "
        "voted on per round instead of the whole batch, the teachers keeping theirs (the "
        "same Gaussian vote per query: about batch / Q x the steps at the same epsilon) "
        "[default: the batch, the paper's]")
    add("--class_direction_every", type=int, default=0, metavar="N", help="a diagnostic "
        "for screening runs (--training_records tuning): every N steps, how much of the "
        "teachers' class evidence their gradients, vote and update carry, into "
        "<run>/class_direction.json (dclens/datalens/class_direction.py) [default: 0, off]")
    add("--training_records", choices=[r.value for r in splits.TrainingRecords],
        help="beyond the paper: private trains on all but the last 10,000 records (the "
             "tuning split a tuned configuration was chosen on); tuning is a screening "
             "run on that split, scored on its holdout instead of the test set "
             "[default: all, the paper's]")
    add("--out", help="report directory (default results/<name>)")
    common_flags.add_run_dir(parser, required=False, restart=False,
                             help_text="training run directory (default "
                                       "runs/reproduce/<name>)")
    add("--skip_train", action="store_true", help="evaluate the finished run in --run_dir "
        "again instead of training")
    add("--no_reference", action="store_true", help="skip the real-data reference row")
    add("--note", help="free text for the report (e.g. why the run is scaled down)")
    add("--rerender", action="store_true", help="only rewrite report.md and evaluation.png "
        "from the report.json in --out (no training, no evaluation)")
    add("--add_authors", type=int, metavar="RANGE", help="run the authors' evaluation "
        "script's protocol with --range RANGE on the finished, reported run and add it to "
        "the report in --out (val/sen kept; no training; resumable: rerun the same command "
        "after an interruption)")
    add("--add_quality", action="store_true", help="(re)measure the finished, reported "
        "run's sample quality (domain-classifier IS, FID, label agreement) as its "
        "evaluation did and write it into the report in --out (accuracies kept; no "
        "training): for reports older than a measure")
    common_flags.add_quiet(parser, "no progress bar or per-epoch lines")
    add_eval_arguments(parser)
    return parser


def check_paths(options: paper_rows.ReproduceOptions, out: str, run_dir: str, *,
                train: bool) -> None:
    """Refuses, before anything runs, a report folder (--out) that cannot be written (it
    is written after training and evaluation) and, when training, a --run_dir that cannot
    hold this run: not writable, another tool's run, or a run with other settings.
    Creates nothing.

    Raises:
      output_checks.RunDirError: naming the flag, the path and what to do.
    """
    output_checks.check_output_dir(out)
    if not train:
        return
    run.plan_datalens_run(paper_rows.build_config(options)[0], run_dir, flag="--run_dir",
                          offers_restart=False)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.checkpoint_every < 1:
        parser.error(f"--checkpoint_every must be >= 1 (generator steps between checkpoints), "
                     f"got {args.checkpoint_every}")

    command = shlex.join(["python", "scripts/reproduce.py",
                          *(sys.argv[1:] if argv is None else argv)])
    try:
        options = paper_rows.ReproduceOptions(
            dataset=args.dataset, eps=args.eps, scale=args.scale, teachers=args.teachers,
            non_private=args.non_private, epochs=args.train_epochs,
            num_samples=args.num_samples, max_records=args.max_records, seed=args.seed,
            data_dir=args.data_dir, teacher_chunk=args.teacher_chunk,
            aggregation=args.aggregation, thresh=args.thresh, topk=args.topk,
            balanced_partition=args.balanced_partition, fake_rendering=args.fake_rendering,
            sigma_scale=args.sigma_scale, conversion=args.conversion,
            generator_ema=args.generator_ema, training_records=args.training_records,
            learning_rate=args.train_learning_rate, class_guidance=args.class_guidance,
            class_direction_every=args.class_direction_every,
            class_guidance_form=args.class_guidance_form,
            mismatch_negatives=args.mismatch_negatives, sigma_factor=args.sigma_factor,
            batch_size=args.train_batch_size,
            shared_teacher_init=args.shared_teacher_init, teacher_steps=args.teacher_steps,
            generator_width=args.generator_width,
            generator_upsampling=args.generator_upsampling, teacher_width=args.teacher_width,
            query_batch=args.query_batch, warm_start=args.warm_start)
        actions = [flag for flag, given in (("--add_authors", args.add_authors is not None),
                                            ("--add_quality", args.add_quality),
                                            ("--rerender", args.rerender),
                                            ("--skip_train", args.skip_train)) if given]
        if len(actions) > 1:
            raise paper_rows.ReproduceError(f"{' and '.join(actions)} are separate actions on "
                                           f"a run; give one per command")
        if args.add_authors is not None and (args.protocol == "authors"
                                             or args.authors_range != 1):
            raise paper_rows.ReproduceError("--add_authors RANGE runs the authors' protocol on "
                                           "its own; drop --protocol authors / --range")
        settings = None if args.add_authors is not None else settings_from_args(args,
                                                                                 args.dataset)
    except (paper_rows.ReproduceError, evaluate.EvaluationError, classifiers.ScheduleError,
            config.ConfigError, ValueError) as error:
        parser.error(str(error))
    log = (lambda _: None) if args.quiet else (lambda line: print(line, flush=True))
    run_dir = None                       # set once a training (or its resume) may start
    try:
        if args.add_authors is not None:

            protocol = authors_protocol.AuthorsProtocol(range=args.add_authors)
            if args.authors_epochs is not None:
                protocol = dataclasses.replace(protocol, epochs=args.authors_epochs)
            reproduce.add_authors_protocol(
                args.out or os.path.join("results", options.default_name()), protocol,
                run_dir=args.run_dir, command=command, log=log)
            return 0
        if args.add_quality:
            reproduce.add_quality(args.out or os.path.join("results", options.default_name()),
                                  run_dir=args.run_dir, cache_dir=args.cache_dir,
                                  command=command, log=log)
            return 0
        if args.rerender:
            reproduce.rerender(args.out or os.path.join("results", options.default_name()),
                               note=args.note, log=log)
            return 0
        out = args.out or os.path.join("results", options.default_name())
        run_dir = args.run_dir or os.path.join("runs", "reproduce", options.default_name())
        check_paths(options, out, run_dir, train=not args.skip_train)
        report = reproduce.reproduce(
            options, out_dir=out, run_dir=run_dir, settings=settings,
            skip_train=args.skip_train, reference=not args.no_reference,
            cache_dir=args.cache_dir, command=command, note=args.note or "",
            progress=not args.quiet, log=log, checkpoint_every=args.checkpoint_every,
            training_stop=graceful_stop.GracefulStop("reproduce.py"))
    except (paper_rows.ReproduceError, evaluate.EvaluationError, data.DataError,
            run.RunDirError, ValueError) as error:
        print(f"reproduce.py: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if run_dir is not None and not args.skip_train:
            return interrupted.report("reproduce.py", run_dir, argv)
        print(f"reproduce.py: interrupted; what was finished is kept and the same command "
              f"goes on from it: {command}", file=sys.stderr)
        return interrupted.EXIT_INTERRUPTED
    parent = os.path.dirname(os.path.abspath(out))
    if os.path.basename(parent) == beyond.PAPER_SCALE_DIR:
        # results/beyond/paper-scale/<run>: results/beyond/README.md groups those runs.
        beyond_dir = os.path.dirname(parent)
        try:
            print(f"summary: {beyond.write_readme(beyond_dir, os.path.dirname(beyond_dir))}")
        except table1.ReportError as error:     # the run's own report is written
            print(f"reproduce.py: warning: {beyond_dir}/README.md not rewritten: {error}",
                  file=sys.stderr)
    acc = report["accuracy"]
    banner = "paper config" if report["paper_config"] else "NOT the paper config"
    print(f"{report['name']} ({banner}): val {acc['val']:.4f} | sen {acc['sen']:.4f} | paper "
          f"{acc['paper']:.4f}")
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # before TensorFlow is imported; see dclens/common/tf_env.py
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
