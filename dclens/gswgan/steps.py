"""GS-WGAN's training steps: the gradient sanitizer, the WGAN-GP critic step, the
generator steps (private and warm-start), Adam with explicit state, and the EMA.

The sanitizer (Chen et al. 2020, eq. 10-11; the released code's main.py)
-------------------------------------------------------------------------
The generator update needs D only through g_j = d(-D(x_j, y_j)) / d x_j, the gradient of
the critic w.r.t. each generated image x_j = G(z_j, y_j) (j = 1..B).  The sanitizer
releases, for every j,

    g~_j = g_j * min(1, C / ||g_j||_2) + 2 C sigma * N(0, I),

and the generator gradient is (1/B) sum_j J_G(z_j, y_j)^T g~_j, post-processing of the
release (G's Jacobian does not touch private data).  Under replacing one discriminator
(the unit of GS-WGAN's analysis: one shard), each clipped g_j can change by at most 2C
in L2, so each release is a Gaussian mechanism with noise multiplier sigma
(sensitivity 2C, std 2C sigma); the B releases of one iteration share the sampled
discriminator, so together they are one Gaussian mechanism with multiplier
sigma / sqrt(B) (:mod:`dclens.gswgan.accounting`).  ``C = inf`` and ``sigma = 0`` give
the plain autodiff update (tested).

Everything random here takes an explicit stateless seed.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

#: L2 sensitivity of one clipped per-sample gradient under replacing the discriminator,
#: in units of the clip C (two vectors of norm <= C differ by at most 2C).
SENSITIVITY = 2.0


def clip_per_sample(gradients: tf.Tensor, clip: float) -> tf.Tensor:
    """Scales each row g_j (leading axis) to norm min(||g_j||, C); C = inf keeps it.

    A row with a NaN or infinite entry becomes zeros: its norm is not finite, so scaling
    could not bound it, and whether a discriminator produces one depends on its private
    state -- the bound ||row|| <= C must hold for every row, whatever the discriminator.
    """
    if math.isinf(clip):
        return gradients
    axes = list(range(1, gradients.shape.rank))
    finite = tf.reduce_all(tf.math.is_finite(gradients), axis=axes, keepdims=True)
    gradients = tf.where(finite, gradients, tf.zeros_like(gradients))
    norms = tf.sqrt(tf.reduce_sum(tf.square(gradients), axis=axes, keepdims=True))
    return gradients * tf.minimum(1.0, clip / (norms + 1e-10))


def sanitize(gradients: tf.Tensor, *, clip: float, sigma: float,
             noise: tf.Tensor | None) -> tf.Tensor:
    """g~_j = clip(g_j, C) + SENSITIVITY * C * sigma * noise_j (module docstring).

    Args:
      gradients: [B, ...] per-sample gradients d(-D(x_j)) / d x_j ("sum" units: not
        divided by B).
      clip: C > 0 (``inf``: no clipping, only valid with sigma = 0).
      sigma: the noise multiplier relative to the sensitivity 2C.
      noise: standard normal draws shaped like ``gradients`` (None when sigma = 0).
    """
    if sigma < 0 or (sigma > 0 and (math.isinf(clip) or noise is None)):
        raise ValueError(f"sigma = {sigma!r} needs a finite clip (got {clip!r}) and noise")
    clipped = clip_per_sample(gradients, clip)
    if sigma == 0:
        return clipped
    return clipped + (SENSITIVITY * clip * sigma) * noise


def bernoulli_latent(seed: tf.Tensor, batch: int, z_dim: int) -> tf.Tensor:
    """z ~ Bernoulli(1/2)^z_dim as float32 (GS-WGAN's latent)."""
    return tf.cast(tf.random.stateless_uniform((batch, z_dim), seed) < 0.5, tf.float32)


def uniform_labels(seed: tf.Tensor, batch: int, num_classes: int) -> tf.Tensor:
    return tf.random.stateless_uniform((batch,), seed, 0, num_classes, dtype=tf.int64)


class Adam:
    """Adam (PyTorch's form: w -= lr * m_hat / (sqrt(v_hat) + eps)) over a fixed list of
    variables, with its moments and step count as variables, so a network's optimiser
    state can be saved and swapped in (the discriminator bank)."""

    def __init__(self, variables, *, learning_rate: float, beta1: float, beta2: float,
                 epsilon: float = 1e-8):
        self.variables = list(variables)
        self.learning_rate, self.beta1, self.beta2, self.epsilon = (
            learning_rate, beta1, beta2, epsilon)
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables]
        self.t = tf.Variable(0.0, trainable=False)

    def apply(self, gradients) -> None:
        self.t.assign_add(1.0)
        correction1 = 1.0 - tf.pow(self.beta1, self.t)
        correction2 = 1.0 - tf.pow(self.beta2, self.t)
        for w, m, v, g in zip(self.variables, self.m, self.v, gradients):
            m.assign(self.beta1 * m + (1.0 - self.beta1) * g)
            v.assign(self.beta2 * v + (1.0 - self.beta2) * tf.square(g))
            w.assign_sub(self.learning_rate * (m / correction1)
                         / (tf.sqrt(v / correction2) + self.epsilon))

    def state(self) -> list[np.ndarray]:
        return [x.numpy() for x in (*self.m, *self.v)] + [np.array([self.t.numpy()],
                                                                   np.float32)]

    def load(self, arrays) -> None:
        arrays = list(arrays)
        for variable, array in zip((*self.m, *self.v), arrays):
            variable.assign(array)
        self.t.assign(float(np.asarray(arrays[-1]).reshape(-1)[0]))


