"""A whole DataLens run: data in, private generator, samples and a privacy ledger out.

:func:`train_run` is what ``scripts/main.py --train`` calls; :func:`sample_run` is what it
calls without ``--train``.  Files written in the output directory:

=========================  ====================================================
``config.json``            the resolved configuration (+ how the seed was chosen)
``ledger.json``            the write-ahead privacy journal: every round's spend is
                           fsynced here before its noise is drawn (dclens.runs.journal)
``privacy.json``           the privacy report: delta, conversion, epsilon after every
                           step, queries, lost queries, sigma, k; rewritten every step
``checkpoints/``           PRIVATE resume state: root seed, teachers, generator,
                           optimizer, step, ledger (dclens.runs.checkpoint); never publish it
``generator.keras``        the student generator (Keras format)
``samples.npz``            ``x`` float32 [N, H, W, C] in [0, 1], ``y`` int64 [N]
``eps-X.XX.data-i.pkl``    the same samples in the authors' layout (10 files)
``samples.png``            a sample grid, one row per class
``logs/``                  TensorBoard: epsilon, losses, pass fraction, sample grids
=========================  ====================================================

Running the same command again on the same directory resumes it (see :mod:`dclens.runs.rundir`
for what may change between the two commands, :mod:`dclens.runs.journal` for the ledger rule).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Callable

from dclens.common import machine
from dclens.privacy import accounting
from dclens.common import export
from dclens.runs.checkpoint import CheckpointSpaceError, CheckpointStore
from dclens.datalens import resume, sharded
from dclens.datalens import topagg as topagg_lib
from dclens.datalens.build import bank_location, image_shape_of, load_training_data
from dclens.datalens.config import DataLensConfig, SaveVotes
from dclens.datalens.outputs import (RAW_VOTES_MARKER, VoteWriter, class_grid,
                                     write_sample_outputs)
from dclens.datalens.shards import plan_shards
from dclens.datalens.train import BudgetExhausted, DataLens
from dclens.runs.journal import PrivacyJournal
from dclens.common.progress import progress_bar
from dclens.runs.rundir import (Mode, RunDirError, RunPaths, create_run_files, open_journal,
                                plan_run, restore_latest, root_seed as _saved_or_new_seed,
                                set_aside, write_seed)

__all__ = ["RunDirError", "RunSummary", "TrainingDiverged", "train_run"]

NOT_PRIVATE_WARNING = ("*** --non_private: NO differential privacy. This run's generator and "
                       "samples are NOT private; use them for debugging only. ***")
REPRODUCIBLE_NOISE_WARNING = (
    "--seed fixes the DP noise: anyone who knows the seed can reproduce and subtract it. "
    "Use seeded runs for tests and debugging; do not publish their outputs as private.")


UNPROVEN_ACCOUNTING_WARNING = (
    "FetchSGD with the authors' accounting (--sketch_accounting authors_unproven): its "
    "epsilon charges 2 sqrt(k) for noise added after unsketching and top-k, which no proof "
    "supports; the reported epsilon is NOT a guarantee (privacy.json says "
    "accounting_proven: false)")


DATA_DEPENDENT_PARTITION_WARNING = (
    "class-balanced partitions (--shuffle / balanced_partition, the authors'): a record's "
    "teacher depends on every record's label, so replacing one record can move many "
    "records between teachers and the 2 sqrt(k) sensitivity does not hold; the reported "
    "epsilon is NOT a guarantee (privacy.json says accounting_proven: false). The default "
    "partition (--noshuffle) is data-independent.")


def plan_datalens_run(config: DataLensConfig, output_dir: str, *, restart: bool = False,
                      flag: str = "--checkpoint_dir", offers_restart: bool = True):
    """:func:`dclens.runs.rundir.plan_run` with DataLens' resume rule (``flag``: the option
    that named ``output_dir``: main.py's --checkpoint_dir, reproduce.py's --run_dir, which
    has no --restart: ``offers_restart=False``)."""
    return plan_run(config, output_dir, restart=restart, kind="datalens", flag=flag,
                    offers_restart=offers_restart,
                    differences_of=resume.resume_differences,
                    privacy_relevant=resume.PRIVACY_RELEVANT)


class TrainingDiverged(RuntimeError):
    """The student's (generator's) loss became NaN or infinite; the run stopped at its
    last good checkpoint.  Decided from released quantities only (see :func:`train`)."""


@dataclasses.dataclass(frozen=True)
class RunSummary:
    steps: int
    queries: int
    epsilon: float | None
    stop_reason: str
    output_dir: str
    seconds: float
    resumed_from_step: int | None = None
    lost_queries: int = 0


@dataclasses.dataclass(frozen=True)
class DatasetFacts:
    """What a run's records and logs say about its training data (not the data)."""

    name: str
    source: str
    records: int


