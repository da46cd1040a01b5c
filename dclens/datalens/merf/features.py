"""Random Fourier features of the Gaussian kernel, with every feature vector of unit norm.

phi(x) = sqrt(2 / D) [cos(W^T x), sin(W^T x)],  W in R^{d x D/2},  W_ij ~ N(0, 1 / l^2),

so that phi(x)^T phi(x') is an unbiased estimate of exp(-||x - x'||^2 / (2 l^2)) (Rahimi and
Recht, NIPS 2007) and ||phi(x)||_2 = 1 exactly in real arithmetic (cos^2 + sin^2 = 1).  The
mechanism's sensitivity rests on that norm, so :meth:`FourierFeatures.numpy` also divides
any vector whose floating-point norm exceeds 1 by its norm: the bound holds by construction,
not by arithmetic.  W is drawn from the run's keys, never from data.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class FourierFeatures:
    """The frequencies W, float32 [d, D/2]; ``dim`` = D features per image."""

    frequencies: np.ndarray

    @property
    def dim(self) -> int:
        return 2 * self.frequencies.shape[1]

    @property
    def input_dim(self) -> int:
        return self.frequencies.shape[0]

    def digest(self) -> str:
        """SHA-256 of the frequencies (shape and float32 bytes): what a release records, so
        that a refit can check it fits against the features the release was made with."""
        frequencies = np.ascontiguousarray(self.frequencies, np.float32)
        digest = hashlib.sha256(repr(frequencies.shape).encode())
        digest.update(frequencies.tobytes())
        return digest.hexdigest()

    def numpy(self, images: np.ndarray) -> np.ndarray:
        """phi of each image (any shape [N, ...] with prod(...) = d), float64 [N, D], each
        row of L2 norm <= 1 (:func:`clip_to_unit_norm` of :meth:`unclipped`)."""
        return clip_to_unit_norm(self.unclipped(images))

    def unclipped(self, images: np.ndarray) -> np.ndarray:
        """sqrt(2 / D) [cos(W^T x), sin(W^T x)] as computed, float64 [N, D]."""
        flat = np.asarray(images, np.float64).reshape(len(images), -1)
        if flat.shape[1] != self.input_dim:
            raise ValueError(f"images have {flat.shape[1]} values each, the features were "
                             f"drawn for {self.input_dim}")
        with np.errstate(invalid="ignore"):     # a non-finite pixel: cleared by the clip
            projected = flat @ self.frequencies.astype(np.float64)
            return np.sqrt(2.0 / self.dim) * np.concatenate([np.cos(projected),
                                                             np.sin(projected)], axis=1)

    def tensor(self, images: tf.Tensor) -> tf.Tensor:
        """phi of a batch of images as float32 [N, D], differentiable (for the fit; what
        the generator draws is public, so no norm bound is needed here)."""
        flat = tf.reshape(images, (tf.shape(images)[0], self.input_dim))
        projected = tf.matmul(flat, tf.constant(self.frequencies, tf.float32))
        scale = tf.constant(np.sqrt(2.0 / self.dim), tf.float32)
        return scale * tf.concat([tf.cos(projected), tf.sin(projected)], axis=1)


def clip_to_unit_norm(rows: np.ndarray) -> np.ndarray:
    """Each row divided by max(1, its L2 norm), and a row holding a NaN or an infinity
    replaced by zeros (as a non-finite teacher gradient is): every row's norm is then
    <= 1, whatever the input."""
    rows = np.where(np.all(np.isfinite(rows), axis=1, keepdims=True), rows, 0.0)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1.0)


def draw(input_dim: int, num_features: int, lengthscale: float,
         rng: np.random.Generator) -> FourierFeatures:
    """D = ``num_features`` random Fourier features (even, >= 2) for inputs of
    ``input_dim`` values, kernel length scale ``lengthscale`` (> 0, in pixel-value units:
    images in [0, 1])."""
    if not isinstance(num_features, int) or num_features < 2 or num_features % 2:
        raise ValueError(f"num_features must be an even integer >= 2 (cos and sin of each "
                         f"frequency), got {num_features!r}")
    if not (isinstance(lengthscale, (int, float)) and np.isfinite(lengthscale)
            and lengthscale > 0):
        raise ValueError(f"lengthscale must be a finite number > 0, got {lengthscale!r}")
    frequencies = rng.standard_normal((input_dim, num_features // 2)) / lengthscale
    return FourierFeatures(frequencies.astype(np.float32))
