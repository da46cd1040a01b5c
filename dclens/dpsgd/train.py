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
from dclens.runs import rundir
from dclens.privacy import sampled_ledger
from dclens.runs.checkpoint import CheckpointStore
from dclens.dpsgd import gep as gep_lib
from dclens.dpsgd import mechanisms, models, per_example
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


class _Model:
    """The classifier, its flat-gradient plumbing and SGD with momentum (explicit state)."""

    def __init__(self, config: DpsgdConfig, image_shape, num_classes: int, seed: int):
        import tensorflow as tf

        self.tf = tf
        self.keras = models.sample_convnet(image_shape, num_classes, seed=seed,
                                           activation=config.activation)
        self.variables = self.keras.trainable_variables
        self.sizes = [int(np.prod(v.shape)) for v in self.variables]
        self.num_params = sum(self.sizes)
        self.velocity = np.zeros(self.num_params, np.float32)
        self.momentum = config.momentum
        #: The weights at the validation-chosen evaluation and its step (model.keras).
        self.chosen: list[np.ndarray] | None = None
        self.chosen_step: int | None = None
        pixels = tf.TensorSpec((None, *image_shape), tf.float32)
        self._per_example = tf.function(self._per_example_impl, input_signature=[
            pixels, tf.TensorSpec((None,), tf.int64)])

    def _loss(self, labels, logits):
        """Cross-entropy of each example (the model outputs logits)."""
        return self.tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)

    def _per_example_impl(self, images, labels):
        return per_example.per_example_gradients(self.keras, self._loss, images, labels)

    def per_example(self, images: np.ndarray, labels: np.ndarray):
        """[B, P] per-example gradients ([0, P] for an empty sample)."""
        tf = self.tf
        if len(labels) == 0:
            return tf.zeros((0, self.num_params), tf.float32)
        return self._per_example(tf.constant(images), tf.constant(labels, tf.int64))

    def apply(self, gradient: np.ndarray, learning_rate: float) -> None:
        """velocity = momentum * velocity + g; w -= learning_rate * velocity."""
        self.velocity = self.momentum * self.velocity + np.asarray(gradient, np.float32)
        start = 0
        for variable, size in zip(self.variables, self.sizes):
            piece = self.velocity[start:start + size].reshape(variable.shape)
            variable.assign_sub(learning_rate * piece)
            start += size

    def accuracy(self, images: np.ndarray, labels: np.ndarray, batch: int = 2000) -> float:
        if len(labels) == 0:
            return float("nan")
        hits = 0
        for start in range(0, len(labels), batch):
            logits = self.keras(images[start:start + batch], training=False)
            hits += int(np.sum(np.argmax(np.asarray(logits), axis=1)
                               == labels[start:start + batch]))
        return hits / len(labels)

    def remember_chosen(self, step: int) -> None:
        """Keeps a copy of the current weights as the validation-chosen ones."""
        self.chosen = [v.numpy().copy() for v in self.variables]
        self.chosen_step = step

    def use_chosen(self) -> None:
        """Sets the variables to the remembered chosen weights."""
        for variable, value in zip(self.variables, self.chosen):
            variable.assign(value)

    def state_arrays(self) -> dict[str, np.ndarray]:
        arrays = {f"w{i}": v.numpy() for i, v in enumerate(self.variables)}
        arrays["velocity"] = self.velocity
        if self.chosen is not None:
            arrays.update({f"chosen_w{i}": w for i, w in enumerate(self.chosen)})
        return arrays

    def load(self, load_array) -> None:
        """Restores the weights and momentum (with the checkpoint's ``load_array``)."""
        for i, variable in enumerate(self.variables):
            variable.assign(load_array(f"w{i}"))
        self.velocity = np.array(load_array("velocity"), np.float32)
        self._load_array = load_array

    def load_chosen(self, chosen_step: int | None) -> None:
        """After :meth:`load`: the chosen weights that checkpoint saved at ``chosen_step``
        (None: it saved none, as checkpoints before 2026-11-25)."""
        if chosen_step is not None:
            self.chosen = [np.array(self._load_array(f"chosen_w{i}"))
                           for i in range(len(self.variables))]
            self.chosen_step = chosen_step


