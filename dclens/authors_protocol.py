"""The authors' MNIST / Fashion-MNIST evaluation protocol, with its exact semantics.

Their script (``evaluation/train-classifier-fmnist.py``; the MNIST one is the same) does:

1. ``data = np.zeros((100000, 794))``, then copies the rows of the first ``--range``
   pickles (default **1**; 10,000 rows each) to the top; every other row stays zero: a
   black image with an **all-zero label**.
2. Trains the CNN of :mod:`dclens.classifiers` with plain SGD (lr 2e-3, no momentum),
   categorical cross-entropy, batch 512, 600 epochs, ``shuffle=True``, and after every
   epoch measures the real test set (``validation_data``).
3. Prints the **maximum** test accuracy over the 600 epochs (test-set selection).

A zero row's categorical cross-entropy -sum_c y_c log p_c is exactly 0, so it adds
nothing to a gradient -- but every batch's loss is the *mean* over its 512 rows, so the
zero rows scale each step down (with ``--range 1``, about 51 real rows per batch).

:func:`train_authors_protocol` reproduces this with two interchangeable paths:

* ``literal``: the 100,000-row array, batches of 512 rows including the zero rows;
* the fast path (default): per batch only its real rows are computed, and their summed
  loss is divided by the batch's full length (512; the last batch 100000 mod 512 = 160),
  which is the same gradient with none of the zero rows' work.

Both draw the epoch's shuffle from one seeded generator and the same dropout masks for the
real rows (a zero row's mask cannot matter: its loss is 0 whatever the network outputs),
so they follow the same trajectory up to float32 summation order (tested).  Keras' own
shuffle and dropout draws of the authors' run cannot be reproduced; the protocol's
semantics are.  The reported number is theirs: the best test accuracy over all epochs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import numpy as np

from dclens import classifiers, data

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
    """The CNN with explicit dropout masks, plain SGD on sum(CE) / batch length."""

    def __init__(self, image_shape, num_classes: int, protocol: AuthorsProtocol, seed: int):
        import tensorflow as tf

        self.tf = tf
        self.model = classifiers.build_classifier(image_shape, num_classes, seed=seed)
        self.layers = {layer.name: layer for layer in self.model.layers}
        self.variables = self.model.trainable_variables
        self.learning_rate = protocol.learning_rate
        self.mask_shapes = None
        self._step = tf.function(self._step_impl, reduce_retracing=True)

    def _forward(self, x, masks):
        tf, layer = self.tf, self.layers
        h = layer["pool"](layer["conv1"](x))
        h = h * masks[0] / (1.0 - DROPOUT_RATES[0])
        h = layer["conv2"](h)
        h = h * masks[1] / (1.0 - DROPOUT_RATES[1])
        h = layer[classifiers.FEATURE_LAYER](layer["flatten"](h))
        return tf.clip_by_value(layer["output"](h), KERAS_EPSILON, 1.0 - KERAS_EPSILON)

    def _step_impl(self, x, y, mask0, mask1, batch_length):
        tf = self.tf
        with tf.GradientTape() as tape:
            p = self._forward(x, (mask0, mask1))
            loss = tf.reduce_sum(-tf.reduce_sum(y * tf.math.log(p), axis=1)) / batch_length
        for variable, grad in zip(self.variables, tape.gradient(loss, self.variables)):
            variable.assign_sub(self.learning_rate * grad)
        return loss

    def masks(self, count: int, seed: tuple[int, int]):
        """Keep-masks (1 with probability 1 - rate) of ``count`` rows for both dropouts."""
        tf = self.tf
        if self.mask_shapes is None:
            probe = self.layers["pool"](self.layers["conv1"](tf.zeros((1, *self.model.input_shape[1:]))))
            after = self.layers["conv2"](probe)
            self.mask_shapes = (tuple(probe.shape[1:]), tuple(after.shape[1:]))
        out = []
        for i, (shape, rate) in enumerate(zip(self.mask_shapes, DROPOUT_RATES)):
            u = tf.random.stateless_uniform((count, *shape), seed=[seed[0], seed[1] * 2 + i])
            out.append(tf.cast(u >= rate, tf.float32))
        return out

    def step(self, x, y, masks, batch_length: int) -> float:
        tf = self.tf
        return float(self._step(tf.constant(x), tf.constant(y), masks[0], masks[1],
                                tf.constant(float(batch_length))))


def train_authors_protocol(synthetic: data.LabeledImages, test: data.LabeledImages,
                           protocol: AuthorsProtocol = AuthorsProtocol(), *, seed: int = 0,
                           literal: bool = False, return_weights: bool = False,
                           log: Callable[[str], None] | None = None) -> dict:
    """Trains as the authors' script does; returns the record (curves, best accuracy).

    ``literal``: compute the zero rows too (slow; the reference for the fast path).
    ``return_weights``: add the final weights (numpy) under ``"weights"``.
    """
    images, one_hot = authors_rows(synthetic, protocol)
    spec = synthetic.spec
    init_seed, order_seed, mask_seed = (int(s) for s in np.random.SeedSequence(seed)
                                        .generate_state(3, np.uint32) >> 1)
    trainer = _Trainer(spec.image_shape, spec.num_classes, protocol, init_seed)
    rng = np.random.default_rng(order_seed)
    real = protocol.real_rows
    if literal:
        full_x = np.zeros((protocol.rows, *spec.image_shape), np.float32)
        full_y = np.zeros((protocol.rows, spec.num_classes), np.float32)
        full_x[:real], full_y[:real] = images, one_hot
    curves = {"epoch": [], "test_accuracy": [], "loss": [], "seconds": []}
    started = time.perf_counter()
    for epoch in range(1, protocol.epochs + 1):
        epoch_started = time.perf_counter()
        order = rng.permutation(protocol.rows)
        losses = []
        for b, start in enumerate(range(0, protocol.rows, protocol.batch_size)):
            rows = order[start:start + protocol.batch_size]
            is_real = rows < real
            count = int(is_real.sum())
            if count == 0:
                continue                 # a batch of zero rows: loss and gradient 0
            masks = trainer.masks(count, (mask_seed, epoch * 1_000_003 + b))
            if literal:
                full_masks = []
                for mask in masks:
                    whole = np.ones((len(rows), *mask.shape[1:]), np.float32)
                    whole[is_real] = mask.numpy()
                    full_masks.append(trainer.tf.constant(whole))
                losses.append(trainer.step(full_x[rows], full_y[rows], full_masks, len(rows)))
            else:
                chosen = rows[is_real]
                losses.append(trainer.step(images[chosen], one_hot[chosen], masks, len(rows)))
        accuracy = classifiers.accuracy(trainer.model, test.images, test.labels)
        curves["epoch"].append(epoch)
        curves["test_accuracy"].append(accuracy)
        curves["loss"].append(float(np.mean(losses)) if losses else 0.0)
        curves["seconds"].append(time.perf_counter() - epoch_started)
        if log is not None:
            log(f"authors protocol epoch {epoch}/{protocol.epochs}: test {accuracy:.4f} "
                f"(best {max(curves['test_accuracy']):.4f}, {curves['seconds'][-1]:.1f} s)")
    best = int(np.argmax(curves["test_accuracy"]))
    record = {
        "accuracy": curves["test_accuracy"][best],
        "epoch": best + 1,
        "description": (f"the authors' script: the first {real} samples (range "
                        f"{protocol.range}) in a {protocol.rows}-row zero array, SGD lr "
                        f"{protocol.learning_rate:g}, batch {protocol.batch_size}, "
                        f"{protocol.epochs} epochs, best test accuracy over all epochs "
                        "(selects on the test set)"),
        "settings": protocol.to_dict(),
        "authors_settings": protocol.is_authors,
        "path": "literal" if literal else "fast (zero rows skipped)",
        "seed": seed,
        "curves": curves,
        "seconds": time.perf_counter() - started,
    }
    if return_weights:
        record["weights"] = [v.numpy() for v in trainer.variables]
    return record
