"""Reproduce a row of the DataLens paper's Table 1: train -> samples -> evaluate -> report.

:func:`reproduce` runs the paper configuration for (dataset, eps) -- or a scaled-down one,
said loudly -- with :func:`dclens.datalens.run.train_run`, evaluates the samples with
:mod:`dclens.evaluation.evaluate` under both protocols, and writes into the report directory:

===================  =============================================================
``report.md``        human-readable: accuracies beside the paper's, epsilon, wall
                     time, deviations from the paper config, command, commit, machine
``report.json``      the same, machine-readable (with the whole evaluation record)
``evaluation.png``   the classifier's per-epoch accuracy curves
``epsilon.png``      epsilon vs generator step
``samples.png``      one row of samples per class
===================  =============================================================

The training run itself (``samples.npz``, the generator, the authors' pickles: hundreds of
MB at 100k samples) goes to a separate run directory, by default under ``runs/``, so the
report directory holds small files only and can be committed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import shutil
import time
from typing import Callable, ContextManager

from dclens.common import machine
from dclens.common import provenance as provenance_lib
from dclens.evaluation import evaluate, record_outputs
from dclens.common import export
from dclens.runs import rundir
from dclens.datalens import resume
from dclens.datalens import run
from dclens.evaluation import classifiers, quality as quality_scores
from dclens.experiments.paper_rows import (PAPER_SOURCE, INDEPENDENT, ReproduceError, ReproduceOptions, build_config, scale_facts)
from dclens.experiments.reproduction_report import render_markdown

#: How this code initialises the generator (one independent seed per layer since 7eadf2b;
#: before, one seeded initializer was reused across layers): a fact of the training run.
GENERATOR_INIT = "independent seed per layer"


def _generator_init(out_dir: str, *, trained: bool) -> str:
    """The generator initialisation of the reported run: this code's when it trained the
    run, else what the report it replaces says (``--skip_train`` evaluates an older run)."""
    if trained:
        return GENERATOR_INIT
    previous = os.path.join(out_dir, "report.json")
    if os.path.exists(previous):
        known = _read_json(previous).get("generator_init")
        if known:
            return known
    return "unknown (evaluated with --skip_train; not recorded at training)"


def provenance(command: str) -> dict:
    """Command line, git commit (+ whether tracked files had local changes), machine.

    Taken when a reproduction *starts*: the code that trains is the code at that commit,
    even if the tree moves on during a run of hours. Untracked files (the run's own
    outputs under results/) do not count as changes.
    """
    checkout = provenance_lib.commit() or {"commit": None, "uncommitted_changes": None}
    import keras
    import tensorflow as tf

    return {"command": command, **checkout,
            "machine": {"platform": platform.platform(), "processor": platform.processor()
                        or platform.machine(), "cpu_count": os.cpu_count(),
                        "cpu": machine.cpu_model_name(),
                        "cpu_vector_extensions": machine.cpu_vector_extensions(),
                        "onednn": machine.onednn_enabled(),
                        "python": platform.python_version(), "tensorflow": tf.__version__,
                        "keras": keras.__version__}}


def plot_epsilon(curve: list[dict], path: str, *, title: str, max_eps: float | None) -> None:
    """PNG of epsilon after every generator step (from privacy.json)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure = pyplot.figure(figsize=(5.6, 3.6), dpi=100)
    axes = figure.add_subplot(1, 1, 1)
    if curve:
        axes.plot([p["step"] for p in curve], [p["epsilon"] for p in curve], marker=".",
                  markersize=3)
    else:
        axes.text(0.5, 0.5, "no private query (non-private run)", ha="center",
                  transform=axes.transAxes)
    if max_eps is not None:
        axes.axhline(max_eps, color="tab:red", linestyle=":", label=f"budget {max_eps:g}")
        axes.legend(fontsize=7)
    axes.set_xlabel("generator step")
    axes.set_ylabel("epsilon")
    axes.grid(alpha=0.3)
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    export.atomic_write(path, lambda s: figure.savefig(s, format="png"))
    pyplot.close(figure)


def _read_json(path: str) -> dict:
    with open(path) as stream:
        return json.load(stream)