FaultHook = Callable[[str, int], None]
"""``hook(point, step)``: called at named points of a run (fault-injection tests).

Points: ``after_spend`` (a round's spend is journaled, its noise not drawn yet),
``after_step`` (privacy.json written, checkpoint not yet), ``checkpoint_before_commit``
(checkpoint files durable, folder not renamed), ``after_checkpoint``, ``before_outputs``.
"""


def privacy_record(lens, config: DataLensConfig, curve: list[dict], stop_reason: str | None,
                   seeded: bool, journal: PrivacyJournal | None = None) -> dict:
    """The JSON ledger of a run (see module docstring)."""
    record = {
        "private": not config.train.non_private,
        "reproducible_noise": seeded,
        "delta": config.budget.delta,
        "max_eps": config.budget.max_eps,
        "conversion": config.budget.conversion.value,
        "sigma": config.topagg.sigma,
        "topk": config.topagg.topk,
        "aggregation": config.topagg.method.value,
        "accounting_proven": config.accounting_proven,
        "partition": ("class_balanced (data-dependent: not covered by the sensitivity)"
                      if config.train.balanced_partition else
                      "index (a random permutation of record indices: data-independent)"),
        "unit": "replacing one training record (it changes one teacher's partition)",
        # The mechanism's cached values (FetchSGD's come from its count sketch's hashes).
        "sensitivity": lens.topagg.sensitivity,
        "noise_multiplier": (lens.topagg.noise_multiplier
                             if config.topagg.sigma > 0 else None),
        "num_teachers": config.train.num_teachers,
        "queries_per_round": lens.batch,
        "queries": lens.ledger.queries,
        "steps": lens.step,
        "epsilon_per_step": curve,
        "stop_reason": stop_reason,
        "ledger": lens.ledger.state_dict(),
        "lost_queries": journal.lost_queries if journal is not None else 0,
        "lost_spends": journal.lost if journal is not None else [],
        "hyperparameter_selection": accounting.HYPERPARAMETER_SELECTION,
    }
    if config.train.non_private:
        record["warning"] = NOT_PRIVATE_WARNING
    elif lens.ledger.queries:
        record["epsilon"] = lens.ledger.epsilon().to_dict()
        record["epsilon_all_conversions"] = {
            conversion.value: other_conversion(lens.ledger, conversion).epsilon().to_dict()
            for conversion in accounting.Conversion}
    return record


def other_conversion(ledger: accounting.PrivacyLedger,
                     conversion: accounting.Conversion) -> accounting.PrivacyLedger:
    """The same spends, converted with ``conversion`` (default orders of that conversion)."""
    state = dict(ledger.state_dict())
    if conversion is not ledger.conversion:
        state["conversion"] = conversion.value
        state["orders"] = list(accounting.CLASSIC_ORDERS if conversion is
                               accounting.Conversion.CLASSIC else accounting.DP_ACCOUNTING_ORDERS)
    return accounting.PrivacyLedger.from_state_dict(state)


def _progress(total: int, enabled: bool):
    return progress_bar(total, unit="step", desc="DataLens") if enabled else None


def _no_hook(point: str, step: int) -> None:
    del point, step


def _root_seed(plan, config: DataLensConfig) -> int:
    """The run's root seed: saved (resume), else --seed, else fresh OS entropy."""
    return _saved_or_new_seed(plan, config.train.seed)


def _write_seed(plan, root_seed: int, seeded: bool) -> None:
    write_seed(plan.paths, root_seed, seeded=seeded)