def critic_loss(generator, discriminator, real: tf.Tensor, labels: tf.Tensor,
                z: tf.Tensor, alpha: tf.Tensor, *, lambda_gp: float,
                drift: float) -> tf.Tensor:
    """WGAN-GP critic loss on one real batch and fakes G(z, labels) (labels: the real ones):

        mean D(fake) - mean D(real) + lambda_gp * mean((||grad_xhat D(xhat)||_2 - 1)^2)
        + drift * mean(D(real)^2),    xhat = alpha real + (1 - alpha) fake,

    alpha ~ U[0, 1] per sample (given), drift the PGGAN penalty (GS-WGAN: 1e-3).
    """
    fake = tf.stop_gradient(generator(z, labels, training=False))
    d_real = discriminator(real, labels, training=True)
    d_fake = discriminator(fake, labels, training=True)
    mix = alpha[:, None, None, None]
    interpolates = mix * real + (1.0 - mix) * fake
    with tf.GradientTape() as tape:
        tape.watch(interpolates)
        d_mix = discriminator(interpolates, labels, training=True)
    slopes = tf.norm(tf.reshape(tape.gradient(d_mix, interpolates),
                                (tf.shape(real)[0], -1)), axis=1)
    penalty = tf.reduce_mean(tf.square(slopes - 1.0))
    return (tf.reduce_mean(d_fake) - tf.reduce_mean(d_real) + lambda_gp * penalty
            + drift * tf.reduce_mean(tf.square(d_real)))


def critic_step(generator, discriminator, optimizer: Adam, real, labels, z, alpha, *,
                lambda_gp: float, drift: float) -> tf.Tensor:
    """One Adam step of the critic on :func:`critic_loss`; returns the loss."""
    with tf.GradientTape() as tape:
        loss = critic_loss(generator, discriminator, real, labels, z, alpha,
                           lambda_gp=lambda_gp, drift=drift)
    optimizer.apply(tape.gradient(loss, discriminator.trainable_variables))
    return loss


def private_generator_gradients(generator, discriminator, z: tf.Tensor, labels: tf.Tensor,
                                *, clip: float, sigma: float, noise: tf.Tensor | None):
    """The generator's gradient of -mean_j D(G(z_j, y_j), y_j) with D reached only through
    the sanitized per-image gradients (module docstring); returns (gradients, the
    sanitized [B, 28, 28, 1] release)."""
    with tf.GradientTape() as tape:
        fakes = generator(z, labels, training=True)
    with tf.GradientTape() as image_tape:
        image_tape.watch(fakes)
        total = -tf.reduce_sum(discriminator(fakes, labels, training=True))
    per_sample = image_tape.gradient(total, fakes)           # row j: d(-D(x_j)) / d x_j
    released = sanitize(per_sample, clip=clip, sigma=sigma, noise=noise)
    batch = tf.cast(tf.shape(fakes)[0], fakes.dtype)
    gradients = tape.gradient(fakes, generator.trainable_variables,
                              output_gradients=released / batch)
    return gradients, released


def plain_generator_gradients(generator, discriminator, z: tf.Tensor, labels: tf.Tensor):
    """Autodiff of -mean D(G(z, y), y) w.r.t. G's weights (warm-start; not private)."""
    with tf.GradientTape() as tape:
        loss = -tf.reduce_mean(discriminator(generator(z, labels, training=True), labels,
                                             training=True))
    return tape.gradient(loss, generator.trainable_variables)


def ema_update(average_weights, weights, step: int, decay: float = 0.999) -> None:
    """EMA generator: w_avg <- a w_avg + (1 - a) w, a = min(1 - 1/(step + 1), decay)
    (GS-WGAN's netGS, step counted from 0), over the weights given (the caller passes
    the trainable ones and copies the spectral-norm u vectors)."""
    a = min(1.0 - 1.0 / (step + 1), decay)
    for average, current in zip(average_weights, weights):
        average.assign(a * average + (1.0 - a) * current)