def reproduce(options: ReproduceOptions, *, out_dir: str | None = None,
              run_dir: str | None = None, settings: evaluate.EvalSettings | None = None,
              skip_train: bool = False, reference: bool = True,
              cache_dir: str | None = None, command: str = "", note: str = "",
              progress: bool = True, log: Callable[[str], None] = print,
              checkpoint_every: int = 10,
              training_stop: ContextManager[Callable[[], bool] | None] | None = None) -> dict:
    """Train (unless ``skip_train``), evaluate, write the report; returns report.json's dict.

    ``note`` is free text shown under the report's title (e.g. why a run is scaled down).
    ``checkpoint_every`` is passed to :func:`dclens.datalens.run.train_run` (generator steps between
    checkpoints; at 4000 teachers one checkpoint is about 27 GB, so paper-scale runs may
    want fewer).  ``training_stop`` is entered around the training alone (e.g. a
    :class:`dclens.cli.graceful_stop.GracefulStop`, so that Ctrl-C pauses the training at a
    step boundary but interrupts the evaluation at once); what it yields is
    ``train_run``'s ``should_stop``.
    """
    started = time.perf_counter()
    started_at = provenance(command)
    config, deviations = build_config(options)
    settings = settings or evaluate.EvalSettings()
    if options.screening and settings.test_set != evaluate.TUNING_HOLDOUT:
        # A screening run is scored on the tuning holdout, never on the test set.
        settings = settings.for_screening()
    name = options.default_name()
    out_dir = out_dir or os.path.join("results", name)
    paths = rundir.RunPaths(run_dir or os.path.join("runs", "reproduce", name))
    if skip_train:
        _check_trained(paths, config, log)
        train_seconds = None
    else:
        if run.outputs_complete(paths.root):
            raise ReproduceError(f"{paths.root} already holds a finished run; pass "
                                 f"--skip_train to evaluate it again, or choose another "
                                 f"--run_dir")
        # An unfinished run with the same config there is resumed by train_run, and so is
        # a finished one whose outputs were cut short (train_run writes them again).
        if deviations:
            log("NOT the paper config: " + "; ".join(deviations))
        with training_stop or contextlib.nullcontext() as should_stop:
            train_seconds = run.train_run(config, paths.root, progress=progress, log=log,
                                          checkpoint_every=checkpoint_every,
                                          should_stop=should_stop).seconds
    privacy = _read_json(paths.privacy)
    eval_started = time.perf_counter()
    record = evaluate.evaluate_path(paths.samples, config.train.dataset,
                                    data_dir=config.train.data_dir, settings=settings,
                                    cache_dir=cache_dir, log=log)
    eval_seconds = time.perf_counter() - eval_started
    real = None
    if reference:
        real = evaluate.cached_real_reference(config.train.dataset, config.train.data_dir,
                                              settings=settings, cache_dir=cache_dir, log=log)
    _write_figures(out_dir, name, record, privacy, paths,
                   max_eps=None if options.non_private else config.budget.max_eps)
    report = {
        "name": name,
        "note": note,
        "generator_init": _generator_init(out_dir, trained=not skip_train),
        "scale": scale_facts(config, options, privacy.get("steps"), train_seconds),
        "dataset": options.dataset,
        "eps": options.eps,
        "paper_config": not deviations,
        "deviations": deviations,
        "options": dataclasses.asdict(options),
        "config": config.to_dict(),
        **_run_facts(paths),
        "privacy": _privacy_summary(privacy),
        "accuracy": _accuracy_summary(options, record),
        "quality": record.get("quality"),
        "real_reference": None if real is None else {
            "val": real["protocols"]["val"]["accuracy"],
            "sen": real["protocols"]["sen"]["accuracy"],
            "samples": real["input"]["samples"], "quality": real.get("quality")},
        "evaluation": record,
        "seconds": {"train": train_seconds, "evaluate": eval_seconds,
                    "total": time.perf_counter() - started},
        "provenance": started_at,
    }
    export.write_json(os.path.join(out_dir, "report.json"), report)
    export.atomic_write(os.path.join(out_dir, "report.md"),
                        lambda s: s.write(render_markdown(report)), mode="w")
    log(f"report: {os.path.join(out_dir, 'report.md')}")
    return report


def _check_trained(paths: rundir.RunPaths, config, log: Callable[[str], None]) -> None:
    """--skip_train: the run must be finished and trained with this very config."""
    for needed in (paths.config, paths.privacy, paths.samples):
        if not os.path.exists(needed):
            raise ReproduceError(f"--skip_train: {needed} not found; "
                                 f"train first (drop --skip_train) or pass the --run_dir "
                                 f"of a finished run")
    saved = _read_json(paths.config)["config"]
    differences = resume.resume_differences(saved, config)
    if differences:
        raise ReproduceError(
            f"--skip_train: the run in {paths.root} was trained with a different config than "
            f"these options give ({rundir.describe_differences(differences, resume.PRIVACY_RELEVANT)}); pass the "
            f"same options as for training")
    log(f"--skip_train: evaluating the existing run in {paths.root}")


