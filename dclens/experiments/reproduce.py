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

import dataclasses
import json
import math
import os
import platform
import shutil
import subprocess
import time
from typing import Callable

from dclens.common import machine
from dclens.privacy import accounting
from dclens.evaluation import evaluate, record_outputs
from dclens.common import export
from dclens.runs import rundir
from dclens.datalens import config as cfg
from dclens.datalens import resume
from dclens.datalens import run
from dclens.evaluation import classifiers, quality as quality_scores
from dclens import data
from dclens.datalens import networks, teachers as teacher_module
from dclens.experiments.reproduction_report import render_markdown

#: Paper Table 1 (Wang et al., "DataLens", ACM CCS 2021): accuracy on the real test set of
#: a classifier trained on 100k DataLens samples (the authors' protocol: best test accuracy
#: over 600 epochs, i.e. our "sen"). Values as listed in docs/design.md.
PAPER_TABLE1 = {
    ("mnist", 1): 0.7123, ("mnist", 10): 0.8066,
    ("fashion_mnist", 1): 0.6478, ("fashion_mnist", 10): 0.7061,
    ("celebA-gender", 1): 0.7058, ("celebA-gender", 10): 0.7287,
    ("celebA-hair", 1): 0.6061, ("celebA-hair", 10): 0.6224,
}
PAPER_SOURCE = ("Wang et al., DataLens, ACM CCS 2021, Table 1 (classifier trained on 100k "
                "synthetic samples; best real-test accuracy over 600 epochs = our 'sen')")
#: Independent re-runs of the authors' code, where known.
INDEPENDENT = {("mnist", 10): (0.539, "SoK-PPDS: independent re-run of the authors' code")}

#: Training-split sizes, for the paper's effective batch (batch 30 cut to the partition size).
TRAIN_RECORDS = {"mnist": 60_000, "fashion_mnist": 60_000, "celebA-gender": 162_770}