class _Mechanism:
    """The method's noisy gradient of one step, and the event it spends."""

    def __init__(self, config: DpsgdConfig, sigma: float, model: _Model, split: Split,
                 seeds: SeedTree):
        self.config, self.model, self.split, self.seeds = config, model, split, seeds
        if config.method.is_gep:
            self.gep = gep_lib.Gep(clip_embedding=config.clip_embedding,
                                   clip_residual=config.clip_residual, sigma=sigma,
                                   residual=config.method is mechanisms.Method.GEP)
            self.groups = gep_lib.group_sizes(model.num_params, config.num_groups)
        else:
            self.clipping = mechanisms.PrivateAggregation(
                method=config.method, clip=config.clip, sigma=sigma, topk=config.topk)

    def event(self, rate: float):
        if self.config.method.is_gep:
            return self.gep.event(rate)
        return self.clipping.event(rate)

    def noisy_gradient(self, per_example, *, step: int, attempt: int) -> np.ndarray:
        tf, config = self.model.tf, self.config
        expected = float(config.batch_size)
        if not config.method.is_gep:
            noise = tf.random.stateless_normal(
                (self.model.num_params,), seed=self.seeds.tf_seed(Stream.DP_NOISE, attempt,
                                                                   step, 0))
            return self.clipping.aggregate(per_example, expected_batch=expected,
                                           noise=noise).numpy()
        anchor_grads = self.model.per_example(self.split.anchor_images,
                                              self.split.anchor_labels)
        bases = gep_lib.anchor_bases(anchor_grads, self.groups, config.num_bases,
                                     rng=self.seeds.numpy(Stream.ANCHOR_BASIS, step))
        k = sum(b.shape[1] for b in bases)
        noise_embedding = tf.random.stateless_normal(
            (k,), seed=self.seeds.tf_seed(Stream.DP_NOISE, attempt, step, 0))
        noise_residual = tf.random.stateless_normal(
            (self.model.num_params,), seed=self.seeds.tf_seed(Stream.DP_NOISE, attempt, step, 1))
        return self.gep.aggregate(per_example, bases, expected_batch=expected,
                                  noise_embedding=noise_embedding,
                                  noise_residual=noise_residual).numpy()


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