def _begin_fresh(plan, config: DataLensConfig, dataset: "DatasetFacts", lens,
                 root_seed: int) -> PrivacyJournal:
    """A new run's files (:func:`dclens.runs.rundir.create_run_files`); its journal."""
    seeded = config.train.seed is not None
    return create_run_files(
        plan.paths, config.to_dict(), kind="DataLens", root_seed=root_seed, seeded=seeded,
        facts={"dataset_source": dataset.source, "records": dataset.records,
               "partition_size": lens.partition_size, "batch": lens.batch,
               "steps_per_epoch": lens.steps_per_epoch, "seed_from_os_entropy": not seeded,
               "private": not config.train.non_private},
        ledger=lens.ledger)


def _resume(plan, lens, store: CheckpointStore, log: Callable[[str], None]
            ) -> tuple[PrivacyJournal, list[dict], int | None, bool]:
    """Loads the journal and the newest checkpoint into ``lens``
    (:func:`dclens.runs.rundir.open_journal`, :func:`dclens.runs.rundir.restore_latest`).

    Returns (journal, epsilon curve so far, the step resumed from, finished?).
    """
    removed = store.remove_partial()
    if removed:
        log(f"removed {len(removed)} incomplete checkpoint(s) left by a crash")
    latest = store.latest()
    journal = open_journal(plan.paths, latest, new_ledger=lambda: lens.ledger)

    def load(checkpoint) -> None:
        lens.load_state_arrays(lambda name: checkpoint.load_array(name, mmap=True),
                               checkpoint.array_names(), checkpoint.step)

    restored = restore_latest(store, journal, root_seed=lens.root_seed,
                              seed_path=plan.paths.seed, load=load, curve_key="curve")
    lens.ledger = journal.ledger
    # Every resume that lost spends draws fresh DP noise from here on (see noise_seed).
    lens.noise_attempt = len(journal.lost)
    lost_queries = sum(spend.queries for spend in restored.lost)
    where = f"checkpoint {latest.path}" if latest is not None else "the start (no checkpoint)"
    log(f"resuming at step {lens.step} from {where}; the ledger counts {journal.queries} "
        f"queries" + (f", {lost_queries} of them from steps whose results were lost in the "
                      "crash (still counted, see ledger.json 'lost')" if lost_queries else ""))
    return journal, restored.curves, lens.step, restored.finished


def _save_checkpoint(store: CheckpointStore, lens, journal: PrivacyJournal, curve: list[dict],
                     *, finished: bool, stop_reason: str | None, hook: FaultHook,
                     log: Callable[[str], None]) -> None:
    state = {"root_seed": lens.root_seed, "curve": curve,
             "journal_entries": len(journal.entries), "ledger": lens.ledger.state_dict(),
             "finished": finished, "stop_reason": stop_reason,
             "shards": len(lens.teachers.plan) if lens.sharded else 0}
    try:
        if lens.sharded:    # every shard's teachers first: the driver's commit implies them
            lens.teachers.save(lens.step)
        store.save(lens.step, lens.state_arrays(), state,
                   before_commit=lambda: hook("checkpoint_before_commit", lens.step))
    except CheckpointSpaceError as error:
        # The ledger does not depend on checkpoints: training goes on, a crash would
        # resume from an older checkpoint (or the start) with every spend still counted.
        log(f"warning: step {lens.step}: no checkpoint written: {error}")
        return
    hook("after_checkpoint", lens.step)


def _log_step(writer, record, lens, config: DataLensConfig, grid_every: int, bar) -> None:
    import tensorflow as tf

    with writer.get().as_default(step=record.step + 1):
        if record.epsilon is not None:
            tf.summary.scalar("privacy/epsilon", record.epsilon)
        if record.epsilon_data_dependent_analysis is not None:
            tf.summary.scalar("privacy/epsilon_data_dependent_analysis_not_spent",
                              record.epsilon_data_dependent_analysis)
        tf.summary.scalar("loss/teacher", record.teacher_loss)
        tf.summary.scalar("loss/student", record.student_loss)
        tf.summary.scalar("votes/pass_fraction", record.pass_fraction)
        tf.summary.scalar("time/seconds_per_step", record.seconds)
        if (record.step + 1) % grid_every == 0:
            tf.summary.image("samples/by_class", class_grid(
                lens.generate, lens.shape, config.train.z_dim, lens.seeds)[None])
    if bar is not None:
        bar.set_postfix(progress_fields(record))      # before update: a plain line shows it
        bar.update(1)