def _write_figures(out_dir: str, name: str, record: dict, privacy: dict,
                   paths: rundir.RunPaths, *, max_eps: float | None) -> None:
    """evaluation.png, epsilon.png and a copy of the run's samples.png in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    record_outputs.plot_curves(record, os.path.join(out_dir, "evaluation.png"),
                               title=f"{name}: classifier on {record['input']['samples']} "
                                     f"samples")
    plot_epsilon(privacy.get("epsilon_per_step", []), os.path.join(out_dir, "epsilon.png"),
                 title=f"{name}: epsilon ({privacy.get('conversion')} conversion, delta "
                       f"{privacy.get('delta')})",
                 max_eps=max_eps)
    if os.path.exists(paths.grid):
        shutil.copyfile(paths.grid, os.path.join(out_dir, "samples.png"))


def _run_facts(paths: rundir.RunPaths) -> dict:
    run_config = _read_json(paths.config)
    return {"run_dir": os.path.abspath(paths.root),
            "partition_size": run_config.get("partition_size"),
            "batch": run_config.get("batch")}


def _privacy_summary(privacy: dict) -> dict:
    """The report's copy of the run's privacy.json fields."""
    keys = ("private", "accounting_proven", "reproducible_noise", "epsilon",
            "epsilon_all_conversions", "conversion", "delta", "max_eps", "steps", "queries",
            "stop_reason", "epsilon_per_step")
    return {key: privacy.get(key) for key in keys}


def _accuracy_summary(options: ReproduceOptions, record: dict) -> dict:
    """The run's accuracies beside the paper's and any independent re-run's."""
    key = (options.dataset, options.eps)
    return {"val": record["protocols"]["val"]["accuracy"],
            "sen": record["protocols"]["sen"]["accuracy"],
            "authors": authors_accuracies(record),
            "paper": options.paper_accuracy, "paper_source": PAPER_SOURCE,
            "independent": (dict(zip(("accuracy", "source"), INDEPENDENT[key]))
                            if key in INDEPENDENT else None)}


def authors_accuracies(record: dict) -> dict[str, float] | None:
    """{range: best test accuracy} of the evaluation's authors-protocol entries."""
    entries = evaluate.authors_entries(record["protocols"])
    return {str(e["settings"]["range"]): e["accuracy"] for e in entries} or None


def _write_report(report: dict, out_dir: str) -> None:
    export.write_json(os.path.join(out_dir, "report.json"), report)
    record_outputs.plot_curves(report["evaluation"], os.path.join(out_dir, "evaluation.png"),
                         title=f"{report['name']}: classifier on "
                               f"{report['evaluation']['input']['samples']} samples")
    export.atomic_write(os.path.join(out_dir, "report.md"),
                        lambda s: s.write(render_markdown(report)), mode="w")


def _reported_run(out_dir: str, run_dir: str | None, what: str):
    """(report path, report, run directory, its samples, the real test set) of a reported
    run, for adding ``what`` to its report; refuses a missing report, missing samples and
    samples of another run."""
    path = os.path.join(out_dir, "report.json")
    if not os.path.exists(path):
        raise ReproduceError(f"{path} not found; reproduce the row first ({what} is added "
                             f"to an existing report)")
    report = _read_json(path)
    run_dir = run_dir or report["run_dir"]
    samples_path = os.path.join(run_dir, "samples.npz")
    if not os.path.exists(samples_path):
        raise ReproduceError(f"{samples_path} not found: {what} reads the run's samples; "
                             f"pass the --run_dir the report was made from")
    record = report["evaluation"]
    dataset = report["config"]["train"]["dataset"]
    synthetic, _ = evaluate.load_synthetic(samples_path, dataset)
    if len(synthetic) != record["input"]["given_samples"]:
        raise ReproduceError(f"{samples_path} holds {len(synthetic)} samples but the report "
                             f"evaluated {record['input']['given_samples']}: not the same run")
    test = evaluate.load_test(dataset, report["config"]["train"].get("data_dir"),
                              limit=record["settings"].get("test_limit"),
                              test_set=record["settings"].get("test_set", evaluate.TEST))
    return path, report, run_dir, synthetic, test