def train_private_classifier(config: DpsgdConfig, run_dir: str, *, restart: bool = False,
                             progress: bool = True, log: Callable[[str], None] = print,
                             hook: FaultHook = _no_hook) -> dict:
    """Trains (or resumes) a private classifier in ``run_dir``; returns report.json's dict.

    ``hook(point, step)`` is called at fault-injection points ("after_spend",
    "after_step", "checkpoint_before_commit") for crash tests.
    """
    import tensorflow as tf


    started = time.perf_counter()
    opened = rundir.open_run(config, run_dir, kind="dpsgd", restart=restart,
                             changeable=CHANGEABLE_ON_RESUME, log=log)
    paths, resuming, root_seed = opened.paths, opened.resuming, opened.root_seed
    seeds = SeedTree(root_seed)
    records = dataset_records(config)
    test = evaluate.load_test(config.dataset, config.data_dir)
    spec = records.spec
    split = split_records(records.images, records.labels, config, seeds, spec.num_classes)
    n = len(split.private_labels)
    rate = config.batch_size / n
    total_steps = steps_for(config, n)
    steps_per_epoch = max(1, round(n / config.batch_size))
    eval_every = config.eval_every or steps_per_epoch
    sigma = noise_multiplier_for(config, n)
    model = _Model(config, spec.image_shape, spec.num_classes, seeds.integer(Stream.MODEL_INIT))
    mechanism = _Mechanism(config, sigma, model, split, seeds)
    step_event = mechanism.event(rate)
    facts = {"private_examples": n, "held_out": {"validation": config.validation,
             "anchors": config.anchors if config.holds_out_anchors else 0},
             "anchor_source": config.anchor_source if config.method.is_gep else None,
             "sampling_rate": rate, "planned_steps": total_steps, "sigma": sigma,
             "sigma_from": "given" if config.sigma is not None else
             f"calibrated to epsilon {config.target_eps} in {total_steps} steps",
             "parameters": model.num_params, "steps_per_epoch": steps_per_epoch}
    store = CheckpointStore(paths.checkpoints)
    if not resuming:
        journal = rundir.create_run_files(
            paths, config.to_dict(), kind="dpsgd", root_seed=root_seed,
            seeded=config.seed is not None, facts={"dataset_source": records.source, **facts},
            ledger=sampled_ledger.SampledGaussianLedger(delta=config.delta,
                                                        conversion=config.conversion))
        start, curves, already_finished = 0, [], False
    else:
        journal = rundir.open_journal(paths, store.latest())
        restored = rundir.restore_latest(
            store, journal, root_seed=root_seed, seed_path=paths.seed,
            load=lambda checkpoint: model.load(checkpoint.load_array))
        start, curves, already_finished = restored.start, restored.curves, restored.finished
        if restored.state:
            model.load_chosen(restored.state.get("chosen_step"))
        lost = restored.lost
        log(f"resuming at step {start}; the ledger counts {journal.queries} steps"
            + (f", {len(lost)} of them lost in the crash (still counted)" if lost else ""))
    ledger = journal.ledger
    attempt = len(journal.lost)          # a resume that lost spends draws fresh noise
    budget = config.target_eps
    log(f"{config.method.value}: {n} private examples (+{config.held_out} held out, used "
        f"without privacy), q = {rate:.5f}, {total_steps} steps, sigma = {sigma:.4f} "
        f"({facts['sigma_from']}), {model.num_params} parameters")
    writer = tf.summary.create_file_writer(paths.logs)
    bar = None
    if progress:
        bar = progress_bar(total_steps, initial=start, unit="step", desc=config.method.value)
    stop_reason = "steps"

    def save_checkpoint(step: int, finished: bool) -> None:
        store.save(step, model.state_arrays(),
                   {"root_seed": root_seed, "curves": curves,
                    "journal_entries": len(journal.entries), "finished": finished,
                    "ledger": ledger.state_dict(), "chosen_step": model.chosen_step},
                   before_commit=lambda: hook("checkpoint_before_commit", step))

    def evaluate_now(step: int) -> None:
        point = {"step": step, "epoch": step / steps_per_epoch,
                 "validation": model.accuracy(split.validation_images, split.validation_labels),
                 "test": model.accuracy(test.images, test.labels),
                 "epsilon": ledger.epsilon().epsilon}
        curves.append(point)
        if chosen_index(curves) == len(curves) - 1:
            model.remember_chosen(step)
        with writer.as_default(step=step):
            for key in ("validation", "test", "epsilon"):
                tf.summary.scalar(f"dpsgd/{key}", point[key])
        writer.flush()
        if bar is not None:
            bar.set_postfix(val=f"{point['validation']:.3f}", eps=f"{point['epsilon']:.3f}")

    step = start
    for step in range(start, 0 if already_finished else total_steps):
        if budget is not None and ledger.epsilon_after_event(step_event).epsilon > budget * (1 + 1e-9):
            stop_reason = "budget"
            break
        batch = batch_for(seeds, step=step, attempt=attempt, private=n, rate=rate)
        ledger.spend(step_event)
        journal.append(step, 0, 1)          # durable before the noise exists
        hook("after_spend", step)
        per_example = model.per_example(split.private_images[batch],
                                        split.private_labels[batch])
        model.apply(mechanism.noisy_gradient(per_example, step=step, attempt=attempt),
                    config.learning_rate_at(step, total_steps))
        done = step + 1
        hook("after_step", done)
        if bar is not None:
            bar.update(1)
        if done % eval_every == 0 or done == total_steps:
            evaluate_now(done)
        if done % config.checkpoint_every == 0 and done < total_steps:
            save_checkpoint(done, False)
    else:
        step = start if already_finished else total_steps
    finished_steps = step if stop_reason == "budget" else max(step, start)
    if not curves or curves[-1]["step"] != finished_steps:
        evaluate_now(finished_steps)
    if not already_finished:
        save_checkpoint(finished_steps, True)
    if bar is not None:
        bar.close()
    epsilon = ledger.epsilon()
    privacy = {"epsilon": epsilon.to_dict(), "delta": config.delta,
               "adjacency": ADJACENCY,
               "guarantee": guarantee_statement(n, config.held_out),
               "unit": f"one of the {n} private training examples (the {config.held_out} "
                       f"held-out images are used without privacy)",
               "hyperparameter_selection": learning_rate_selection(config),
               **facts,
               # Every step spent, the redone steps of a crashed run included.
               "steps": ledger.queries, "lost_steps": journal.lost_queries,
               "reproducible_noise": config.seed is not None, "stop_reason": stop_reason,
               "event_per_step": repr(step_event)}
    export.write_json(paths.privacy, privacy)
    chosen = chosen_index(curves)
    saved_step = finished_steps
    if model.chosen is not None and model.chosen_step == curves[chosen]["step"]:
        model.use_chosen()               # model.keras holds what the headline measures
        saved_step = model.chosen_step
    with export.atomic_path(paths.model) as temporary:
        model.keras.save(temporary)
    saved = next(point for point in reversed(curves) if point["step"] == saved_step)
    report = {
        "method": config.method.value, "dataset": config.dataset,
        "accuracy": {"test_at_chosen": curves[chosen]["test"],
                     "chosen_step": curves[chosen]["step"],
                     "chosen_epoch": curves[chosen]["epoch"],
                     "validation_at_chosen": curves[chosen]["validation"],
                     "test_final": curves[-1]["test"],
                     "selection": "the evaluation with the best held-out validation "
                                  "accuracy (never the test set)",
                     # What model.keras holds: the chosen weights, unless the run resumed
                     # from a checkpoint older than this field that predates the choice.
                     "saved_model_step": saved_step,
                     "test_of_saved_model": saved["test"]},
        "privacy": privacy, "config": config.to_dict(), "curves": curves,
        "seconds_this_call": time.perf_counter() - started,
    }
    export.write_json(paths.report, report)
    log(f"{config.method.value}: test accuracy {report['accuracy']['test_at_chosen']:.4f} at "
        f"step {report['accuracy']['chosen_step']} (chosen on validation; final "
        f"{report['accuracy']['test_final']:.4f}), epsilon {epsilon.epsilon:.4f} at delta "
        f"{config.delta:g} ({privacy['adjacency']}); model.keras holds the weights of step "
        f"{saved_step}")
    return report
