"""Where a DataLens run's random numbers come from: one documented injection point.

:class:`dclens.train.DataLens` takes every random draw of its loop through a
:class:`Draws` object:

* ``latent(step, shape)``: z ~ U(-1, 1), float32 [B, z_dim];
* ``query_labels(step, round_index, batch, num_classes)``: the query batch's labels, int32 [B];
* ``sign_uniforms(step, round_index, first_teacher, grads, count)``: the aggregation's
  U[0, 1) draws, float32 [T, B, count] (:meth:`dclens.topagg.TopAgg.uniform_count`): for the
  stochastic sign one per voted coordinate *in top-k order* (largest |g| first, as
  :func:`dclens.topagg.topk_indices`), for k-level quantisation one per coordinate; for
  the chunk of teachers that starts at ``first_teacher`` (``grads`` float32 [T, B, D] is
  that chunk's gradients);
* ``dp_noise(attempt, step, round_index, shape)``: standard normal draws, float32 [B, D]; the
  released vote is ``vote_sum + sigma * dp_noise``.

:class:`SeededDraws` is what every run uses: each draw has its own stateless key derived from
the run's root seed (:class:`dclens.rng.SeedTree`), so results do not depend on the order in
which things are computed.  Another :class:`Draws` exists to replay the random numbers of a
different implementation (``dclens.parity``, the side-by-side harness with the authors'
code).  **Privacy:** the DP noise is only private if nobody knows it; a run whose draws come
from anything but :class:`SeededDraws` over a secret (OS-entropy) root seed is not private,
and must not be published as such.
"""

from __future__ import annotations

from typing import Protocol

import tensorflow as tf

from dclens.rng import SeedTree, Stream


class Draws(Protocol):
    """The random numbers of a DataLens run (see the module docstring for shapes)."""

    def latent(self, step: int, shape: tuple[int, int]) -> tf.Tensor:
        ...

    def query_labels(self, step: int, round_index: int, batch: int,
                     num_classes: int) -> tf.Tensor:
        ...

    def sign_uniforms(self, step: int, round_index: int, first_teacher: int,
                      grads: tf.Tensor, count: int) -> tf.Tensor:
        ...

    def dp_noise(self, attempt: int, step: int, round_index: int,
                 shape: tuple[int, int]) -> tf.Tensor:
        ...


class SeededDraws:
    """Every draw from its own stateless key under one root seed (the default)."""

    def __init__(self, seeds: SeedTree):
        self.seeds = seeds

    def latent(self, step: int, shape: tuple[int, int]) -> tf.Tensor:
        return tf.random.stateless_uniform(shape, seed=self.seeds.tf_seed(Stream.LATENT, step),
                                           minval=-1.0, maxval=1.0)

    def query_labels(self, step: int, round_index: int, batch: int,
                     num_classes: int) -> tf.Tensor:
        return tf.random.stateless_uniform(
            (batch,), seed=self.seeds.tf_seed(Stream.QUERY_LABELS, step, round_index),
            minval=0, maxval=num_classes, dtype=tf.int32)

    def sign_uniforms(self, step: int, round_index: int, first_teacher: int,
                      grads: tf.Tensor, count: int) -> tf.Tensor:
        # Drawn directly in the order they are used: i.i.d. uniforms need no coordinate
        # identity.
        return tf.random.stateless_uniform(
            (grads.shape[0], grads.shape[1], count),
            seed=self.seeds.tf_seed(Stream.STOCHASTIC_SIGN, step, round_index, first_teacher),
            dtype=tf.float32)

    def noise_seed(self, attempt: int, step: int, round_index: int) -> tf.Tensor:
        """The DP noise key of (attempt, step, round)."""
        return self.seeds.tf_seed(Stream.DP_NOISE, attempt, step, round_index)

    def dp_noise(self, attempt: int, step: int, round_index: int,
                 shape: tuple[int, int]) -> tf.Tensor:
        return tf.random.stateless_normal(shape, seed=self.noise_seed(attempt, step, round_index),
                                          dtype=tf.float32)
