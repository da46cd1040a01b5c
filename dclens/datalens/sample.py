"""Rendering a DataLens generator: G(z, y) without touching its batch-norm statistics,
and sampling it in batches (the authors' ``gen_data``)."""

from __future__ import annotations

from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from dclens.common.rng import SeedTree, Stream
from dclens.datalens import networks


def generator_function(generator: keras.Model, trainable: list | None = None
                       ) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """G(z, one-hot y) as a tf.function, with batch statistics (as the authors run G), that
    leaves the generator's batch-norm moving mean and variance as they were.

    Privacy: a Keras ``BatchNormalization`` called with ``training=True`` also moves its
    moving statistics (momentum 0.9) towards the batch's, and those statistics are saved
    in the published ``generator.keras``.  Rendered on a teacher's *private* label
    sequence (``teacher_labels``) they would carry a noise-free function of those labels
    (the last teachers' sequences of the last step) into the published model, outside the
    ledger.  ``stateless_call`` computes the same output (bit-equal) and its updated
    statistics are dropped, so no render can move them, whatever its labels; only the
    student's update pass (on data-independent query labels) does.

    ``trainable``: other values for the generator's trainable variables, in their order
    (e.g. a moving average of them); None renders the generator's own.
    """
    weights = generator.trainable_variables if trainable is None else trainable

    def render(z, y):
        images, _ = generator.stateless_call(weights,
                                             generator.non_trainable_variables, [z, y],
                                             training=True)
        return images
    return tf.function(render, reduce_retracing=True)


def sample_generator(generate: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
                     shape: networks.ImageShape, z_dim: int,
                     num_samples: int, *, seeds: SeedTree, seed_path: tuple[int, ...] = (),
                     batch: int = 30, labels: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Samples ``generate`` (see :func:`generator_function`) in batches of ``batch``.

    Labels are uniform over the classes unless given; z ~ U(-1, 1).
    """
    rng = seeds.numpy(Stream.SAMPLES, *seed_path)
    if labels is None:
        labels = rng.integers(0, shape.num_classes, size=num_samples)
    latent = rng.uniform(-1.0, 1.0, size=(num_samples, z_dim)).astype(np.float32)
    images = np.empty((num_samples, shape.height, shape.width, shape.channels), np.float32)
    for start in range(0, num_samples, batch):
        stop = min(start + batch, num_samples)
        y = tf.one_hot(labels[start:stop], shape.num_classes)
        images[start:stop] = generate(tf.constant(latent[start:stop]), y).numpy()
    return images, labels.astype(np.int64)
