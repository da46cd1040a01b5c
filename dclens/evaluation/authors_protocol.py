"""The authors' MNIST / Fashion-MNIST evaluation protocol, with its exact semantics.

Their script (``evaluation/train-classifier-fmnist.py``; the MNIST one is the same) does:

1. ``data = np.zeros((100000, 794))``, then copies the rows of the first ``--range``
   pickles (default **1**; 10,000 rows each) to the top; every other row stays zero: a
   black image with an **all-zero label**.
2. Trains the CNN of :mod:`dclens.evaluation.classifiers` with plain SGD (lr 2e-3, no momentum),
   categorical cross-entropy, batch 512, 600 epochs, ``shuffle=True``, and after every
   epoch measures the real test set (``validation_data``).
3. Prints the **maximum** test accuracy over the 600 epochs (test-set selection).

A zero row's categorical cross-entropy -sum_c y_c log p_c is exactly 0, so it adds
nothing to a gradient -- but every batch's loss is the *mean* over its 512 rows, so the
zero rows scale each step down (with ``--range 1``, about 51 real rows per batch).

:func:`train_authors_protocol` reproduces this with two interchangeable paths:

* ``literal``: the 100,000-row array, batches of 512 rows including the zero rows, one
  step per call;
* the fast path (default): per batch only its real rows are computed, and their summed
  loss is divided by the batch's full length (512; the last batch 100000 mod 512 = 160),
  which is the same gradient with none of the zero rows' work; an epoch's steps run in
  one graph (no Python between steps).

Both draw the epoch's shuffle from one seeded generator and the same dropout masks for the
real rows (a zero row's mask cannot matter: its loss is 0 whatever the network outputs),
so they follow the same trajectory up to float32 summation order (tested).  Keras' own
shuffle and dropout draws of the authors' run cannot be reproduced; the protocol's
semantics are.  The reported number is theirs: the best test accuracy over all epochs.

600 epochs take from tens of minutes (``--range 1``) to hours (``--range 10``) on a small
CPU, so the loop saves its state (weights, shuffle generator, curves) atomically to an npz
and resumes from it on the same trajectory.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import numpy as np

from dclens.evaluation import classifiers, epoch_state
from dclens import data

#: Keras' clipping of probabilities inside categorical cross-entropy.
KERAS_EPSILON = 1e-7
DROPOUT_RATES = (0.2, 0.25)


@dataclasses.dataclass(frozen=True)
class AuthorsProtocol:
    """The settings of the authors' evaluation script (defaults: theirs)."""

    range: int = 1                  # pickles read (``--range``)
    rows_per_pickle: int = 10_000
    rows: int = 100_000             # rows of their zero-initialised array
    batch_size: int = 512
    epochs: int = 600
    learning_rate: float = 2e-3

    def __post_init__(self) -> None:
        for name in ("range", "rows_per_pickle", "rows", "batch_size", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.range * self.rows_per_pickle > self.rows:
            raise ValueError(f"--range {self.range} x {self.rows_per_pickle} rows exceeds the "
                             f"{self.rows} rows of the authors' array")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")

    @property
    def real_rows(self) -> int:
        return self.range * self.rows_per_pickle

    @property
    def is_authors(self) -> bool:
        """Whether these are the script's own settings (any --range)."""
        return self == AuthorsProtocol(range=self.range)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "real_rows": self.real_rows}


