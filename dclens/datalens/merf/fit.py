"""Fitting a generator to a released mean embedding (post-processing of the release).

Each step draws a batch of b latents z ~ U(-1, 1) with b / C of each class c, and takes an
Adam step on

    L = || M~ / n - (1 / b) sum_j phi(G(z_j, y_j)) e_{y_j}^T ||_F^2,

whose minimum puts (1 / C) of the mean feature of class c's images at column c of the
released mean embedding M~ / n (the data's (n_c / n) mu_c: exact when the classes are
balanced, as in MNIST and Fashion-MNIST, and assumed otherwise: the class counts are
private).  The loss reads only the release, the generator and its own draws.
"""

from __future__ import annotations

from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from dclens.datalens.merf.features import FourierFeatures


def embedding_loss(features: FourierFeatures, target: tf.Tensor, images: tf.Tensor,
                   one_hot: tf.Tensor) -> tf.Tensor:
    """|| target - (1 / b) phi(images)^T one_hot ||_F^2 for a batch of b images."""
    phi = features.tensor(images)
    batch = tf.cast(tf.shape(images)[0], tf.float32)
    generated = tf.matmul(phi, one_hot, transpose_a=True) / batch
    return tf.reduce_sum(tf.square(target - generated))


def fit_generator(generator: keras.Model, features: FourierFeatures, mean_embedding: np.ndarray,
                  *, steps: int, batch: int, learning_rate: float, beta1: float,
                  rng: np.random.Generator, log: Callable[[str], None] = print,
                  log_every: int = 250) -> list[float]:
    """``steps`` Adam steps of :func:`embedding_loss` on ``generator`` (inputs [z, one-hot
    label]); ``mean_embedding`` is M~ / n, [D, C].  Returns the loss of every step."""
    dim, num_classes = mean_embedding.shape
    if dim != features.dim:
        raise ValueError(f"the embedding has {dim} features, the features {features.dim}")
    if batch % num_classes:
        raise ValueError(f"batch {batch} is not a multiple of the {num_classes} classes")
    z_dim = generator.inputs[0].shape[-1]
    target = tf.constant(mean_embedding, tf.float32)
    labels = tf.one_hot(np.repeat(np.arange(num_classes), batch // num_classes), num_classes)
    optimizer = keras.optimizers.Adam(learning_rate, beta_1=beta1)

    @tf.function
    def step(latent):
        with tf.GradientTape() as tape:
            images = generator([latent, labels], training=True)
            loss = embedding_loss(features, target, images, labels)
        gradients = tape.gradient(loss, generator.trainable_variables)
        optimizer.apply_gradients(zip(gradients, generator.trainable_variables))
        return loss

    losses = []
    for index in range(steps):
        latent = rng.uniform(-1.0, 1.0, size=(batch, z_dim)).astype(np.float32)
        losses.append(float(step(tf.constant(latent))))
        if (index + 1) % log_every == 0 or index + 1 == steps:
            log(f"fit step {index + 1}/{steps}: loss {losses[-1]:.6g}")
    return losses
