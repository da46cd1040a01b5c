"""Where a DataLens run's random numbers come from: one documented injection point.

:class:`dclens.datalens.train.DataLens` takes every random draw of its loop through a
:class:`Draws` object:

* ``latent(step, shape)``: z ~ U(-1, 1), float32 [B, z_dim];
* ``query_labels(step, round_index, batch, num_classes)``: the query batch's labels, int32 [B];
* ``sign_uniforms(step, round_index, first_teacher, grads, count)``: the aggregation's
  U[0, 1) draws, float32 [T, B, count] (:meth:`dclens.datalens.topagg.TopAgg.uniform_count`): for the
  stochastic sign one per voted coordinate *in top-k order* (largest |g| first, as
  :func:`dclens.datalens.topagg.topk_indices`), for k-level quantisation one per coordinate; for
  the chunk of teachers that starts at ``first_teacher`` (``grads`` float32 [T, B, D] is
  that chunk's gradients);
* ``dp_noise(attempt, step, round_index, shape)``: standard normal draws, float32 [B, D]; the
  released vote is ``vote_sum + sigma * dp_noise``.

:class:`SeededDraws` is what every run uses: each draw has its own stateless key derived from
the run's root seed (:class:`dclens.common.rng.SeedTree`), so results do not depend on the order in
which things are computed.  Another :class:`Draws` exists to replay the random numbers of a
different implementation (``dclens.parity``, the side-by-side harness with the authors'
code).  **Privacy:** the DP noise is only private if nobody knows it; a run whose draws come
from anything but :class:`SeededDraws` over a secret (OS-entropy) root seed is not private,
and must not be published as such.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import tensorflow as tf

from dclens.common.rng import SeedTree, Stream


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

    def sign_key(self, step: int, round_index: int, first_teacher: int) -> np.ndarray:
        """The stochastic-sign key (int64 [2]) of the chunk starting at ``first_teacher``.

        It is all a process holding those teachers needs to draw their uniforms
        (:class:`KeyedSignDraws`); it reveals nothing of the DP noise's keys."""
        return self.seeds.tf_seed(Stream.STOCHASTIC_SIGN, step, round_index,
                                  first_teacher).numpy()

    def sign_uniforms(self, step: int, round_index: int, first_teacher: int,
                      grads: tf.Tensor, count: int) -> tf.Tensor:
        return uniforms_for_key(self.sign_key(step, round_index, first_teacher), grads, count)

    def noise_seed(self, attempt: int, step: int, round_index: int) -> tf.Tensor:
        """The DP noise key of (attempt, step, round)."""
        return self.seeds.tf_seed(Stream.DP_NOISE, attempt, step, round_index)

    def dp_noise(self, attempt: int, step: int, round_index: int,
                 shape: tuple[int, int]) -> tf.Tensor:
        return tf.random.stateless_normal(shape, seed=self.noise_seed(attempt, step, round_index),
                                          dtype=tf.float32)


def uniforms_for_key(key: np.ndarray, grads: tf.Tensor, count: int) -> tf.Tensor:
    """U[0, 1) float32 [T, B, count] of one chunk from its stochastic-sign key.

    Drawn directly in the order they are used: i.i.d. uniforms need no coordinate identity.
    """
    return tf.random.stateless_uniform((grads.shape[0], grads.shape[1], count),
                                       seed=tf.constant(key, tf.int64), dtype=tf.float32)


class KeyedSignDraws:
    """The draws of a process that holds some teachers but not the run's root seed (a
    shard worker, :mod:`dclens.datalens.sharded`): the stochastic-sign uniforms only, from keys
    the driver sends with each call (:meth:`SeededDraws.sign_key`), so the uniforms equal
    the in-process run's bit for bit.  Every other draw belongs to the driver."""

    def __init__(self):
        self.keys: dict[int, np.ndarray] = {}

    def use(self, keys: dict[int, np.ndarray]) -> None:
        """The keys of the current call, by the first (run) teacher of each chunk."""
        self.keys = dict(keys)

    def sign_uniforms(self, step: int, round_index: int, first_teacher: int,
                      grads: tf.Tensor, count: int) -> tf.Tensor:
        del step, round_index   # the driver's keys are for the current call's round
        if first_teacher not in self.keys:
            raise KeyError(f"no stochastic-sign key was sent for the chunk of teachers "
                           f"starting at {first_teacher} (sent: {sorted(self.keys)})")
        return uniforms_for_key(self.keys[first_teacher], grads, count)

    def _driver_only(self, *args, **kwargs):
        raise RuntimeError("a shard worker draws only stochastic-sign uniforms; latents, "
                           "query labels and DP noise are drawn by the driver")

    latent = query_labels = dp_noise = _driver_only
