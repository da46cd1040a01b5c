"""The private classifier training loop: DP-SGD (GM), TopAgg for DP-SGD, GEP / B-GEP.

One step t, on the private examples P (n of them, after the held-out images):

1. a Poisson sample S_t of P, every example independently with rate q = B / n (the
   sampler the accounting assumes; its key is (BATCH, attempt, t): a step redone after a
   crash draws a fresh sample, because the ledger counts the lost and the redone step as
   two independently sampled mechanisms, and two releases on one shared sample cost more
   than that -- :func:`batch_for`);
2. the step's event is **spent into the ledger and journaled on disk** before any noise
   exists (the write-ahead journal of :mod:`dclens.runs.journal`);
3. per-example gradients of S_t (vectorised), the method's clipping and compression,
   the sum, Gaussian noise keyed by (DP_NOISE, attempt, t), divided by B
   (:mod:`dclens.dpsgd.mechanisms`, :mod:`dclens.dpsgd.gep`);
4. SGD (with optional momentum) on the noisy gradient (post-processing).

Held out before anything: ``validation`` images (the epoch is chosen on them) and, for
GEP with ``anchor_source = held_out``, ``anchors`` images whose labels are replaced by
random ones once (the anchor gradients that span GEP's subspace are computed on them
each step; with ``noise`` the anchors are uniform-random images and no record is held
out for them).  Held-out images are used without privacy; the guarantee is for adding
or removing one of the other n examples.
The real test set is measured at every evaluation but never used to choose anything.

A run directory has the layout of :mod:`dclens.runs.rundir`: config.json, the journal
ledger.json, privacy.json, checkpoints/ (seed.json, ckpt-<step>), logs/ (TensorBoard),
model.keras and report.json.  A killed run resumes from its last checkpoint; the journal
keeps the spends of the steps it redoes (``lost``), which then draw fresh noise.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from dclens.common import export
from dclens.data import splits
from dclens.runs import rundir
from dclens.privacy import sampled_ledger
from dclens.runs.checkpoint import CheckpointStore
from dclens.runs.journal import PrivacyJournal
from dclens.dpsgd import mechanisms
from dclens.dpsgd.private_step import Classifier, NoisyGradient
from dclens.dpsgd.config import (CHANGEABLE_ON_RESUME, DpsgdConfig, dataset_records,
                                 learning_rate_selection)
from dclens.common.rng import SeedTree, Stream
from dclens.evaluation import evaluate
from dclens.common.progress import progress_bar

FaultHook = Callable[[str, int], None]


@dataclasses.dataclass(frozen=True)
class Split:
    """The training split cut into private examples and what is held out of them."""

    private_images: np.ndarray
    private_labels: np.ndarray
    validation_images: np.ndarray
    validation_labels: np.ndarray
    anchor_images: np.ndarray
    anchor_labels: np.ndarray     # random labels (GEP), drawn once


def split_records(images: np.ndarray, labels: np.ndarray, config: DpsgdConfig,
                  seeds: SeedTree, num_classes: int) -> Split:
    """Disjoint private / validation / anchor index sets from one keyed permutation."""
    config.check_data(len(labels))
    order = seeds.numpy(Stream.DATA_SPLIT).permutation(len(labels))
    validation = order[:config.validation]
    private = np.sort(order[config.held_out:])
    count = config.anchors if config.method.is_gep else 0
    random_labels = seeds.numpy(Stream.ANCHOR_LABELS).integers(0, num_classes, count)
    if config.holds_out_anchors:
        anchor_images = images[order[config.validation:config.held_out]]
    else:       # data-independent anchors: uniform noise images from the run's own keys
        anchor_images = seeds.numpy(Stream.ANCHOR_IMAGES).uniform(
            size=(count, *images.shape[1:])).astype(images.dtype)
    return Split(images[private], labels[private], images[validation], labels[validation],
                 anchor_images, random_labels.astype(np.int64))


def steps_for(config: DpsgdConfig, private: int) -> int:
    """Training steps: round(epochs * n / B), at least 1."""
    return max(1, round(config.epochs * private / config.batch_size))


def noise_multiplier_for(config: DpsgdConfig, private: int) -> float:
    """sigma: the given one, or the smallest that keeps all steps within target_eps."""
    if config.sigma is not None:
        return config.sigma
    return sampled_ledger.calibrate_noise_multiplier(
        target_epsilon=config.target_eps, rate=config.batch_size / private,
        steps=steps_for(config, private), delta=config.delta, releases=config.releases,
        conversion=config.conversion)


def batch_for(seeds: SeedTree, *, step: int, attempt: int, private: int,
              rate: float) -> np.ndarray:
    """Indices of step ``step``'s Poisson sample, keyed by (BATCH, attempt, step).

    The attempt is in the key for privacy, not luck: after a crash the journal keeps the
    lost step's spend and the redone step spends again, and the accountant composes the
    two as independently subsampled mechanisms.  Replaying the lost step's sample would
    make them two Gaussians on one sample, whose amplified cost is larger than the sum of
    two independently sampled ones (the ledger would under-count).
    """
    return mechanisms.poisson_batch(seeds.numpy(Stream.BATCH, attempt, step), private, rate)


#: The unit of privacy of a DP-SGD / GEP run, in words (privacy.json's ``adjacency``).
ADJACENCY = ("add or remove one example of the private split, with n public: the "
             "held-out split and n are fixed and published")


def guarantee_statement(n: int, held_out: int) -> str:
    """What a run's epsilon covers, precisely (privacy.json's ``guarantee``).

    The sampling rate q = B / n, the step count and a calibrated sigma are computed from n,
    the number of private examples, and n is published; the split into private and
    held-out examples is a keyed permutation of the whole training set.  So the epsilon is
    that of the mechanism M_n run with the parameters of this n, between two private sets
    that differ by adding or removing one example, with the held-out images fixed; n itself
    is released exactly, and the held-out images are used without privacy.
    """
    return (f"epsilon bounds the mechanism run with the parameters of n = {n} (sampling "
            f"rate q = B / n, the step count and a calibrated sigma all follow from n) on "
            f"two private sets that differ by adding or removing one example, the held-out "
            f"split fixed. Not protected: n itself (published here), and the {held_out} "
            f"held-out images, which are "
            f"used without privacy.")


def chosen_index(curves: list[dict]) -> int:
    """The evaluation the headline reports: best held-out validation accuracy, the
    earliest of equals (never the test set)."""
    return max(range(len(curves)), key=lambda i: (curves[i]["validation"], -i))


def _no_hook(point: str, step: int) -> None:
    del point, step


@dataclasses.dataclass
class _Setup:
    """A run before its first step: its folder, keys, split, model and mechanism."""

    run: rundir.OpenedRun           # the run directory: paths, resuming?, root seed
    seeds: SeedTree
    dataset_source: str
    test: object                    # the real test set (measured, never used to choose)
    split: Split
    rate: float                     # q = B / n
    total_steps: int
    steps_per_epoch: int
    sigma: float
    model: Classifier
    mechanism: NoisyGradient
    step_event: object              # the dp_accounting event one step spends
    facts: dict

    @property
    def n(self) -> int:
        """The number of private examples."""
        return len(self.split.private_labels)


def _set_up(config: DpsgdConfig, run_dir: str, *, restart: bool,
            log: Callable[[str], None]) -> _Setup:
    opened = rundir.open_run(config, run_dir, kind="dpsgd", restart=restart,
                             changeable=CHANGEABLE_ON_RESUME, log=log)
    seeds = SeedTree(opened.root_seed)
    records = dataset_records(config)
    # A screening run (tuning records) is scored on the tuning holdout, never the test set.
    test_set = (evaluate.TUNING_HOLDOUT
                if config.training_records is splits.TrainingRecords.TUNING else evaluate.TEST)
    test = evaluate.load_test(config.dataset, config.data_dir, test_set=test_set)
    spec = records.spec
    split = split_records(records.images, records.labels, config, seeds, spec.num_classes)
    n = len(split.private_labels)
    rate = config.batch_size / n
    total_steps = steps_for(config, n)
    steps_per_epoch = max(1, round(n / config.batch_size))
    sigma = noise_multiplier_for(config, n)
    model = Classifier(config, spec.image_shape, spec.num_classes, seeds.integer(Stream.MODEL_INIT))
    mechanism = NoisyGradient(config, sigma, model, split.anchor_images, split.anchor_labels,
                              seeds)
    facts = {"private_examples": n, "held_out": {"validation": config.validation,
             "anchors": config.anchors if config.holds_out_anchors else 0},
             "anchor_source": config.anchor_source if config.method.is_gep else None,
             "sampling_rate": rate, "planned_steps": total_steps, "sigma": sigma,
             "sigma_from": "given" if config.sigma is not None else
             f"calibrated to epsilon {config.target_eps} in {total_steps} steps",
             "parameters": model.num_params, "steps_per_epoch": steps_per_epoch}
    if config.training_records is not splits.TrainingRecords.ALL:   # the paper's: unsaid
        facts.update(training_records=config.training_records.value, test=test.source)
    return _Setup(opened, seeds, records.source, test, split, rate, total_steps,
                  steps_per_epoch, sigma, model, mechanism, mechanism.event(rate), facts)


@dataclasses.dataclass
class _Progress:
    """Where a call starts: step, the evaluations so far, whether the run had finished."""

    journal: PrivacyJournal
    start: int = 0
    curves: list = dataclasses.field(default_factory=list)
    already_finished: bool = False


def _open_journal(config: DpsgdConfig, setup: _Setup, store: CheckpointStore,
                  log: Callable[[str], None]) -> _Progress:
    """A fresh run's files and empty ledger, or a resumed run's journal and checkpoint."""
    paths = setup.run.paths
    if not setup.run.resuming:
        return _Progress(rundir.create_run_files(
            paths, config.to_dict(), kind="dpsgd", root_seed=setup.run.root_seed,
            seeded=config.seed is not None,
            facts={"dataset_source": setup.dataset_source, **setup.facts},
            ledger=sampled_ledger.SampledGaussianLedger(delta=config.delta,
                                                        conversion=config.conversion)))
    journal = rundir.open_journal(paths, store.latest())
    restored = rundir.restore_latest(
        store, journal, root_seed=setup.run.root_seed, seed_path=paths.seed,
        load=lambda checkpoint: setup.model.load(checkpoint.load_array))
    if restored.state:
        setup.model.load_chosen(restored.state.get("chosen_step"))
    lost = restored.lost
    log(f"resuming at step {restored.start}; the ledger counts {journal.queries} steps"
        + (f", {len(lost)} of them lost in the crash (still counted)" if lost else ""))
    return _Progress(journal, restored.start, restored.curves, restored.finished)


class _Training:
    """The steps of one call: sample, spend and journal, noisy gradient, SGD; evaluate on
    the held-out validation set (and the test set, reported only) every ``eval_every``."""

    def __init__(self, config: DpsgdConfig, setup: _Setup, opened: _Progress,
                 store: CheckpointStore, *, progress: bool, hook: FaultHook):
        import tensorflow as tf

        self.config, self.setup, self.store, self.hook = config, setup, store, hook
        self.journal, self.curves = opened.journal, opened.curves
        self.attempt = len(self.journal.lost)  # a resume that lost spends draws fresh noise
        self.eval_every = config.eval_every or setup.steps_per_epoch
        self.writer = tf.summary.create_file_writer(setup.run.paths.logs)
        self.progress = progress
        self.bar = None

    def save_checkpoint(self, step: int, finished: bool) -> None:
        model = self.setup.model
        self.store.save(step, model.state_arrays(),
                        {"root_seed": self.setup.run.root_seed, "curves": self.curves,
                         "journal_entries": len(self.journal.entries), "finished": finished,
                         "ledger": self.journal.ledger.state_dict(),
                         "chosen_step": model.chosen_step},
                        before_commit=lambda: self.hook("checkpoint_before_commit", step))

    def evaluate_now(self, step: int) -> None:
        import tensorflow as tf

        model, split, test = self.setup.model, self.setup.split, self.setup.test
        point = {"step": step, "epoch": step / self.setup.steps_per_epoch,
                 "validation": model.accuracy(split.validation_images, split.validation_labels),
                 "test": model.accuracy(test.images, test.labels),
                 "epsilon": self.journal.ledger.epsilon().epsilon}
        self.curves.append(point)
        if chosen_index(self.curves) == len(self.curves) - 1:
            model.remember_chosen(step)
        with self.writer.as_default(step=step):
            for key in ("validation", "test", "epsilon"):
                tf.summary.scalar(f"dpsgd/{key}", point[key])
        self.writer.flush()
        if self.bar is not None:
            self.bar.set_postfix(val=f"{point['validation']:.3f}",
                                 eps=f"{point['epsilon']:.3f}")

    def run(self, start: int, already_finished: bool) -> tuple[str, int]:
        """Steps ``start`` .. the end; returns why they stopped ("steps" or "budget") and
        the step count the run finished at.  Evaluates and checkpoints the last step."""
        config, setup = self.config, self.setup
        total_steps, ledger, budget = setup.total_steps, self.journal.ledger, config.target_eps
        if self.progress:
            self.bar = progress_bar(total_steps, initial=start, unit="step",
                                    desc=config.method.value)
        stop_reason, step = "steps", start
        for step in range(start, 0 if already_finished else total_steps):
            if budget is not None and \
                    ledger.epsilon_after_event(setup.step_event).epsilon > budget * (1 + 1e-9):
                stop_reason = "budget"
                break
            self._step(step)
        else:
            step = start if already_finished else total_steps
        finished_steps = step if stop_reason == "budget" else max(step, start)
        if not self.curves or self.curves[-1]["step"] != finished_steps:
            self.evaluate_now(finished_steps)
        if not already_finished:
            self.save_checkpoint(finished_steps, True)
        if self.bar is not None:
            self.bar.close()
        return stop_reason, finished_steps

    def _step(self, step: int) -> None:
        config, setup, model = self.config, self.setup, self.setup.model
        batch = batch_for(setup.seeds, step=step, attempt=self.attempt, private=setup.n,
                          rate=setup.rate)
        self.journal.ledger.spend(setup.step_event)
        self.journal.append(step, 0, 1)          # durable before the noise exists
        self.hook("after_spend", step)
        per_example = model.per_example(setup.split.private_images[batch],
                                        setup.split.private_labels[batch])
        model.apply(setup.mechanism.noisy_gradient(per_example, step=step,
                                                   attempt=self.attempt),
                    config.learning_rate_at(step, setup.total_steps))
        done = step + 1
        self.hook("after_step", done)
        if self.bar is not None:
            self.bar.update(1)
        if done % self.eval_every == 0 or done == setup.total_steps:
            self.evaluate_now(done)
        if done % config.checkpoint_every == 0 and done < setup.total_steps:
            self.save_checkpoint(done, False)


def _privacy_record(config: DpsgdConfig, setup: _Setup, journal: PrivacyJournal,
                    stop_reason: str) -> dict:
    """``privacy.json``: epsilon, the unit it protects, and every step spent."""
    ledger, n = journal.ledger, setup.n
    return {"epsilon": ledger.epsilon().to_dict(), "delta": config.delta,
            "adjacency": ADJACENCY,
            "guarantee": guarantee_statement(n, config.held_out),
            "unit": f"one of the {n} private training examples (the {config.held_out} "
                    f"held-out images are used without privacy)",
            "hyperparameter_selection": learning_rate_selection(config),
            **setup.facts,
            # Every step spent, the redone steps of a crashed run included.
            "steps": ledger.queries, "lost_steps": journal.lost_queries,
            "reproducible_noise": config.seed is not None, "stop_reason": stop_reason,
            "event_per_step": repr(setup.step_event)}


def _save_chosen_model(model: Classifier, curves: list[dict], finished_steps: int,
                       path: str) -> int:
    """Writes ``model.keras`` with the chosen evaluation's weights when they were kept (a
    run resumed from a checkpoint older than the choice has only the final ones); returns
    the step whose weights it holds."""
    chosen = chosen_index(curves)
    saved_step = finished_steps
    if model.chosen is not None and model.chosen_step == curves[chosen]["step"]:
        model.use_chosen()               # model.keras holds what the headline measures
        saved_step = model.chosen_step
    with export.atomic_path(path) as temporary:
        model.keras.save(temporary)
    return saved_step


def _accuracy_record(curves: list[dict], saved_step: int) -> dict:
    chosen = chosen_index(curves)
    saved = next(point for point in reversed(curves) if point["step"] == saved_step)
    return {"test_at_chosen": curves[chosen]["test"],
            "chosen_step": curves[chosen]["step"],
            "chosen_epoch": curves[chosen]["epoch"],
            "validation_at_chosen": curves[chosen]["validation"],
            "test_final": curves[-1]["test"],
            "selection": "the evaluation with the best held-out validation "
                         "accuracy (never the test set)",
            # What model.keras holds: the chosen weights, unless the run resumed
            # from a checkpoint older than this field that predates the choice.
            "saved_model_step": saved_step,
            "test_of_saved_model": saved["test"]}


def train_private_classifier(config: DpsgdConfig, run_dir: str, *, restart: bool = False,
                             progress: bool = True, log: Callable[[str], None] = print,
                             hook: FaultHook = _no_hook) -> dict:
    """Trains (or resumes) a private classifier in ``run_dir``; returns report.json's dict.

    ``hook(point, step)`` is called at fault-injection points ("after_spend",
    "after_step", "checkpoint_before_commit") for crash tests.
    """
    started = time.perf_counter()
    setup = _set_up(config, run_dir, restart=restart, log=log)
    store = CheckpointStore(setup.run.paths.checkpoints)
    opened = _open_journal(config, setup, store, log)
    log(f"{config.method.value}: {setup.n} private examples (+{config.held_out} held out, "
        f"used without privacy), q = {setup.rate:.5f}, {setup.total_steps} steps, sigma = "
        f"{setup.sigma:.4f} ({setup.facts['sigma_from']}), {setup.model.num_params} "
        f"parameters")
    training = _Training(config, setup, opened, store, progress=progress, hook=hook)
    stop_reason, finished_steps = training.run(opened.start, opened.already_finished)
    privacy = _privacy_record(config, setup, opened.journal, stop_reason)
    export.write_json(setup.run.paths.privacy, privacy)
    curves = training.curves
    saved_step = _save_chosen_model(setup.model, curves, finished_steps, setup.run.paths.model)
    report = {
        "method": config.method.value, "dataset": config.dataset,
        "accuracy": _accuracy_record(curves, saved_step),
        "privacy": privacy, "config": config.to_dict(), "curves": curves,
        "seconds_this_call": time.perf_counter() - started,
    }
    export.write_json(setup.run.paths.report, report)
    accuracy = report["accuracy"]
    log(f"{config.method.value}: test accuracy {accuracy['test_at_chosen']:.4f} at "
        f"step {accuracy['chosen_step']} (chosen on validation; final "
        f"{accuracy['test_final']:.4f}), epsilon {privacy['epsilon']['epsilon']:.4f} at "
        f"delta {config.delta:g} ({privacy['adjacency']}); model.keras holds the weights of "
        f"step {saved_step}")
    return report
