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
import gc
import json
import math
import os
import time
from typing import Callable

from dclens.common import machine
from dclens.privacy import accounting
from dclens.common import export
from dclens.runs.checkpoint import CheckpointSpaceError, CheckpointStore
from dclens.datalens import class_direction, resume, sharded
from dclens.datalens import warm_start as warm_start_lib
from dclens.datalens.budget import (DATA_DEPENDENT_PARTITION_WARNING, NOT_PRIVATE_WARNING,
                                    REPRODUCIBLE_NOISE_WARNING, UNPROVEN_ACCOUNTING_WARNING,
                                    check_budget_allows_a_step, expected_steps, privacy_record,
                                    steps_within_budget)
from dclens.datalens.build import bank_location, image_shape_of, load_training_data
from dclens.datalens.config import DataLensConfig, SaveVotes
from dclens.datalens.outputs import (RAW_VOTES_MARKER, VoteWriter, class_grid,
                                     write_sample_outputs)
from dclens.datalens.shards import plan_shards
from dclens.datalens.step_log import LazySummaryWriter, log_step, new_progress_bar, on_off
from dclens.datalens.train import BudgetExhausted, DataLens, TeacherPlacement, check_query_batch
from dclens.runs.journal import PrivacyJournal
from dclens.runs.rundir import (Mode, RunDirError, RunPaths, complete_run_files,
                                create_run_files, open_journal, plan_run, read_run_record,
                                read_saved_config, restore_latest,
                                root_seed as _saved_or_new_seed, set_aside)

__all__ = ["RunDirError", "RunPaused", "RunSummary", "TrainingDiverged", "train_run"]

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


class RunPaused(KeyboardInterrupt):
    """The run stopped between two steps because ``should_stop()`` asked it to, after a
    checkpoint of the step it had reached (unless the disk had no room for one: the
    warning says so), so that the same call resumes it with no spend lost.  A
    ``KeyboardInterrupt``, so that code that handles Ctrl-C handles it alike."""

    def __init__(self, step: int):
        super().__init__(f"paused at step {step}")
        self.step = step


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


def _never() -> bool:
    return False


def _no_hook(point: str, step: int) -> None:
    del point, step


def _root_seed(plan, config: DataLensConfig) -> int:
    """The run's root seed: saved (resume), else --seed, else fresh OS entropy."""
    return _saved_or_new_seed(plan, config.train.seed)


def _begin_fresh(plan, config: DataLensConfig, dataset: "DatasetFacts", lens,
                 root_seed: int) -> PrivacyJournal:
    """A new run's files (:func:`dclens.runs.rundir.create_run_files`); its journal."""
    seeded = config.train.seed is not None
    return create_run_files(
        plan.paths, config.to_dict(), kind="DataLens", root_seed=root_seed, seeded=seeded,
        facts={"dataset_source": dataset.source, "records": dataset.records,
               "partition_size": lens.partition_size, "batch": lens.batch,
               "query_batch": lens.query_batch,
               "steps_per_epoch": lens.steps_per_epoch, "seed_from_os_entropy": not seeded,
               "private": not config.train.non_private,
               **({} if lens.warm_start is None
                  else {"warm_start": lens.warm_start.fingerprint()})},
        ledger=lens.ledger)


#: The journal's round number of a warm start's spends (before step 0's rounds).
WARM_START_ROUND = -1