def authors_rows(synthetic: data.LabeledImages, protocol: AuthorsProtocol
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The real rows their script reads: the first ``range`` pickles' worth of samples
    (our samples are written to the pickles in order), as images and one-hot labels."""
    count = protocol.real_rows
    if len(synthetic) < count:
        raise ValueError(f"--range {protocol.range} reads {count} samples but only "
                         f"{len(synthetic)} are given")
    one_hot = np.eye(synthetic.spec.num_classes, dtype=np.float32)[synthetic.labels[:count]]
    return synthetic.images[:count].astype(np.float32), one_hot


class _Trainer:
    """The CNN with explicit dropout masks, plain SGD on sum(CE) / batch length.

    Two ways to run an epoch's steps, the same arithmetic:

    * :meth:`step`: one batch per call (the literal path's reference);
    * :meth:`epoch`: every step of an epoch in one graph (``tf.while_loop``), each batch
      exactly its real rows (a ragged slice of the epoch's row list; no padding: padding
      every batch to the epoch's largest count of about 75 real rows cost a third more
      work than the mean of about 51). A zero row of the literal array adds exactly
      nothing to the gradient, so leaving it out changes only the summation order.
    """

    def __init__(self, image_shape, num_classes: int, protocol: AuthorsProtocol, seed: int):
        import tensorflow as tf

        self.tf = tf
        self.model = classifiers.build_classifier(image_shape, num_classes, seed=seed)
        self.layers = {layer.name: layer for layer in self.model.layers}
        self.variables = self.model.trainable_variables
        self.learning_rate = protocol.learning_rate
        probe = self.layers["pool"](self.layers["conv1"](tf.zeros((1, *image_shape))))
        after = self.layers["conv2"](probe)
        self.mask_shapes = (tuple(probe.shape[1:]), tuple(after.shape[1:]))
        self._step = tf.function(self._step_impl, reduce_retracing=True)
        pixels = tf.TensorSpec((None, *image_shape), tf.float32)
        self._epoch = tf.function(self._epoch_impl, input_signature=[
            pixels, tf.TensorSpec((None, num_classes), tf.float32),
            tf.TensorSpec((None,), tf.int32), tf.TensorSpec((None,), tf.int32),
            tf.TensorSpec((None,), tf.float32), tf.TensorSpec((None, 2), tf.int64)])
        self._predict = tf.function(lambda x: self.model(x, training=False),
                                    input_signature=[pixels])

    def _forward(self, x, masks):
        tf, layer = self.tf, self.layers
        h = layer["pool"](layer["conv1"](x))
        h = h * masks[0] / (1.0 - DROPOUT_RATES[0])
        h = layer["conv2"](h)
        h = h * masks[1] / (1.0 - DROPOUT_RATES[1])
        h = layer[classifiers.FEATURE_LAYER](layer["flatten"](h))
        return tf.clip_by_value(layer["output"](h), KERAS_EPSILON, 1.0 - KERAS_EPSILON)

    def _loss(self, x, y, masks, batch_length):
        """sum_rows CE(row) / batch_length: the batch's mean loss in the literal array,
        whose zero rows have CE exactly 0."""
        tf = self.tf
        p = self._forward(x, masks)
        ce = -tf.reduce_sum(y * tf.math.log(p), axis=1)
        return tf.reduce_sum(ce) / batch_length

    def _sgd(self, tape, loss):
        for variable, grad in zip(self.variables, tape.gradient(loss, self.variables)):
            variable.assign_sub(self.learning_rate * grad)
        return loss

    def _step_impl(self, x, y, mask0, mask1, batch_length):
        with self.tf.GradientTape() as tape:
            loss = self._loss(x, y, (mask0, mask1), batch_length)
        return self._sgd(tape, loss)

    def _draw_masks(self, count, seed):
        tf = self.tf
        out = []
        for i, (shape, rate) in enumerate(zip(self.mask_shapes, DROPOUT_RATES)):
            u = tf.random.stateless_uniform(
                tf.concat([[count], shape], 0),
                seed=tf.stack([seed[0], seed[1] * 2 + i]))
            out.append(tf.cast(u >= rate, tf.float32))
        return out

    def _epoch_impl(self, images, one_hot, rows, starts, lengths, seeds):
        """Batch b is ``rows[starts[b]:starts[b + 1]]``, its loss divided by lengths[b]."""
        tf = self.tf
        losses = tf.TensorArray(tf.float32, size=tf.shape(lengths)[0])
        for b in tf.range(tf.shape(lengths)[0]):
            batch = rows[starts[b]:starts[b + 1]]
            x, y = tf.gather(images, batch), tf.gather(one_hot, batch)
            # The same draw as the literal path's masks for these rows.
            masks = self._draw_masks(tf.shape(batch)[0], seeds[b])
            with tf.GradientTape() as tape:
                loss = self._loss(x, y, masks, lengths[b])
            losses = losses.write(b, self._sgd(tape, loss))
        return losses.stack()

    def masks(self, count: int, seed: tuple[int, int]):
        """Keep-masks (1 with probability 1 - rate) of ``count`` rows for both dropouts."""
        tf = self.tf
        return self._draw_masks(tf.constant(count), tf.constant(seed, tf.int64))

    def step(self, x, y, masks, batch_length: int) -> float:
        tf = self.tf
        return float(self._step(tf.constant(x), tf.constant(y), masks[0], masks[1],
                                tf.constant(float(batch_length))))

    def test_accuracy(self, images: np.ndarray, labels: np.ndarray,
                      batch_size: int = 1000) -> float:
        """:func:`classifiers.accuracy` of the model (inference mode), in one compiled
        function instead of eager calls: the same forward pass, about half the time of the
        eager one, which ran after every one of the 600 epochs."""
        return epoch_state.accuracy(self._predict, images, labels, batch_size)

    def epoch(self, images, one_hot, batches: list["_Batch"]) -> np.ndarray:
        """Runs ``batches`` (in order) in one graph; returns their losses."""
        tf = self.tf
        rows = np.concatenate([batch.rows for batch in batches]).astype(np.int32)
        starts = np.cumsum([0] + [len(batch.rows) for batch in batches], dtype=np.int32)
        lengths = np.array([batch.length for batch in batches], np.float32)
        seeds = np.array([batch.seed for batch in batches], np.int64)
        return self._epoch(images, one_hot, tf.constant(rows), tf.constant(starts),
                           tf.constant(lengths), tf.constant(seeds)).numpy()


@dataclasses.dataclass(frozen=True)
class _Batch:
    """One SGD step of the authors' loop: its real rows (indices into the real samples),
    its length in the zero-padded array (the loss's denominator) and its dropout seed."""

    rows: np.ndarray
    length: int
    seed: tuple[int, int]


def _epoch_batches(order: np.ndarray, protocol: AuthorsProtocol, epoch: int,
                   mask_seed: int) -> list[tuple[np.ndarray, _Batch]]:
    """The epoch's batches over the shuffled ``order`` of all rows, each with its rows in
    the literal array; batches of zero rows only are left out (loss and gradient 0)."""
    out = []
    for b, start in enumerate(range(0, protocol.rows, protocol.batch_size)):
        rows = order[start:start + protocol.batch_size]
        real = rows[rows < protocol.real_rows]
        if len(real):
            out.append((rows, _Batch(real, len(rows), (mask_seed, epoch * 1_000_003 + b))))
    return out


def train_authors_protocol(synthetic: data.LabeledImages, test: data.LabeledImages,
                           protocol: AuthorsProtocol = AuthorsProtocol(), *, seed: int = 0,
                           literal: bool = False, return_weights: bool = False,
                           log: Callable[[str], None] | None = None,
                           state_path=None, save_every_seconds: float = 120.0,
                           stop_after_epochs: int | None = None) -> dict:
    """Trains as the authors' script does; returns the record (curves, best accuracy).

    ``literal``: compute the zero rows too, one batch per call (slow; the reference for
    the fast path, which runs each epoch in one graph over the real rows only).
    ``return_weights``: add the final weights (numpy) under ``"weights"``.
    ``state_path``: an npz the loop saves itself to (atomically, after an epoch, at most
    every ``save_every_seconds``, and at the end) and resumes from; a finished state
    returns its record without training. ``stop_after_epochs``: return after this many
    epochs of this call (with ``"finished": False``), to split a long run.
    """
    images, one_hot = authors_rows(synthetic, protocol)
    spec = synthetic.spec
    init_seed, order_seed, mask_seed = (int(s) for s in np.random.SeedSequence(seed)
                                        .generate_state(3, np.uint32) >> 1)
    trainer = _Trainer(spec.image_shape, spec.num_classes, protocol, init_seed)
    rng = np.random.default_rng(order_seed)
    state = epoch_state.EpochState(state_path, {
        "settings": protocol.to_dict(), "seed": seed, "literal": literal,
        "samples": epoch_state.samples_fingerprint(images, one_hot),
        "test": epoch_state.samples_fingerprint(test.images, test.labels)},
        "an authors-protocol run")
    curves = _resume(state, trainer, rng, state_path, log)
    if literal:
        run_epoch = _LiteralEpochs(trainer, images, one_hot, protocol, spec)
    else:
        run_epoch = _FastEpochs(trainer, images, one_hot)
    started = last_save = time.perf_counter()
    done_here = 0
    for epoch in range(len(curves["epoch"]) + 1, protocol.epochs + 1):
        if stop_after_epochs is not None and done_here >= stop_after_epochs:
            break
        epoch_started = time.perf_counter()
        losses = run_epoch(_epoch_batches(rng.permutation(protocol.rows), protocol, epoch,
                                          mask_seed))
        accuracy = trainer.test_accuracy(test.images, test.labels)
        curves["epoch"].append(epoch)
        curves["test_accuracy"].append(accuracy)
        curves["loss"].append(float(np.mean(losses)) if losses else 0.0)
        curves["seconds"].append(time.perf_counter() - epoch_started)
        done_here += 1
        if log is not None:
            log(f"authors protocol epoch {epoch}/{protocol.epochs}: test {accuracy:.4f} "
                f"(best {max(curves['test_accuracy']):.4f}, {curves['seconds'][-1]:.1f} s)")
        if (epoch == protocol.epochs
                or time.perf_counter() - last_save >= save_every_seconds):
            state.save(epoch, rng, curves, [v.numpy() for v in trainer.variables])
            last_save = time.perf_counter()
    finished = len(curves["epoch"]) == protocol.epochs
    if not finished and curves["epoch"]:
        state.save(curves["epoch"][-1], rng, curves, [v.numpy() for v in trainer.variables])
    record = _record(protocol, curves, seed=seed, literal=literal, finished=finished,
                     seconds_this_call=time.perf_counter() - started)
    if return_weights:
        record["weights"] = [v.numpy() for v in trainer.variables]
    return record


def _resume(state: epoch_state.EpochState, trainer: "_Trainer", rng: np.random.Generator,
            state_path, log: Callable[[str], None] | None) -> dict:
    """The curves so far: the saved state's (its weights and batch order restored into
    ``trainer`` and ``rng``), or empty ones."""
    meta = state.resume(trainer.variables, rng)
    if meta is None:
        return {"epoch": [], "test_accuracy": [], "loss": [], "seconds": []}
    if log is not None:
        log(f"authors protocol: resumed after epoch {meta['epoch']} from {state_path}")
    return meta["curves"]


class _FastEpochs:
    """An epoch over the real rows only, in one graph (the zero rows' terms are zero)."""

    def __init__(self, trainer: "_Trainer", images: np.ndarray, one_hot: np.ndarray):
        self.trainer = trainer
        self.images, self.labels = trainer.tf.constant(images), trainer.tf.constant(one_hot)

    def __call__(self, batches) -> list:
        if not batches:
            return []
        return list(self.trainer.epoch(self.images, self.labels,
                                       [batch for _, batch in batches]))


class _LiteralEpochs:
    """An epoch as their script runs it: every batch of the zero-padded array, the zero
    rows included, one step per call (the reference for :class:`_FastEpochs`)."""

    def __init__(self, trainer: "_Trainer", images: np.ndarray, one_hot: np.ndarray,
                 protocol: AuthorsProtocol, spec: data.DatasetSpec):
        self.trainer, self.real = trainer, protocol.real_rows
        self.full_x = np.zeros((protocol.rows, *spec.image_shape), np.float32)
        self.full_y = np.zeros((protocol.rows, spec.num_classes), np.float32)
        self.full_x[:self.real], self.full_y[:self.real] = images, one_hot

    def __call__(self, batches) -> list:
        losses = []
        for rows, batch in batches:
            is_real = rows < self.real
            masks = self.trainer.masks(len(batch.rows), batch.seed)
            full_masks = []
            for mask in masks:
                whole = np.ones((len(rows), *mask.shape[1:]), np.float32)
                whole[is_real] = mask.numpy()
                full_masks.append(self.trainer.tf.constant(whole))
            losses.append(self.trainer.step(self.full_x[rows], self.full_y[rows], full_masks,
                                            len(rows)))
        return losses


def _record(protocol: AuthorsProtocol, curves: dict, *, seed: int, literal: bool,
            finished: bool, seconds_this_call: float) -> dict:
    """The protocol's record: the best test accuracy over all epochs (their selection)."""
    best = int(np.argmax(curves["test_accuracy"])) if curves["test_accuracy"] else 0
    return {
        "accuracy": curves["test_accuracy"][best] if curves["test_accuracy"] else None,
        "epoch": best + 1,
        "finished": finished,
        "description": (f"the authors' script: the first {protocol.real_rows} samples (range "
                        f"{protocol.range}) in a {protocol.rows}-row zero array, SGD lr "
                        f"{protocol.learning_rate:g}, batch {protocol.batch_size}, "
                        f"{protocol.epochs} epochs, best test accuracy over all epochs "
                        "(selects on the test set)"),
        "settings": protocol.to_dict(),
        "authors_settings": protocol.is_authors,
        "path": "literal" if literal else "fast (zero rows skipped, one graph per epoch)",
        "seed": seed,
        "curves": curves,
        # Wall time of the whole protocol, summed over every call that ran a part of it.
        "seconds": float(sum(curves["seconds"])),
        "seconds_this_call": seconds_this_call,
    }