def progress_fields(record) -> dict[str, str]:
    """What the progress bar shows of a step: released or public quantities only.

    The epsilon spent, the student's loss and the share of coordinates that passed the
    threshold are functions of the noisy, thresholded votes (post-processing of the
    charged mechanism). The teachers' loss is computed on the private records with no
    noise, so it is left out here and goes only to the run's own TensorBoard
    (``loss/teacher``), as a private diagnostic: terminal output gets pasted into issues
    and papers.
    """
    return {"eps": "n/a" if record.epsilon is None else f"{record.epsilon:.4f}",
            "g_loss": f"{record.student_loss:.3g}",
            "passed": f"{record.pass_fraction:.3f}"}


class BudgetTooSmall(ValueError):
    """The budget allows no generator step at all; nothing was written."""


def _budget_arguments(config: DataLensConfig, batch: int, dim: int) -> dict:
    """The accountant's arguments for one generator step (g_step rounds of B queries):
    the mechanism's noise multiplier expressed as TopAgg's sigma / (2 sqrt(k))."""
    topagg_sensitivity = 2.0 * math.sqrt(config.topagg.topk)
    multiplier = topagg_lib.noise_multiplier(config.topagg, dim)
    equivalent_sigma = (config.topagg.sigma
                        if topagg_lib.sensitivity(config.topagg, dim) == topagg_sensitivity
                        else multiplier * topagg_sensitivity)
    orders = (accounting.classic_orders(config.budget.max_order)
              if config.budget.conversion is accounting.Conversion.CLASSIC else None)
    return dict(sigma=equivalent_sigma, topk=config.topagg.topk,
                queries_per_step=batch * config.train.g_step, delta=config.budget.delta,
                conversion=config.budget.conversion, orders=orders)


def steps_within_budget(config: DataLensConfig, batch: int, dim: int) -> int:
    """Whole generator steps (g_step rounds of ``batch`` queries) the budget allows from
    nothing spent (the epoch cap aside)."""
    return accounting.max_steps_within(max_eps=config.budget.max_eps,
                                       **_budget_arguments(config, batch, dim))


def check_budget_allows_a_step(config: DataLensConfig, batch: int, dim: int) -> None:
    """Refuses (:class:`BudgetTooSmall`, naming what one step costs) a private run whose
    budget allows no step: it would write an untrained generator's noise as its samples."""
    if batch < 1 or config.topagg.topk > dim:
        return          # not a budget question: DataLens refuses these by name
    if config.train.non_private or steps_within_budget(config, batch, dim) > 0:
        return
    one = accounting.epsilon_for(steps=1, **_budget_arguments(config, batch, dim)).epsilon
    raise BudgetTooSmall(
        f"the budget epsilon <= {config.budget.max_eps:g} allows 0 generator steps: one step "
        f"({config.train.g_step} round(s) of {batch} TopAgg queries) costs epsilon = "
        f"{one:.4g} at delta {config.budget.delta:g} ({config.budget.conversion.value} "
        f"conversion); raise --max_eps to at least {one:.4g}, or raise --sigma. Nothing "
        "was written.")


def _expected_steps(config: DataLensConfig, lens, total_steps: int) -> int:
    """Steps the run will take: the budget's, or the epoch cap where it comes first."""
    if config.train.non_private:
        return total_steps
    return min(total_steps, steps_within_budget(config, lens.batch, lens.shape.dim))


def _on_off(flag: bool | None) -> str:
    return "unknown" if flag is None else "on" if flag else "off"


def _outputs_exist(output_dir: str) -> bool:
    paths = RunPaths(output_dir)
    return all(os.path.exists(path) for path in (paths.generator, paths.samples, paths.grid))


def _finished_summary(plan, config: DataLensConfig, started: float) -> RunSummary | None:
    """The summary of a finished run that this command would not extend, else None.

    Read from the small records only (config.json, the newest checkpoint's state.json,
    ledger.json): no data set, teacher state or TensorFlow.  A command with more epochs or
    a larger budget than the saved run may extend it, so it gets None (the full path).
    """
    if plan.mode is not Mode.RESUME or not _outputs_exist(plan.paths.root) \
            or not os.path.exists(plan.paths.journal):
        return None
    latest = CheckpointStore(plan.paths.checkpoints).latest()
    if latest is None or not latest.state.get("finished"):
        return None
    with open(plan.paths.config) as stream:
        saved = DataLensConfig.from_dict(json.load(stream)["config"])
    if (config.train.epochs > saved.train.epochs
            or config.budget.max_eps > saved.budget.max_eps):
        return None
    journal = PrivacyJournal.load(plan.paths.journal)
    epsilon = (None if config.train.non_private or not journal.queries
               else journal.ledger.epsilon().epsilon)
    return RunSummary(latest.step, journal.queries, epsilon,
                      latest.state.get("stop_reason") or "epochs", plan.paths.root,
                      time.perf_counter() - started, latest.step, journal.lost_queries)


