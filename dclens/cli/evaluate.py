"""Evaluate synthetic data: train the authors' classifier on it, test on the real test set.

    python scripts/evaluate.py runs/demo/samples.npz            # our samples (or the run dir)
    python scripts/evaluate.py runs/demo/eps-1.00.data          # the authors' pickle prefix
    python scripts/evaluate.py my.npz --dataset mnist           # any (x, y) npz
    python scripts/evaluate.py --real --dataset fashion_mnist   # reference: real training data
    python scripts/evaluate.py runs/demo --official             # the authors' 600-epoch SGD
    python scripts/evaluate.py runs/demo --protocol authors --range 1   # their script, exactly
    python scripts/evaluate.py runs/private --protocol dpimagebench --dpimagebench_depth 20
        # DPImageBench's selection on held-out real records (a run on private records; hours)

Reports two protocols, by name: ``val`` (headline: epoch chosen on a held-out part of the
synthetic data) and ``sen`` (the authors': best real-test accuracy over epochs), plus
domain-classifier Inception Score and FID (a classifier trained on the real training data,
cached in $DCLENS_CACHE or ~/.cache/dclens; not ImageNet Inception numbers). Writes
``evaluation.json`` and ``evaluation.png`` into --out (default: beside the input).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys

from dclens.common import tf_env
from dclens.evaluation import classifiers, evaluate, quality, record_outputs
from dclens import data
from dclens.datalens import class_signal
from dclens.evaluation import authors_protocol, dpimagebench
from dclens.evaluation.dpimagebench import CLASSIFIERS as DPIMAGEBENCH_CLASSIFIERS
from dclens.runs.output_checks import RunDirError, check_output_dir


#: The flags that only mean something with --protocol dpimagebench.
DPIMAGEBENCH_FLAGS = ("dpimagebench_depth", "dpimagebench_classifiers",
                      "dpimagebench_learning_rate", "dpimagebench_epochs",
                      "generator_records")


def add_eval_arguments(parser: argparse.ArgumentParser, *, dpimagebench: bool = False
                       ) -> None:
    """The classifier/protocol flags shared with scripts/reproduce.py (``dpimagebench``:
    also DPImageBench's protocol, which evaluate.py offers for one run's samples)."""
    add = parser.add_argument
    add("--official", action="store_true", help="the authors' schedule: SGD lr 2e-3, batch "
        "512, 600 epochs (CelebA: lr 1e-4, batch 256, 250 epochs), and sen trained on all "
        "samples; flags below still override it")
    add("--optimizer", choices=("adam", "sgd"), help="classifier optimizer (default adam)")
    add("--learning_rate", type=float, help="classifier learning rate (default 1e-3)")
    add("--batch_size", type=int, help="classifier batch size (default 256)")
    add("--epochs", type=int, help="classifier epochs (default 20)")
    add("--val_fraction", type=float, help="synthetic data held out for the val protocol "
        "(default 0.1)")
    add("--eval_seed", type=int, help="seed of split, initialisation and shuffles "
        "(default 0)")
    add("--max_samples", type=int, help="evaluate a random subset of this many samples")
    add("--test_limit", type=int, help="use only the first N real test records")
    add("--sen_on_all_data", action=argparse.BooleanOptionalAction, default=None,
        help="train a second classifier on all samples for the sen protocol (as the authors)")
    add("--no_quality", action="store_true", help="skip domain-classifier IS/FID")
    add("--quality_samples", type=int, help="images used for IS/FID (default 10000)")
    add("--cache_dir", help="cache of the domain classifier (default $DCLENS_CACHE or "
        "~/.cache/dclens)")
    protocols = ("standard", "authors", "dpimagebench") if dpimagebench else ("standard",
                                                                              "authors")
    add("--protocol", choices=protocols, default="standard",
        help="standard: val (headline) and sen; authors: also the authors' evaluation "
        "script exactly (--range pickles in a 100,000-row zero array, SGD lr 2e-3, batch "
        "512, 600 epochs, best test accuracy; its state is saved in <out>/<name>-authors-"
        "range<R>.npz, so an interrupted call resumes when repeated) [default: standard]")
    add("--range", dest="authors_range", type=int, default=1,
        help="with --protocol authors: pickles of 10,000 samples the script reads "
        "(theirs defaults to 1) [default: 1]")
    add("--authors_epochs", type=int, help="with --protocol authors: fewer epochs than "
        "their 600 (a quick look; NOT the authors' protocol)")
    if dpimagebench:
        add("--dpimagebench_depth", type=int, default=None,
            help="with --protocol dpimagebench: the ResNet's depth (6n+2; DPImageBench's "
            "110; 20 is the stated subset a small CPU can run, hours) [default: 110]")
        add("--dpimagebench_classifiers", nargs="+", choices=DPIMAGEBENCH_CLASSIFIERS,
            default=None, metavar="NET",
            help="with --protocol dpimagebench: which of DPImageBench's classifiers to "
            "train, some of resnet, wrn (WRN-40-4), resnext (ResNeXt-29 8x64d); the "
            "reported accuracy is their mean. DPImageBench's own number is the mean of all "
            "three, GPU-days' work; a 2-core CPU manages a ResNet-20 [default: resnet]")
        add("--dpimagebench_learning_rate", type=float, default=None, metavar="LR",
            help="with --protocol dpimagebench: Adam's initial rate (theirs 0.01; another "
            "is NOT DPImageBench's protocol, and the record and state file say so: "
            "resnet20-lr0.001) [default: 0.01]")
        add("--dpimagebench_epochs", type=int, default=None, metavar="N",
            help="with --protocol dpimagebench: train N epochs instead of their 50 (a "
            "quick look; NOT DPImageBench's protocol) [default: 50]")
        add("--generator_records", choices=("all", "private", "tuning"),
            help="with --protocol dpimagebench: the records the run that wrote the samples "
            "trained on (default: its config.json's training_records); only private runs "
            "leave DPImageBench's validation records unseen")


def settings_from_args(args: argparse.Namespace, dataset: str,
                       generator_records: str | None = None):
    """Flags -> EvalSettings (official schedule first, explicit flags override it).
    ``generator_records``: what the evaluated run trained on (its config), for
    ``--protocol dpimagebench`` when ``--generator_records`` is not given."""

    settings = (evaluate.official_settings(dataset) if args.official
                else evaluate.EvalSettings())
    schedule = {name: getattr(args, name) for name in
                ("optimizer", "learning_rate", "batch_size", "epochs")
                if getattr(args, name) is not None}
    if schedule:
        settings = settings.replace(schedule=classifiers.Schedule(
            **{**settings.schedule.to_dict(), **schedule}))
    changes = {}
    for flag, field in (("val_fraction", "val_fraction"), ("eval_seed", "seed"),
                        ("max_samples", "max_samples"), ("test_limit", "test_limit"),
                        ("sen_on_all_data", "sen_on_all_data"),
                        ("quality_samples", "quality_samples")):
        if getattr(args, flag) is not None:
            changes[field] = getattr(args, flag)
    if args.no_quality:
        changes["quality"] = False
    if args.protocol == "authors":

        protocol = authors_protocol.AuthorsProtocol(range=args.authors_range)
        if args.authors_epochs is not None:
            protocol = dataclasses.replace(protocol, epochs=args.authors_epochs)
        changes["authors"] = protocol
    elif args.authors_epochs is not None or args.authors_range != 1:
        raise ValueError("--range and --authors_epochs need --protocol authors")
    if args.protocol == "dpimagebench":
        records = getattr(args, "generator_records", None) or generator_records
        if records is None:
            raise ValueError("--protocol dpimagebench needs to know what the samples' run "
                             "trained on: give --generator_records private (or evaluate a "
                             "run directory whose config.json says it)")
        chosen = tuple(args.dpimagebench_classifiers or ("resnet",))
        if args.dpimagebench_depth is not None and "resnet" not in chosen:
            raise ValueError(f"--dpimagebench_depth {args.dpimagebench_depth} sets the "
                             f"ResNet's depth, but --dpimagebench_classifiers "
                             f"{' '.join(chosen)} trains no ResNet: add resnet or drop "
                             "the depth")
        given = {field: getattr(args, flag) for flag, field in (
            ("dpimagebench_depth", "resnet_depth"),
            ("dpimagebench_learning_rate", "learning_rate"),
            ("dpimagebench_epochs", "epochs")) if getattr(args, flag) is not None}
        changes["dpimagebench"] = dpimagebench.DPImageBenchProtocol(
            generator_records=records, classifiers=chosen, **given)
    elif any(getattr(args, name, None) is not None for name in DPIMAGEBENCH_FLAGS):
        raise ValueError(f"{', '.join('--' + n for n in DPIMAGEBENCH_FLAGS)} need "
                         "--protocol dpimagebench")
    return settings.replace(**changes)


def _saved_run_config(path: str) -> dict | None:
    """:func:`evaluate.run_dir_config`, with a damaged config.json beside the input
    refused by name (it used to end in a bare JSON or type error)."""
    candidate = evaluate.run_config_path(path)
    try:
        saved = evaluate.run_dir_config(path)
    except (OSError, ValueError) as error:
        saved, problem = None, str(error)
    else:
        train = saved.get("train") if isinstance(saved, dict) else None
        if saved is None or (isinstance(train, dict)
                             and isinstance(train.get("dataset"), str)):
            return saved
        problem = "no config.train.dataset"
    raise evaluate.EvaluationError(
        f"{candidate} cannot be read ({problem}); it should be the settings of the run "
        "that wrote the samples: restore it, or evaluate a copy of the samples in a folder "
        "without it (with --dataset and --data_dir)")


def _check_name(parser: argparse.ArgumentParser, name: str) -> None:
    if not name or name in (".", "..") or os.sep in name or "/" in name:
        parser.error(f"--name {name!r} must be a file name stem without '/' (the outputs "
                     f"are <out>/<name>.json and <out>/<name>.png); e.g. --name "
                     f"evaluation-2, and --out for another folder")


def _teacher_classes(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     log) -> int:
    """``--teacher_classes``: :func:`dclens.datalens.class_signal.run_class_signal`."""
    if args.real or not args.input or not os.path.isdir(args.input):
        parser.error(f"--teacher_classes reads a run directory, got "
                     f"{args.input or '--real'!r}")
    if args.teacher_classes < 1:
        parser.error(f"--teacher_classes must be >= 1 records, got {args.teacher_classes}")
    try:
        record = class_signal.run_class_signal(args.input, records=args.teacher_classes,
                                               log=log)
    except (class_signal.ClassSignalError, data.DataError, OSError) as error:
        print(f"evaluate.py: error: {error}", file=sys.stderr)
        return 2
    print(f"teachers as classifiers ({record['records']} records, chance "
          f"{record['chance']:.2f}): each {record['teacher_accuracy_mean']:.3f} +- "
          f"{record['teacher_accuracy_sd']:.3f}, their summed logits "
          f"{record['ensemble_accuracy']:.3f}, D(x, y) > D(x, y') {record['pairwise']:.3f}; "
          f"wrote {os.path.join(args.input, 'teacher_classes.json')}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evaluate.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1],
        allow_abbrev=False)
    parser.add_argument("input", nargs="?", help="samples.npz, a run directory, an authors' "
                        "pickle prefix (.../eps-1.00.data) or any npz with x/y")
    parser.add_argument("--real", action="store_true", help="evaluate the real training data "
                        "instead (the reference row; cached, reproduce.py reuses it)")
    parser.add_argument("--dataset", help="mnist, fashion_mnist, celebA-gender, celebA-hair "
                        "(default: the run's config.json, else fashion_mnist)")
    parser.add_argument("--data_dir", help="where the real data lies (default: the run's, else "
                        "the dataset's default location)")
    parser.add_argument("--out", help="output directory for evaluation.json/.png (default: "
                        "the input's folder; with --real: runs/eval-real-<dataset>)")
    parser.add_argument("--name", default="evaluation", help="output file stem")
    parser.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    parser.add_argument("--teacher_classes", type=int, metavar="RECORDS", help="instead of "
                        "evaluating samples: read a screening run's teachers (latest "
                        "checkpoint) as classifiers on the first RECORDS records of the "
                        "tuning holdout (issue 39's lever 5 diagnostic); writes "
                        "<run>/teacher_classes.json")
    add_eval_arguments(parser, dpimagebench=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.input) == bool(args.real):
        parser.error("give exactly one of: an input path, or --real")
    _check_name(parser, args.name)

    log = (lambda _: None) if args.quiet else (lambda line: print(line, flush=True))
    if args.teacher_classes is not None:
        return _teacher_classes(parser, args, log)
    try:
        saved = None if args.real else _saved_run_config(args.input)
        dataset = args.dataset or (saved["train"]["dataset"] if saved else "fashion_mnist")
        records = (saved["train"].get("training_records", "all")
                   if saved and not args.real else None)
        settings = settings_from_args(args, dataset, records)
        if args.real:
            out = args.out or os.path.join("runs", f"eval-real-{evaluate.base_dataset(dataset)}")
            check_output_dir(out)
            record = evaluate.cached_real_reference(dataset, args.data_dir, settings=settings,
                                                    cache_dir=args.cache_dir, log=log)
        else:
            folder = args.input if os.path.isdir(args.input) else os.path.dirname(args.input)
            out = args.out or folder or "."
            check_output_dir(out)
            state = None
            if settings.authors is not None:          # hours of SGD: resumable
                state = record_outputs.authors_state_file(out, args.name, settings.authors)
            prefix = None
            if settings.dpimagebench is not None:     # hours of ResNet: resumable too
                prefix = os.path.join(out, f"{args.name}-dpimagebench")
            record = evaluate.evaluate_path(args.input, args.dataset, data_dir=args.data_dir,
                                            settings=settings, cache_dir=args.cache_dir,
                                            authors_state_path=state,
                                            dpimagebench_state_prefix=prefix, log=log)
        record["command"] = shlex.join(["python", "scripts/evaluate.py",
                                        *(sys.argv[1:] if argv is None else argv)])
        paths = record_outputs.write_outputs(record, out, args.name)
    except (evaluate.EvaluationError, data.DataError, classifiers.ScheduleError,
            RunDirError, ValueError) as error:
        print(f"evaluate.py: error: {error}", file=sys.stderr)
        return 2
    print(record_outputs.summary_line(record))
    if record.get("quality"):
        print(f"note: {quality.NOTE}")
    print(f"wrote {paths['json']} and {paths['png']}")
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # before TensorFlow is imported; see dclens/common/tf_env.py
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
