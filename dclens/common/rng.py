"""Explicit, reproducible randomness: every random draw of a run has a named key.

A run has one root seed.  Each draw asks for a stateless TensorFlow seed derived from the
root and a path of integers (purpose, step, chunk, ...), so the same run reproduces the
same numbers whatever order things are computed in, and no global RNG is ever touched.

The root seed comes from OS entropy unless the user fixes it (``--seed``); a fixed seed
makes the DP noise reproducible by anyone who knows it, so such runs are marked as not
publishable (see :mod:`dclens.datalens.train`).
"""

from __future__ import annotations

import enum
import secrets

import numpy as np
import tensorflow as tf


class Stream(enum.IntEnum):
    """What a random draw is for (first element of its key path)."""

    TEACHER_INIT = 1
    GENERATOR_INIT = 2
    LATENT = 3
    QUERY_LABELS = 4
    STOCHASTIC_SIGN = 5
    DP_NOISE = 6
    SAMPLES = 7
    # Private classifiers (dclens.dpsgd).
    BATCH = 8
    MODEL_INIT = 9
    DATA_SPLIT = 10
    ANCHOR_LABELS = 11
    ANCHOR_BASIS = 12
    # GS-WGAN (dclens.gswgan).
    DISCRIMINATOR_CHOICE = 13
    CRITIC = 14
    # GEP's data-independent anchors (dclens.dpsgd).
    ANCHOR_IMAGES = 15
    # DP-MERF's random Fourier features (dclens.datalens.merf).
    FOURIER_FEATURES = 16


def entropy_seed() -> int:
    """A fresh 63-bit root seed from the operating system's entropy source."""
    return secrets.randbits(63)


class SeedTree:
    """Derives independent seeds from one root seed and a path of non-negative integers."""

    def __init__(self, root: int):
        if not isinstance(root, int) or isinstance(root, bool) or root < 0:
            raise ValueError(f"seed must be an integer >= 0, got {root!r}")
        self._root = root

    def _sequence(self, path: tuple[int, ...]) -> np.random.SeedSequence:
        return np.random.SeedSequence(self._root, spawn_key=tuple(int(p) for p in path))

    def integer(self, *path: int) -> int:
        """A 31-bit integer seed for ``path`` (for Keras initialisers)."""
        return int(self._sequence(path).generate_state(1, np.uint32)[0] >> 1)

    def tf_seed(self, *path: int) -> tf.Tensor:
        """A shape-[2] int64 seed for ``tf.random.stateless_*`` ops."""
        return tf.constant(self._sequence(path).generate_state(2, np.uint32).astype(np.int64))

    def numpy(self, *path: int) -> np.random.Generator:
        """A numpy generator for ``path``."""
        return np.random.default_rng(self._sequence(path))