def _journal_warm_start(lens, journal: PrivacyJournal, config: DataLensConfig,
                        log: Callable[[str], None]) -> None:
    """The spends of the DP-MERF run a run starts from (``train.warm_start``) head its
    ledger, journaled as round -1 of step 0 (:mod:`dclens.datalens.warm_start`), before
    any TopAgg spend.  A fresh run spends them here; so does a resumed run whose journal
    is still empty (a crash between the journal's first write and this spend).  A resumed
    journal that holds them is left alone (never spent twice); one that holds other spends
    but not these is refused: its ledger would not count the release the generator
    started from.

    Raises:
      RunDirError: the journal's warm-start round is missing or counts other queries.
    """
    warm = lens.warm_start
    if warm is None or config.train.non_private:
        return
    journaled = [spend for spend in journal.entries if spend.round == WARM_START_ROUND]
    if journaled:
        if sum(spend.queries for spend in journaled) != warm.queries:
            raise RunDirError(
                f"{journal.path} journals {sum(s.queries for s in journaled)} warm-start "
                f"queries but the DP-MERF run {warm.path} spent {warm.queries}: the ledger "
                f"would not match the release; start this run over (--restart)")
        return
    if journal.entries:
        raise RunDirError(
            f"{journal.path} holds {len(journal.entries)} spends but not the warm start's "
            f"(round {WARM_START_ROUND}): its ledger does not count the DP-MERF release "
            f"{warm.path} the generator started from, so it cannot be resumed; start it "
            f"over (--restart)")
    for event in warm.events():
        lens.ledger.spend(event)
    journal.append(0, WARM_START_ROUND, warm.queries)
    log(f"warm start: the generator fitted by the DP-MERF run {warm.path}; its "
        f"release is in this run's ledger (epsilon {lens.ledger.epsilon().epsilon:.4g} "
        f"before the first step)")


def _check_warm_start_unchanged(plan, lens, log: Callable[[str], None]) -> None:
    """A resumed warm-started run refuses a DP-MERF folder whose release, generator or
    spends differ from the fingerprint config.json recorded when the run began."""
    if lens.warm_start is None:
        return
    try:
        warning = warm_start_lib.check_unchanged(
            read_run_record(plan.paths).get("warm_start"), lens.warm_start)
    except warm_start_lib.WarmStartError as error:
        raise RunDirError(str(error)) from None
    if warning:
        log(f"warning: {warning}")


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

    # The warm start's spends (round -1, first in the journal) released a DP-MERF run's
    # outputs, which a crash here does not lose.
    warm = 0
    while warm < len(journal.entries) and journal.entries[warm].round == WARM_START_ROUND:
        warm += 1
    restored = restore_latest(store, journal, root_seed=lens.root_seed,
                              seed_path=plan.paths.seed, load=load, curve_key="curve",
                              not_lost=warm)
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
                     log: Callable[[str], None]) -> bool:
    """Writes a checkpoint of ``lens``; returns False (after a warning) where the disk had
    no room for it."""
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
        return False
    hook("after_checkpoint", lens.step)
    return True


def _output_bytes(config: DataLensConfig, shape) -> int:
    """A generous estimate of what a finished run writes after its final checkpoint: the
    samples twice (samples.npz and the authors' pickles, float32) plus 256 MiB for the
    generator, samples.png and the file system's slack."""
    return 2 * config.train.num_samples * shape.dim * 4 + (256 << 20)


def outputs_complete(output_dir: str) -> bool:
    """Whether a run directory holds every output a finished run writes: the generator,
    samples.npz and samples.png, written in that order after the final checkpoint (with
    the authors' pickles between the last two), so a crash while writing them (a full
    disk, say) leaves this False and :func:`train_run` writes them again on resume."""
    paths = RunPaths(output_dir)
    return all(os.path.exists(path) for path in (paths.generator, paths.samples, paths.grid))


def _finished_summary(plan, config: DataLensConfig, started: float) -> RunSummary | None:
    """The summary of a finished run that this command would not extend, else None.

    Read from the small records only (config.json, the newest checkpoint's state.json,
    ledger.json): no data set, teacher state or TensorFlow.  A command with more epochs or
    a larger budget than the saved run may extend it, so it gets None (the full path).
    """
    if plan.mode is not Mode.RESUME or not outputs_complete(plan.paths.root) \
            or not os.path.exists(plan.paths.journal):
        return None
    latest = CheckpointStore(plan.paths.checkpoints).latest()
    if latest is not None:
        if not latest.state.get("finished"):
            return None
        step, stop_reason = latest.step, latest.state.get("stop_reason") or "epochs"
    else:
        # A finished run whose checkpoints/ the user removed to free the disk (the
        # outputs are complete, so the final checkpoint had been written before them):
        # its privacy record says where it stopped.
        record = _final_privacy_record(plan.paths.privacy)
        if record is None:
            return None
        step, stop_reason = record
    saved = DataLensConfig.from_dict(read_saved_config(plan.paths))
    if (config.train.epochs > saved.train.epochs
            or config.budget.max_eps > saved.budget.max_eps):
        return None
    journal = PrivacyJournal.load(plan.paths.journal)
    epsilon = (None if config.train.non_private or not journal.queries
               else journal.ledger.epsilon().epsilon)
    return RunSummary(step, journal.queries, epsilon, stop_reason, plan.paths.root,
                      time.perf_counter() - started, step, journal.lost_queries)