class _LazySummaryWriter:
    """A TensorBoard writer that creates its event file on first use, so an invocation
    that logs nothing (a finished run, an early error) leaves no empty event file."""

    def __init__(self, logdir: str):
        self.logdir = logdir
        self._writer = None

    def get(self):
        if self._writer is None:
            import tensorflow as tf  # pylint: disable=import-outside-toplevel

            self._writer = tf.summary.create_file_writer(self.logdir)
        return self._writer

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()


def train_run(config: DataLensConfig, output_dir: str, *, progress: bool = True,
              log: Callable[[str], None] = print, restart: bool = False,
              checkpoint_every: int = 10, fault_hook: FaultHook | None = None,
              shards: int | None = None, ray_address: str | None = None,
              shard_backend: str = "ray") -> RunSummary:
    """Trains DataLens with ``config`` into ``output_dir``, resuming the run already there.

    Args:
      config: the run's settings.
      output_dir: the run directory (see :mod:`dclens.runs.rundir`).  If it holds a run with the
        same settings, training resumes from its newest checkpoint; the write-ahead journal
        keeps every spend, including those of steps lost in a crash (:mod:`dclens.runs.journal`).
      restart: set an existing run aside (renamed, never deleted) and start over.
      checkpoint_every: generator steps between checkpoints (also one at the end).
      fault_hook: see :data:`FaultHook` (tests only).
      shards, ray_address, shard_backend: hold the teachers in ``shards`` workers (Ray
        actors on the cluster at ``ray_address``, a local one if None; ``shard_backend``
        ``"inprocess"`` runs the same workers in this process) instead of in this
        process: bit for bit the same run (:mod:`dclens.datalens.sharded`).  None: in-process.
        A run resumes only with the number of shards it was trained with.

    Raises:
      RunDirError: the directory cannot be used (nothing is changed).
      TrainingDiverged: a loss became NaN/inf; the ledger and the last good checkpoint are
        kept and the outputs are not written.
    """
    if not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    hook = fault_hook or _no_hook
    started = time.perf_counter()
    early = plan_datalens_run(config, output_dir, restart=restart)  # before the data load
    finished_already = None if restart else _finished_summary(early, config, started)
    if finished_already is not None:
        log(f"the run in {output_dir} is already finished (stopped by "
            f"{finished_already.stop_reason} at step {finished_already.steps}); nothing to "
            "do. Pass --restart to train it again.")
        return finished_already
    seeded = config.train.seed is not None
    if not config.topagg.accounting_proven:
        log("warning: " + UNPROVEN_ACCOUNTING_WARNING)
    if config.train.balanced_partition and not config.train.non_private:
        log("warning: " + DATA_DEPENDENT_PARTITION_WARNING)
    if config.train.non_private:
        log(NOT_PRIVATE_WARNING)
    elif seeded:
        log("warning: " + REPRODUCIBLE_NOISE_WARNING)
    if shards is not None:      # a bad --shards is refused before the data load
        plan_shards(config.train.num_teachers, shards, config.train.teacher_chunk)
    dataset = load_training_data(config)
    shape = image_shape_of(dataset.spec)        # before anything is written:
    check_budget_allows_a_step(config, min(config.train.batch_size,
                                           len(dataset.labels) // config.train.num_teachers),
                               shape.dim)
    plan = plan_datalens_run(config, output_dir, restart=restart)  # another may have begun
    root_seed = _root_seed(plan, config)
    if plan.set_aside:      # before the bank, which may be created inside the directory
        moved = set_aside(plan.paths.root)
        log(f"--restart: the previous run was moved to {moved} (nothing deleted)")
    # A bank larger than half the RAM lives on disk inside the run (streamed chunk by chunk).
    store = CheckpointStore(plan.paths.checkpoints)
    if plan.mode is not Mode.FRESH:        # refuse another shard count before starting any
        _check_shards(store, shards or 0)
    shard_options = None
    if shards is not None:
        shard_options = sharded.ShardOptions(shards, plan.paths.checkpoints, backend=shard_backend,
                                     ray_address=ray_address)
        log(f"starting {shards} shard worker(s) ({shard_backend}"
            + (f", Ray at {ray_address}" if ray_address else "") + ")")
    lens = DataLens(config, dataset, root_seed=root_seed,
                    launch_teachers=(None if shard_options is None
                                     else sharded.launcher(shard_options)),
                    bank_dir=bank_location(config,
                                           plan.paths.bank))
    facts = DatasetFacts(dataset.spec.name, dataset.source, len(dataset.labels))
    if lens.sharded:    # the workers hold the records; the driver keeps none of them
        lens.images = lens.labels = dataset = None
    try:
        return _train_lens(config, output_dir, plan, facts, lens, store, root_seed, seeded,
                           started, progress=progress, log=log,
                           checkpoint_every=checkpoint_every, hook=hook)
    finally:
        if lens.sharded:
            lens.teachers.close()


def _check_shards(store: CheckpointStore, shards: int) -> None:
    """Refuses to resume a run with another number of shards than it was trained with
    (0: in-process): its teachers' checkpoints are cut by shard."""
    latest = store.latest()
    if latest is None:
        return
    saved = int(latest.state.get("shards", 0))
    if saved != shards:
        def name(count: int) -> str:
            return f"--shards {count}" if count else "no --shards (in-process teachers)"
        raise RunDirError(f"{latest.path} was trained with {name(saved)}; resume it with "
                          f"{name(saved)} (not {name(shards)}), or --restart")


def _train_lens(config: DataLensConfig, output_dir: str, plan, dataset: DatasetFacts,
                lens, store,
                root_seed: int, seeded: bool, started: float, *, progress: bool,
                log: Callable[[str], None], checkpoint_every: int, hook: FaultHook
                ) -> RunSummary:
    """The body of :func:`train_run` once ``lens`` exists."""
    import tensorflow as tf


    resumed_from, finished = None, False
    if plan.mode is Mode.FRESH:
        journal, curve = _begin_fresh(plan, config, dataset, lens, root_seed), []
    else:
        journal, curve, resumed_from, finished = _resume(plan, lens, store, log)
        if not os.path.exists(plan.paths.seed):
            _write_seed(plan, root_seed, seeded)

    def on_spend(step: int, round_index: int, queries: int) -> None:
        journal.append(step, round_index, queries)
        hook("after_spend", step)

    lens.on_spend = on_spend
    votes = None
    if config.train.save_votes is not SaveVotes.NONE:
        votes = lens.observer = VoteWriter(plan.paths.root, config.train.save_votes)
        log(f"--save_vote: every round's released update goes to {votes.folder}"
            + (f"; RAW VOTE SUMS too: this run directory is PRIVATE ({RAW_VOTES_MARKER})"
               if config.train.save_votes is SaveVotes.RAW_SUMS else ""))
    log(f"{dataset.name}: {dataset.records} records, {config.train.num_teachers} "
        f"teachers x {lens.partition_size} records, batch {lens.batch}, "
        f"{lens.batch * config.train.g_step} queries per step; output in {output_dir}")
    conv = getattr(lens.ensemble, "conv_path", None)
    if conv is not None:
        log(f"teacher convolutions: {conv.value} path (oneDNN "
            f"{_on_off(machine.onednn_enabled())}; --conv_path to choose)")
    writer = _LazySummaryWriter(plan.paths.logs)
    total_steps = config.train.epochs * lens.steps_per_epoch
    expected_steps = _expected_steps(config, lens, total_steps)
    if not config.train.non_private:
        budget_steps = steps_within_budget(config, lens.batch, lens.shape.dim)
        log(f"the budget epsilon <= {config.budget.max_eps:g} allows {budget_steps} steps "
            f"({config.budget.conversion.value} conversion)"
            + (f"; the epoch cap (--epoch {config.train.epochs}) ends the run at step "
               f"{total_steps}" if total_steps < budget_steps else ""))
    bar = _progress(expected_steps, progress)
    if bar is not None and lens.step:
        bar.update(min(lens.step, expected_steps))
    stop_reason = "epochs"
    grid_every = max(1, min(50, expected_steps // 10))
    first_step = lens.step
    while lens.step < total_steps:
        try:
            record = lens.train_step()
        except BudgetExhausted:
            stop_reason = "budget"
            if votes is not None:
                votes.flush_all()
            break
        if votes is not None:
            votes.flush(record.step)
        if record.queries:
            point = {"step": record.step + 1, "queries": lens.ledger.queries,
                     "epsilon": record.epsilon}
            if record.epsilon_data_dependent_analysis is not None:
                point["epsilon_data_dependent_analysis"] = \
                    record.epsilon_data_dependent_analysis
            curve.append(point)
        export.write_json(plan.paths.privacy,
                          privacy_record(lens, config, curve, None, seeded, journal))
        _log_step(writer, record, lens, config, grid_every, bar)
        hook("after_step", lens.step)
        # Only the student's loss decides: it is a function of the generator and the
        # released updates (post-processing).  The teachers' loss is a noise-free function
        # of the private records, so neither it nor whether it is finite may choose when
        # the run stops; a diverged teacher's non-finite gradient votes as a zero gradient
        # inside the charged sensitivity (dclens.datalens.topagg.zero_nonfinite_rows).
        if not math.isfinite(record.student_loss):
            writer.flush()
            if bar is not None:
                bar.close()
            export.write_json(plan.paths.privacy, privacy_record(
                lens, config, curve, "non-finite student loss", seeded, journal))
            latest = store.latest()
            raise TrainingDiverged(
                f"step {record.step + 1}: the student's loss is not finite "
                f"({record.student_loss}); stopped. The ledger "
                f"({plan.paths.journal}, {plan.paths.privacy}) counts all "
                f"{lens.ledger.queries} queries made; the last good checkpoint is "
                f"{latest.path if latest else 'none (the start)'}; no outputs were written. "
                "Resuming would repeat the same steps: start a new run (--restart or a new "
                "--checkpoint_dir) with a smaller --learning_rate.")
        if lens.step % checkpoint_every == 0:
            _save_checkpoint(store, lens, journal, curve, finished=False, stop_reason=None,
                             hook=hook, log=log)
    if bar is not None:
        bar.close()
    writer.flush()

    epsilon = None if config.train.non_private or not lens.ledger.queries \
        else lens.ledger.epsilon().epsilon
    export.write_json(plan.paths.privacy,
                      privacy_record(lens, config, curve, stop_reason, seeded, journal))
    summary = RunSummary(lens.step, lens.ledger.queries, epsilon, stop_reason, output_dir,
                         time.perf_counter() - started, resumed_from, journal.lost_queries)
    if lens.step == first_step and finished and _outputs_exist(output_dir):
        log(f"the run in {output_dir} is already finished (stopped by {stop_reason} at step "
            f"{lens.step}); nothing to do. Pass --restart to train it again.")
        return summary
    _save_checkpoint(store, lens, journal, curve, finished=True, stop_reason=stop_reason,
                     hook=hook, log=log)
    hook("before_outputs", lens.step)
    lens.generator.save(RunPaths(output_dir).generator)
    write_sample_outputs(lens.generate, lens.shape, config, output_dir, lens.seeds,
                         epsilon=epsilon, batch=lens.batch, log=log)
    with writer.get().as_default(step=lens.step):
        tf.summary.image("samples/by_class", class_grid(
                    lens.generate, lens.shape, config.train.z_dim, lens.seeds)[None])
    writer.flush()
    spent = ("NOT PRIVATE (--non_private)" if epsilon is None and config.train.non_private
             else f"epsilon = {epsilon:.4f} at delta = {config.budget.delta:g} "
                  f"({config.budget.conversion.value} conversion)" if epsilon is not None
             else "epsilon = 0 (no query was made)")
    if epsilon is not None:
        spent += accounting.guarantee_caveats(proven=config.accounting_proven,
                                              seeded=config.train.seed is not None)
    log(f"done: {summary.steps} steps, {summary.queries} TopAgg queries, stopped by "
        f"{stop_reason}; {spent}; {summary.seconds:.0f} s. Outputs in {output_dir}")
    return summary