def add_quality(out_dir: str, *, run_dir: str | None = None, cache_dir: str | None = None,
                command: str = "", log: Callable[[str], None] = print) -> dict:
    """(Re)measures a reported run's sample quality -- domain-classifier IS, FID and label
    agreement -- exactly as its evaluation did (the same subset seed, number of samples
    and domain-classifier settings), and writes it into the report in ``out_dir``; the
    accuracies are kept. For reports written before a measure existed (label agreement)."""

    path, report, run_dir, synthetic, test = _reported_run(out_dir, run_dir,
                                                           "the quality measure")
    record = report["evaluation"]
    settings, seeds = record["settings"], record["seeds"]
    domain = settings["domain"]
    synthetic = evaluate.random_subset(synthetic, settings.get("max_samples"),
                                       seeds["subset"])
    result = evaluate.score_quality(
        synthetic, test, samples=settings["quality_samples"], seed=seeds["quality"],
        domain=quality_scores.DomainSettings(
            schedule=classifiers.Schedule(**domain["schedule"]), seed=domain["seed"],
            train_limit=domain.get("train_limit"),
            training_records=domain.get("training_records", "all")),
        data_dir=report["config"]["train"].get("data_dir"), cache_dir=cache_dir, log=log)
    result["provenance"] = provenance(command)
    report = _read_json(path)
    report["evaluation"]["quality"] = report["quality"] = result
    _write_report(report, out_dir)
    log(f"report: {os.path.join(out_dir, 'report.md')} (FID {result['fid']:.3f}, label "
        f"agreement {result['label_agreement']:.4f})")
    return report


def add_authors_protocol(out_dir: str, protocol, *, run_dir: str | None = None,
                         command: str = "", log: Callable[[str], None] = print) -> dict:
    """Runs the authors' evaluation script's protocol (``protocol``, an
    :class:`dclens.evaluation.authors_protocol.AuthorsProtocol`) on a reported run's samples and adds
    it to the report in ``out_dir``; its ``val``/``sen`` rows are kept as they are.

    Resumable: the loop's state is saved in the run directory
    (``authors-range<R>.npz``), so an interrupted call picks up where it stopped, and a
    finished one returns at once. The classifier seed is the report's ``init`` seed, as
    when :func:`dclens.evaluation.evaluate.evaluate` runs the protocol itself.
    """
    path, report, run_dir, synthetic, test = _reported_run(out_dir, run_dir,
                                                           "the authors' protocol")
    record = report["evaluation"]
    state_path = os.path.join(run_dir, f"authors-range{protocol.range}.npz")
    entry = evaluate.run_authors_protocol(synthetic, test, protocol,
                                          seed=record["seeds"]["init"], state_path=state_path,
                                          log=log)
    entry["provenance"] = provenance(command)
    # Re-read: another call may have added another range meanwhile (hours apart).
    report = _read_json(path)
    report["evaluation"]["protocols"][evaluate.authors_key(protocol)] = entry
    report["accuracy"]["authors"] = authors_accuracies(report["evaluation"])
    _write_report(report, out_dir)
    log(f"report: {os.path.join(out_dir, 'report.md')} (authors protocol, range "
        f"{protocol.range}: {entry['accuracy']:.4f})")
    return report


def rerender(out_dir: str, *, note: str | None = None,
             log: Callable[[str], None] = print) -> dict:
    """Rewrites report.md and evaluation.png from an existing report.json (no training,
    no evaluation): for a report written by an older version of this module. ``note``
    replaces the report's note when given."""
    path = os.path.join(out_dir, "report.json")
    if not os.path.exists(path):
        raise ReproduceError(f"{path} not found; run the reproduction first (without "
                             f"--rerender)")
    report = _read_json(path)
    if note is not None:
        report["note"] = note
    options = ReproduceOptions(**report["options"])
    config, report["deviations"] = build_config(options)
    report["paper_config"] = not report["deviations"]
    machine = {k: report.get("scale", {}).get(k) for k in ("cpu_count", "memory_bytes")}
    report["scale"] = scale_facts(config, options, report["privacy"].get("steps"),
                                  report["seconds"].get("train"))
    # The machine facts are the training machine's, not this one's.
    report["scale"].update({k: v for k, v in machine.items() if v is not None})
    _write_report(report, out_dir)
    log(f"rewrote {os.path.join(out_dir, 'report.md')} from {path}")
    return report