class ReproduceError(ValueError):
    """A reproduction that cannot run as asked; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class ReproduceOptions:
    """What to reproduce and how far to deviate from the paper config (all recorded).

    Attributes:
      dataset: ``mnist``, ``fashion_mnist`` or ``celebA-gender``.
      eps: 1 or 10 (the paper's budgets).
      scale: fraction of the paper's teachers (None = the paper's number).
      teachers: number of teachers (overrides ``scale``).
      non_private: no noise, no budget; trains as many steps as the private config would
        (the eps = inf reference row; NOT private).
      epochs: cap on epochs (passes over the partitions); None = the preset's.
      num_samples: synthetic samples to write and evaluate (paper: 100k).
      max_records: train on the first N records only.
      seed: fixes every random draw of training (DP noise included: not publishable).
      data_dir: where the data lies (None = the dataset's default).
      teacher_chunk: teachers processed together (memory only).
      aggregation, thresh, topk: the paper's analysis rows (Tables 4-7) change these from
        the Table 1 config (an :class:`dclens.datalens.config.Aggregation` value, beta, k).
      balanced_partition: the authors' class-balanced partition (their ``--shuffle``)
        instead of dclens' index partition. A fidelity option, not a deviation from the
        paper's config (it *is* theirs), but under it one replaced record can move many
        records between teachers, so the run's epsilon is NOT a proven guarantee.
      fake_rendering: a :class:`dclens.datalens.config.FakeRendering` value; ``teacher_labels`` is
        the authors' rendering of the teachers' fake batches (a fidelity option; about 2x
        slower per step at the paper config).
      sigma_scale: the paper's sigma times this factor in (0, 1], with the budget raised
        to the epsilon the paper config's steps cost at that sigma (:func:`matched_budget`).
        With ``sigma_scale = teachers / paper teachers`` a reduced-scale run keeps the
        paper's noise relative to the vote sum (a sum of ``teachers`` votes of size at most
        1 per coordinate) and its number of steps, at a larger, truthfully accounted
        epsilon: a noise-matched small model of the paper run, NOT its privacy level.
    """

    dataset: str = "fashion_mnist"
    eps: int = 1
    scale: float | None = None
    teachers: int | None = None
    non_private: bool = False
    epochs: int | None = None
    num_samples: int | None = None
    max_records: int | None = None
    seed: int | None = None
    data_dir: str | None = None
    teacher_chunk: int | None = None
    aggregation: str | None = None
    thresh: float | None = None
    topk: int | None = None
    balanced_partition: bool = False
    fake_rendering: str | None = None
    sigma_scale: float | None = None

    def __post_init__(self) -> None:
        if (self.dataset, self.eps) not in PAPER_TABLE1:
            raise ReproduceError(f"the paper has no row for dataset={self.dataset!r}, "
                                 f"eps={self.eps!r}; rows: " + ", ".join(
                                     f"{d} eps={e}" for d, e in PAPER_TABLE1))
        if self.dataset == "celebA-hair":
            raise ReproduceError("celebA-hair: the paper's hyper-parameters for it are not "
                                 "published with the code (no preset); only its Table 1 "
                                 "value is known")
        if self.scale is not None and not (isinstance(self.scale, (int, float))
                                           and 0 < self.scale <= 1):
            raise ReproduceError(f"scale must be in (0, 1], got {self.scale!r}")
        if self.aggregation is not None and self.aggregation not in {
                a.value for a in cfg.Aggregation}:
            raise ReproduceError(f"unknown aggregation {self.aggregation!r}; use one of "
                                 f"{[a.value for a in cfg.Aggregation]}")
        if self.thresh is not None and not (isinstance(self.thresh, (int, float))
                                            and 0 <= self.thresh < 1):
            raise ReproduceError(f"thresh must be in [0, 1), got {self.thresh!r}")
        if not isinstance(self.balanced_partition, bool):
            raise ReproduceError(f"balanced_partition must be True or False, got "
                                 f"{self.balanced_partition!r}")
        if self.fake_rendering is not None and self.fake_rendering not in {
                r.value for r in cfg.FakeRendering}:
            raise ReproduceError(f"unknown fake_rendering {self.fake_rendering!r}; use one of "
                                 f"{[r.value for r in cfg.FakeRendering]}")
        if self.sigma_scale is not None:
            if isinstance(self.sigma_scale, bool) or not (
                    isinstance(self.sigma_scale, (int, float))
                    and 0 < self.sigma_scale <= 1):
                raise ReproduceError(f"sigma_scale must be in (0, 1] (a fraction of the "
                                     f"paper's sigma), got {self.sigma_scale!r}")
            if self.non_private:
                raise ReproduceError("sigma_scale scales the noise of a private run; a "
                                     "non_private run has none: give one of them")
        for name in ("teachers", "epochs", "num_samples", "max_records", "teacher_chunk",
                     "topk"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ReproduceError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def paper_accuracy(self) -> float:
        return PAPER_TABLE1[(self.dataset, self.eps)]

    def default_name(self) -> str:
        """``fashion_mnist-eps1`` for the paper config; every deviation that changes the
        result is in the name, so a shortened run never takes the paper run's folder:
        ``-t400`` (teachers), ``-e50`` (training capped at 50 epochs), ``-n10000``
        (samples), ``-r6000`` (records), ``-nonprivate`` (the eps=inf row), and what an
        analysis row changes: ``-no_topk`` (aggregation), ``-b0`` (beta), ``-k100`` (top-k);
        and the fidelity options: ``-balanced`` (the authors' partition),
        ``-teacher_labels`` (the authors' fake-batch rendering); ``-sigma0.05`` (the
        noise-matched reduced scale, :attr:`sigma_scale`)."""
        name = f"{self.dataset}-eps{self.eps}"
        paper = cfg.paper_preset(self.dataset, self.eps).train.num_teachers
        teachers = self.resolved_teachers(paper)
        if teachers != paper:
            name += f"-t{teachers}"
        for value, tag in ((self.epochs, "e"), (self.num_samples, "n"),
                           (self.max_records, "r")):
            if value is not None:
                name += f"-{tag}{value}"
        paper_topagg = cfg.paper_preset(self.dataset, self.eps).topagg
        if self.aggregation is not None and self.aggregation != paper_topagg.method.value:
            name += f"-{self.aggregation}"
        if self.thresh is not None and self.thresh != paper_topagg.thresh:
            name += f"-b{self.thresh:g}"
        if self.topk is not None and self.topk != paper_topagg.topk:
            name += f"-k{self.topk}"
        for tag in self.fidelity_tags():
            name += f"-{tag}"
        if self.sigma_scale is not None and self.sigma_scale != 1:
            name += f"-sigma{self.sigma_scale:g}"
        if self.non_private:
            name += "-nonprivate"
        return name

    def fidelity_tags(self) -> list[str]:
        """The fidelity options this run sets, as name tags (empty: dclens' defaults)."""
        tags = ["balanced"] if self.balanced_partition else []
        if (self.fake_rendering is not None
                and self.fake_rendering != cfg.FakeRendering.CLASS_GRID.value):
            tags.append(self.fake_rendering)
        return tags

    def resolved_teachers(self, paper_teachers: int) -> int:
        if self.teachers is not None:
            return self.teachers
        if self.scale is not None:
            return max(1, int(round(self.scale * paper_teachers)))
        return paper_teachers


def build_config(options: ReproduceOptions) -> tuple[cfg.DataLensConfig, list[str]]:
    """The run's config and the list of its deviations from the paper config (empty = none)."""
    paper = cfg.paper_preset(options.dataset, options.eps)
    paper_teachers = paper.train.num_teachers
    records = options.max_records or TRAIN_RECORDS[options.dataset]
    paper_batch = min(paper.train.batch_size, TRAIN_RECORDS[options.dataset] // paper_teachers)
    teachers = options.resolved_teachers(paper_teachers)
    train: dict = {"data_dir": options.data_dir, "seed": options.seed}
    topagg: dict = {}
    deviations: list[str] = []
    if teachers != paper_teachers:
        train["num_teachers"] = teachers
        # Keep the paper's queries per step (its batch: 30 cut to the partition size), so the
        # privacy cost per step and the number of steps to the budget stay the paper's.
        train["batch_size"] = paper_batch
        relative_noise = paper_teachers / teachers * (options.sigma_scale or 1.0)
        if options.non_private:
            noise = ""
        elif options.sigma_scale is None:
            noise = (f"; sigma, k and beta are the paper's, so the noise is "
                     f"{relative_noise:g}x larger relative to the vote sum (at most "
                     f"{teachers})")
        else:
            noise = (f"; k and beta are the paper's, sigma is scaled (below), so the noise "
                     f"relative to the vote sum (at most {teachers}) is {relative_noise:g}x "
                     f"the paper's")
        deviations.append(
            f"{teachers} teachers instead of the paper's {paper_teachers} "
            f"(partitions of {records // teachers} records instead of "
            f"{TRAIN_RECORDS[options.dataset] // paper_teachers}){noise}")
        deviations.append(f"batch_size {paper_batch} (the paper run's effective batch: 30 cut "
                          f"to its partition size), so queries per step and steps to the "
                          f"budget match the paper run")
    if options.max_records is not None:
        train["max_records"] = options.max_records
        deviations.append(f"trained on the first {options.max_records} records only")
    if options.num_samples is not None and options.num_samples != paper.train.num_samples:
        train["num_samples"] = options.num_samples
        deviations.append(f"{options.num_samples} synthetic samples instead of the paper's "
                          f"{paper.train.num_samples}")
    if options.teacher_chunk is not None:
        train["teacher_chunk"] = options.teacher_chunk
    if options.epochs is not None:
        train["epochs"] = options.epochs
        deviations.append(f"training capped at {options.epochs} epoch(s)")
    if options.aggregation is not None and options.aggregation != paper.topagg.method.value:
        topagg["method"] = cfg.Aggregation(options.aggregation)
        deviations.append(f"aggregation {options.aggregation} instead of the paper's "
                          f"{paper.topagg.method.value} (an analysis row, Tables 5-7)")
    if options.thresh is not None and options.thresh != paper.topagg.thresh:
        topagg["thresh"] = float(options.thresh)
        deviations.append(f"beta = {options.thresh:g} instead of {paper.topagg.thresh:g} "
                          f"(an analysis row, Tables 4 and 7)")
    if options.topk is not None and options.topk != paper.topagg.topk:
        topagg["topk"] = options.topk
        deviations.append(f"top-k = {options.topk} instead of {paper.topagg.topk} (an "
                          f"analysis row, Table 4)")
    # Fidelity options: the authors' choices where dclens' defaults differ. Not deviations
    # from the paper's config, so not listed as such; the report names them.
    if options.balanced_partition:
        train["balanced_partition"] = True
    if options.fake_rendering is not None:
        train["fake_rendering"] = cfg.FakeRendering(options.fake_rendering)
    budget: dict = {}
    if options.sigma_scale is not None and options.sigma_scale != 1:
        topagg["sigma"] = paper.topagg.sigma * options.sigma_scale
        budget["max_eps"] = matched_budget(options.dataset, options.eps, topagg["sigma"])
        steps = paper_steps(options.dataset, options.eps)
        deviations.append(
            f"NOT epsilon = {options.eps}: sigma = {topagg['sigma']:g} ({options.sigma_scale:g} "
            f"x the paper's {paper.topagg.sigma:g}; at {teachers} teachers the noise relative "
            f"to the vote sum is the paper's at {teachers / options.sigma_scale:g}), and the "
            f"budget is raised to epsilon {budget['max_eps']:.4g}, between what the paper "
            f"config's {steps} and {steps + 1} steps cost at that sigma, so TopAgg runs the "
            f"paper's {steps} steps (a noise-matched reduced scale)")
    config = paper.replace(train=train, topagg=topagg, budget=budget)
    if options.non_private:
        batch = min(config.train.batch_size, records // config.train.num_teachers)
        steps = accounting.max_steps_within(
            sigma=config.topagg.sigma, topk=config.topagg.topk,
            queries_per_step=batch * config.train.g_step, max_eps=config.budget.max_eps,
            delta=config.budget.delta, conversion=config.budget.conversion,
            orders=(accounting.classic_orders(config.budget.max_order)
                    if config.budget.conversion is accounting.Conversion.CLASSIC else None))
        steps_per_epoch = max(1, (records // config.train.num_teachers) // batch)
        epochs = max(1, math.ceil(steps / steps_per_epoch))
        if options.epochs is not None:
            epochs = min(epochs, options.epochs)
        config = config.replace(train={"non_private": True, "epochs": epochs},
                                topagg={"sigma": 0.0})
        deviations.append(f"NON-PRIVATE: no noise and no budget (sigma = 0); {epochs} "
                          f"epoch(s) = {epochs * steps_per_epoch} steps, the fewest whole "
                          f"epochs covering the {steps} steps the private config allows; the "
                          f"paper's eps = inf column is a non-private DC-GAN, not this run")
    return config, deviations


def _paper_accounting(dataset: str, eps: int) -> tuple[cfg.DataLensConfig, int, tuple | None]:
    """The paper config of the Table 1 row, its TopAgg queries per step (B: 30 cut to the
    15-record partitions, times g_step) and the RDP orders its budget is checked at."""
    paper = cfg.paper_preset(dataset, eps)
    queries = min(paper.train.batch_size,
                  TRAIN_RECORDS[dataset] // paper.train.num_teachers) * paper.train.g_step
    orders = (accounting.classic_orders(paper.budget.max_order)
              if paper.budget.conversion is accounting.Conversion.CLASSIC else None)
    return paper, queries, orders


def paper_steps(dataset: str, eps: int) -> int:
    """The steps the paper config of the Table 1 row (``dataset``, ``eps``) runs before
    its budget: TopAgg with the paper's sigma and k, B queries per step."""
    paper, queries, orders = _paper_accounting(dataset, eps)
    return accounting.max_steps_within(
        sigma=paper.topagg.sigma, topk=paper.topagg.topk, queries_per_step=queries,
        max_eps=paper.budget.max_eps, delta=paper.budget.delta,
        conversion=paper.budget.conversion, orders=orders)


def matched_budget(dataset: str, eps: int, sigma: float) -> float:
    """The epsilon budget under which TopAgg with ``sigma`` (the paper's k and queries per
    step) runs exactly the paper row's :func:`paper_steps`: the midpoint between the
    epsilon after that many steps and after one more, so floating-point differences in
    composing the ledger step by step cannot move the stop by a step.

    RDP is linear in steps / noise_multiplier^2, so at a common budget every mechanism of
    an analysis table (its own sensitivity, its own noise multiplier) runs the steps it
    would run at the paper's sigma and epsilon, up to rounding: the rows stay comparable
    as at the paper scale.
    """
    paper, queries, orders = _paper_accounting(dataset, eps)
    steps = paper_steps(dataset, eps)
    at, after = (accounting.epsilon_for(
        sigma=sigma, topk=paper.topagg.topk, queries_per_step=queries, steps=n,
        delta=paper.budget.delta, conversion=paper.budget.conversion,
        orders=orders).epsilon for n in (steps, steps + 1))
    return (at + after) / 2


def teacher_state_bytes(dataset: str, teachers: int) -> int | None:
    """Bytes of the teacher bank (weights + two Adam moments, float32) for ``teachers``."""
    try:

        spec = data.dataset_spec("celebA-gender-train" if dataset == "celebA-gender"
                                 else dataset)
        shape = networks.ImageShape(spec.height, spec.width, spec.channels, spec.num_classes)
        return 3 * 4 * teacher_module.ParamLayout.for_shape(shape).size * teachers
    except Exception:   # informative only: never fail a report over it
        return None


def scale_facts(config: cfg.DataLensConfig, options: ReproduceOptions, steps: int | None,
                train_seconds: float | None) -> dict:
    """How far this run is from the paper's scale, and what the paper's would cost here.

    The extrapolation is linear in the number of teachers (every teacher trains and is
    queried once per step) and counts the paper's number of steps; it is a rough guide.
    """
    paper = cfg.paper_preset(options.dataset, options.eps)
    teachers = config.train.num_teachers
    per_step = (train_seconds / steps) if (train_seconds and steps) else None
    paper_step_count = paper_steps(options.dataset, options.eps)
    return {
        "teachers": teachers, "paper_teachers": paper.train.num_teachers,
        "seconds_per_step": per_step, "paper_steps": paper_step_count,
        "paper_seconds_extrapolated": (per_step * paper.train.num_teachers / teachers
                                       * paper_step_count) if per_step else None,
        "paper_teacher_state_bytes": teacher_state_bytes(options.dataset,
                                                         paper.train.num_teachers),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _physical_memory(),
    }


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], check=False, capture_output=True, text=True,
                                timeout=10, cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


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
    status = _git("status", "--porcelain", "--untracked-files=no")
    import keras
    import tensorflow as tf

    return {"command": command, "commit": _git("rev-parse", "HEAD"),
            "uncommitted_changes": None if status is None else bool(status),
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
              checkpoint_every: int = 10) -> dict:
    """Train (unless ``skip_train``), evaluate, write the report; returns report.json's dict.

    ``note`` is free text shown under the report's title (e.g. why a run is scaled down).
    ``checkpoint_every`` is passed to :func:`dclens.datalens.run.train_run` (generator steps between
    checkpoints; at 4000 teachers one checkpoint is about 27 GB, so paper-scale runs may
    want fewer).
    """

    started = time.perf_counter()
    started_at = provenance(command)
    config, deviations = build_config(options)
    settings = settings or evaluate.EvalSettings()
    name = options.default_name()
    out_dir = out_dir or os.path.join("results", name)
    run_dir = run_dir or os.path.join("runs", "reproduce", name)
    samples_path = os.path.join(run_dir, "samples.npz")
    train_seconds = None
    if skip_train:
        for needed in ("config.json", "privacy.json", "samples.npz"):
            if not os.path.exists(os.path.join(run_dir, needed)):
                raise ReproduceError(f"--skip_train: {os.path.join(run_dir, needed)} not found; "
                                     f"train first (drop --skip_train) or pass the --run_dir "
                                     f"of a finished run")
        saved = _read_json(os.path.join(run_dir, "config.json"))["config"]
        differences = resume.resume_differences(saved, config)
        if differences:
            raise ReproduceError(
                f"--skip_train: the run in {run_dir} was trained with a different config than "
                f"these options give ({rundir.describe_differences(differences, resume.PRIVACY_RELEVANT)}); pass the "
                f"same options as for training")
        log(f"--skip_train: evaluating the existing run in {run_dir}")
    else:
        if os.path.exists(samples_path):
            raise ReproduceError(f"{run_dir} already holds a finished run; pass --skip_train "
                                 f"to evaluate it again, or choose another --run_dir")
        # An unfinished run with the same config there is resumed by train_run.
        if deviations:
            log("NOT the paper config: " + "; ".join(deviations))
        summary = run.train_run(config, run_dir, progress=progress, log=log,
                                checkpoint_every=checkpoint_every)
        train_seconds = summary.seconds
    privacy = _read_json(os.path.join(run_dir, "privacy.json"))
    run_config = _read_json(os.path.join(run_dir, "config.json"))

    eval_started = time.perf_counter()
    record = evaluate.evaluate_path(samples_path, config.train.dataset,
                                    data_dir=config.train.data_dir, settings=settings,
                                    cache_dir=cache_dir, log=log)
    eval_seconds = time.perf_counter() - eval_started
    os.makedirs(out_dir, exist_ok=True)
    record_outputs.plot_curves(record, os.path.join(out_dir, "evaluation.png"),
                         title=f"{name}: classifier on {record['input']['samples']} samples")
    real = None
    if reference:
        real = evaluate.cached_real_reference(config.train.dataset, config.train.data_dir,
                                              settings=settings, cache_dir=cache_dir, log=log)
    plot_epsilon(privacy.get("epsilon_per_step", []), os.path.join(out_dir, "epsilon.png"),
                 title=f"{name}: epsilon ({privacy.get('conversion')} conversion, delta "
                       f"{privacy.get('delta')})",
                 max_eps=None if options.non_private else config.budget.max_eps)
    if os.path.exists(os.path.join(run_dir, "samples.png")):
        shutil.copyfile(os.path.join(run_dir, "samples.png"), os.path.join(out_dir,
                                                                            "samples.png"))
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
        "run_dir": os.path.abspath(run_dir),
        "partition_size": run_config.get("partition_size"),
        "batch": run_config.get("batch"),
        "privacy": {
            "private": privacy.get("private"),
            "accounting_proven": privacy.get("accounting_proven"),
            "reproducible_noise": privacy.get("reproducible_noise"),
            "epsilon": privacy.get("epsilon"),
            "epsilon_all_conversions": privacy.get("epsilon_all_conversions"),
            "conversion": privacy.get("conversion"), "delta": privacy.get("delta"),
            "max_eps": privacy.get("max_eps"), "steps": privacy.get("steps"),
            "queries": privacy.get("queries"), "stop_reason": privacy.get("stop_reason"),
            "epsilon_per_step": privacy.get("epsilon_per_step"),
        },
        "accuracy": {
            "val": record["protocols"]["val"]["accuracy"],
            "sen": record["protocols"]["sen"]["accuracy"],
            "authors": authors_accuracies(record),
            "paper": options.paper_accuracy, "paper_source": PAPER_SOURCE,
            "independent": (dict(zip(("accuracy", "source"),
                                     INDEPENDENT[(options.dataset, options.eps)]))
                            if (options.dataset, options.eps) in INDEPENDENT else None),
        },
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
                              limit=record["settings"].get("test_limit"))
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
            train_limit=domain.get("train_limit")),
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