def _final_privacy_record(path: str) -> tuple[int, str] | None:
    """(steps, stop reason) from a finished run's privacy.json, else None (missing,
    unreadable, or written before the run stopped)."""
    try:
        with open(path, encoding="utf-8") as stream:
            record = json.load(stream)
        steps, stop_reason = record["steps"], record["stop_reason"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not stop_reason or isinstance(steps, bool) or not isinstance(steps, int):
        return None
    return steps, stop_reason


def train_run(config: DataLensConfig, output_dir: str, *, progress: bool = True,
              log: Callable[[str], None] = print, restart: bool = False,
              checkpoint_every: int = 10, fault_hook: FaultHook | None = None,
              shards: int | None = None, ray_address: str | None = None,
              shard_backend: str = "ray",
              should_stop: Callable[[], bool] | None = None) -> RunSummary:
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
      should_stop: read before every step; once it returns True the run checkpoints the
        step it has reached (if that is not checkpointed yet) and raises
        :class:`RunPaused`.  The command-line tools pass a
        :class:`dclens.cli.graceful_stop.GracefulStop` (the first Ctrl-C or SIGTERM).

    Raises:
      RunDirError: the directory cannot be used (nothing is changed).
      TrainingDiverged: a loss became NaN/inf; the ledger and the last good checkpoint are
        kept and the outputs are not written.
      RunPaused: ``should_stop()`` returned True; the same call resumes the run.
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
    _warn_about_the_guarantee(config, log)
    if shards is not None:      # a bad --shards is refused before the data load
        plan_shards(config.train.num_teachers, shards, config.train.teacher_chunk)
    dataset = load_training_data(config)
    shape = image_shape_of(dataset.spec)        # before anything is written:
    batch = min(config.train.batch_size, len(dataset.labels) // config.train.num_teachers)
    if batch >= 1:      # an empty partition is refused by DataLens, by name
        batch = check_query_batch(config.train.query_batch, batch)
    check_budget_allows_a_step(config, batch, shape.dim)
    plan = plan_datalens_run(config, output_dir, restart=restart)  # another may have begun
    root_seed = _root_seed(plan, config)
    if plan.set_aside:      # before the bank, which may be created inside the directory
        moved = set_aside(plan.paths.root)
        log(f"--restart: the previous run was moved to {moved} (nothing deleted)")
    store = CheckpointStore(plan.paths.checkpoints)
    if plan.mode is not Mode.FRESH:        # refuse another shard count before starting any
        _check_shards(store, shards or 0)
    lens = _new_lens(config, dataset, plan, root_seed, log=log, shards=shards,
                     ray_address=ray_address, shard_backend=shard_backend)
    facts = DatasetFacts(dataset.spec.name, dataset.source, len(dataset.labels))
    if lens.sharded:    # the workers hold the records; the driver keeps none of them
        lens.images = lens.labels = dataset = None
    try:
        training = _Training(config, output_dir, plan, lens, store, seeded=seeded, log=log,
                             checkpoint_every=checkpoint_every, hook=hook,
                             should_stop=should_stop or _never)
        training.open(facts, root_seed)
        first_step = lens.step
        summary = training.finish(training.run(progress), first_step, started)
    finally:
        if lens.sharded:
            lens.teachers.close()
    # The DataLens sits in reference cycles (its compiled functions refer back to it), so
    # it would outlive this call until Python's next full collection; at the paper scale
    # its teachers' resident tier is up to half the RAM, which the caller's next step (a
    # reproduction's evaluation, a second run) would otherwise share the machine with.
    del training, lens, dataset
    gc.collect()
    return summary


def _warn_about_the_guarantee(config: DataLensConfig, log: Callable[[str], None]) -> None:
    """Says, before any work, when the run's epsilon will not be a guarantee."""
    if not config.topagg.accounting_proven:
        log("warning: " + UNPROVEN_ACCOUNTING_WARNING)
    if config.train.balanced_partition and not config.train.non_private:
        log("warning: " + DATA_DEPENDENT_PARTITION_WARNING)
    if config.train.non_private:
        log(NOT_PRIVATE_WARNING)
    elif config.train.seed is not None:
        log("warning: " + REPRODUCIBLE_NOISE_WARNING)


def _new_lens(config: DataLensConfig, dataset, plan, root_seed: int, *,
              log: Callable[[str], None], shards: int | None, ray_address: str | None,
              shard_backend: str) -> DataLens:
    """The DataLens object, its teachers in this process or in ``shards`` workers, its bank
    (a bank larger than half the RAM lives on disk inside the run, streamed by chunk)."""
    shard_options = None
    if shards is not None:
        shard_options = sharded.ShardOptions(shards, plan.paths.checkpoints,
                                             backend=shard_backend, ray_address=ray_address)
        log(f"starting {shards} shard worker(s) ({shard_backend}"
            + (f", Ray at {ray_address}" if ray_address else "") + ")")
    return DataLens(config, dataset, root_seed=root_seed, placement=TeacherPlacement(
        launch_teachers=None if shard_options is None else sharded.launcher(shard_options),
        bank_dir=bank_location(config, plan.paths.bank)))


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


class _Training:
    """The generator steps of one call of :func:`train_run`, once ``lens`` exists: every
    spend journaled before its noise, released values logged, checkpoints, and a stop on
    the budget, the epoch cap or a non-finite student loss."""

    def __init__(self, config: DataLensConfig, output_dir: str, plan, lens, store, *,
                 seeded: bool, log: Callable[[str], None], checkpoint_every: int,
                 hook: FaultHook, should_stop: Callable[[], bool]):
        self.config, self.output_dir, self.plan, self.lens = config, output_dir, plan, lens
        self.store, self.seeded, self.log, self.hook = store, seeded, log, hook
        self.checkpoint_every, self.should_stop = checkpoint_every, should_stop
        self.checkpointed_step: int | None = None   # the step the newest checkpoint holds
        self.writer = LazySummaryWriter(plan.paths.logs)
        self.votes: VoteWriter | None = None
        self.journal: PrivacyJournal | None = None
        self.curve: list[dict] = []
        self.resumed_from: int | None = None
        self.finished = False           # the run had finished before this call
        self.bar = None

    def open(self, dataset: DatasetFacts, root_seed: int) -> None:
        """The journal (fresh or resumed), the spend hook, --save_vote, and the log lines
        that say what the run is."""
        config, plan, lens, log = self.config, self.plan, self.lens, self.log
        if plan.mode is Mode.FRESH:
            self.journal = _begin_fresh(plan, config, dataset, lens, root_seed)
        else:
            _check_warm_start_unchanged(plan, lens, log)
            self.journal, self.curve, self.resumed_from, self.finished = _resume(
                plan, lens, self.store, log)
            self.checkpointed_step = self.resumed_from
            complete_run_files(plan.paths, kind="DataLens", root_seed=root_seed,
                               seeded=self.seeded)
        _journal_warm_start(lens, self.journal, config, log)
        journal, hook = self.journal, self.hook

        def on_spend(step: int, round_index: int, queries: int) -> None:
            journal.append(step, round_index, queries)
            hook("after_spend", step)

        lens.on_spend = on_spend
        if config.train.save_votes is not SaveVotes.NONE:
            self.votes = lens.observer = VoteWriter(plan.paths.root, config.train.save_votes)
            log(f"--save_vote: every round's released update goes to {self.votes.folder}"
                + (f"; RAW VOTE SUMS too: this run directory is PRIVATE ({RAW_VOTES_MARKER})"
                   if config.train.save_votes is SaveVotes.RAW_SUMS else ""))
        if config.train.class_direction_every:
            every = config.train.class_direction_every
            if lens.sharded:
                raise ValueError("class_direction_every reads every teacher's weights in "
                                 "this process: run it without --shards")
            lens.observer = class_direction.ClassDirectionLog(
                [lens], plan.paths.root, every, inner=lens.observer)
            log(f"class direction: every {every} steps into "
                f"{lens.observer.path} (a diagnostic of the teachers; screening runs only)")
        log(f"{dataset.name}: {dataset.records} records, {config.train.num_teachers} "
            f"teachers x {lens.partition_size} records, batch {lens.batch}, "
            f"{lens.query_batch * config.train.g_step} queries per step; output in "
            f"{self.output_dir}")
        conv = getattr(lens.ensemble, "conv_path", None)
        if conv is not None:
            log(f"teacher convolutions: {conv.value} path (oneDNN "
                f"{on_off(machine.onednn_enabled())}; --conv_path to choose)")

    def run(self, progress: bool) -> str:
        """Steps until the epoch cap or the budget; returns the stop reason."""
        config, lens = self.config, self.lens
        total_steps = config.train.epochs * lens.steps_per_epoch
        expected = expected_steps(config, lens, total_steps)
        if not config.train.non_private:
            budget_steps = steps_within_budget(config, lens.query_batch, lens.shape.dim)
            self.log(f"the budget epsilon <= {config.budget.max_eps:g} allows {budget_steps} "
                     f"steps ({config.budget.conversion.value} conversion)"
                     + (f"; the epoch cap (--epoch {config.train.epochs}) ends the run at "
                        f"step {total_steps}" if total_steps < budget_steps else ""))
        self.bar = new_progress_bar(expected, progress, initial=min(lens.step, expected))
        grid_every = max(1, min(50, expected // 10))
        stop_reason = "epochs"
        while lens.step < total_steps:
            if self.should_stop():
                self._pause()
            try:
                record = lens.train_step()
            except BudgetExhausted:
                stop_reason = "budget"
                if self.votes is not None:
                    self.votes.flush_all()
                break
            self._after_step(record, grid_every)
        if self.bar is not None:
            self.bar.close()
        self.writer.flush()
        return stop_reason

    def _after_step(self, record, grid_every: int) -> None:
        config, lens = self.config, self.lens
        if self.votes is not None:
            self.votes.flush(record.step)
        if record.queries:
            point = {"step": record.step + 1, "queries": lens.ledger.queries,
                     "epsilon": record.epsilon}
            if record.epsilon_data_dependent_analysis is not None:
                point["epsilon_data_dependent_analysis"] = \
                    record.epsilon_data_dependent_analysis
            self.curve.append(point)
        self._write_privacy(None)
        log_step(self.writer, record, lens, config, grid_every, self.bar)
        self.hook("after_step", lens.step)
        # Only the student's loss decides: it is a function of the generator and the
        # released updates (post-processing).  The teachers' loss is a noise-free function
        # of the private records, so neither it nor whether it is finite may choose when
        # the run stops; a diverged teacher's non-finite gradient votes as a zero gradient
        # inside the charged sensitivity (dclens.datalens.topagg.zero_nonfinite_rows).
        if not math.isfinite(record.student_loss):
            self._stop_diverged(record)
        if lens.step % self.checkpoint_every == 0:
            self._save_checkpoint(finished=False, stop_reason=None)

    def _write_privacy(self, stop_reason: str | None) -> None:
        export.write_json(self.plan.paths.privacy, privacy_record(
            self.lens, self.config, self.curve, stop_reason, self.seeded, self.journal))

    def _save_checkpoint(self, *, finished: bool, stop_reason: str | None) -> None:
        if _save_checkpoint(self.store, self.lens, self.journal, self.curve,
                            finished=finished, stop_reason=stop_reason, hook=self.hook,
                            log=self.log):
            self.checkpointed_step = self.lens.step

    def _pause(self) -> None:
        """Checkpoints the step reached (nothing to redo on resume) and stops.  At step 0
        nothing was spent by TopAgg (a warm start's release lives in its DP-MERF run), so a
        resume from the start loses nothing either."""
        lens = self.lens
        if lens.step and self.checkpointed_step != lens.step:
            self._save_checkpoint(finished=False, stop_reason=None)
        self.writer.flush()
        if self.bar is not None:
            self.bar.close()
        raise RunPaused(lens.step)

    def _stop_diverged(self, record) -> None:
        self.writer.flush()
        if self.bar is not None:
            self.bar.close()
        self._write_privacy("non-finite student loss")
        latest, paths = self.store.latest(), self.plan.paths
        raise TrainingDiverged(
            f"step {record.step + 1}: the student's loss is not finite "
            f"({record.student_loss}); stopped. The ledger "
            f"({paths.journal}, {paths.privacy}) counts all "
            f"{self.lens.ledger.queries} queries made; the last good checkpoint is "
            f"{latest.path if latest else 'none (the start)'}; no outputs were written. "
            "Resuming would repeat the same steps: start a new run (--restart or a new "
            "--checkpoint_dir) with a smaller --learning_rate.")

    def finish(self, stop_reason: str, first_step: int, started: float) -> RunSummary:
        """The final privacy record and checkpoint, then the outputs (generator, samples,
        grids), unless the run had finished before this call."""
        import tensorflow as tf

        config, lens, output_dir, log = self.config, self.lens, self.output_dir, self.log
        epsilon = None if config.train.non_private or not lens.ledger.queries \
            else lens.ledger.epsilon().epsilon
        self._write_privacy(stop_reason)
        summary = RunSummary(lens.step, lens.ledger.queries, epsilon, stop_reason, output_dir,
                             time.perf_counter() - started, self.resumed_from,
                             self.journal.lost_queries)
        if lens.step == first_step and self.finished and outputs_complete(output_dir):
            log(f"the run in {output_dir} is already finished (stopped by {stop_reason} at "
                f"step {lens.step}); nothing to do. Pass --restart to train it again.")
            return summary
        self._save_checkpoint(finished=True, stop_reason=stop_reason)
        freed = self.store.make_room_beside_latest(_output_bytes(config, lens.shape))
        if freed:
            log(f"removed {len(freed)} older checkpoint(s) to make room for the outputs; "
                f"the final one stays")
        self.hook("before_outputs", lens.step)
        lens.released_generator().save(RunPaths(output_dir).generator)
        write_sample_outputs(lens.generate_released, lens.shape, config, output_dir,
                             lens.seeds, epsilon=epsilon, batch=lens.batch, log=log)
        with self.writer.get().as_default(step=lens.step):
            tf.summary.image("samples/by_class", class_grid(
                lens.generate_released, lens.shape, config.train.z_dim, lens.seeds)[None])
        self.writer.flush()
        warm = (0 if lens.warm_start is None or config.train.non_private
                else lens.warm_start.queries)
        queries = (f"{summary.queries} TopAgg queries" if not warm else
                   f"{summary.queries - warm} TopAgg queries after the warm start's "
                   f"{warm} release(s)")
        log(f"done: {summary.steps} steps, {queries}, stopped by "
            f"{stop_reason}; {_spent(config, epsilon)}; {summary.seconds:.0f} s. Outputs in "
            f"{output_dir}")
        return summary


def _spent(config: DataLensConfig, epsilon: float | None) -> str:
    """The closing line's account of the privacy spent, with the guarantee's caveats."""
    spent = ("NOT PRIVATE (--non_private)" if epsilon is None and config.train.non_private
             else f"epsilon = {epsilon:.4f} at delta = {config.budget.delta:g} "
                  f"({config.budget.conversion.value} conversion)" if epsilon is not None
             else "epsilon = 0 (no query was made)")
    if epsilon is not None:
        spent += accounting.guarantee_caveats(proven=config.accounting_proven,
                                              seeded=config.train.seed is not None)
    return spent
