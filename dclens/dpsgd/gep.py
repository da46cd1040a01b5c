"""Gradient Embedding Perturbation (GEP; Yu et al., ICLR 2021) for per-example gradients.

One step, on a Poisson-sampled batch of private per-example gradients G [B, p]:

1. **Anchor subspace** from m *public* anchor gradients A [m, p] (computed on the current
   model; GEP's anchors are auxiliary images with random labels): the parameters are cut
   into contiguous groups, group g gets k_g bases in proportion to sqrt(p_g), and one
   power iteration (L ~ N(0, 1)^{p_g x k_g}; R = A_g L; L = A_g^T R; Gram-Schmidt) gives an
   orthonormal basis V_g [p_g, k_g] (:func:`anchor_bases`).  It depends on public data
   only.
2. **Embedding and residual**: W = G V (all groups side by side, [B, k]); the residual
   R = G - W V^T uses the *unclipped* embedding.  Rows of W are clipped to S1, rows of R
   to S2.
3. **Perturbation**: w = (sum W + N(0, (sigma S1)^2 I_k)) / B and
   r = (sum R + N(0, (sigma S2)^2 I_p)) / B, the same noise multiplier sigma for both.
4. **Reconstruction**: v = w V^T + r (GEP) or v = w V^T (B-GEP, biased).

Privacy: adding or removing one example moves sum W by at most S1 and sum R by at most S2
(clipped rows), so each step releases two Gaussian mechanisms with noise multiplier sigma
on the same Poisson-sampled batch: ``PoissonSampledDpEvent(q, ComposedDpEvent([Gaussian
(sigma), Gaussian(sigma)]))`` (B-GEP: one Gaussian).  The authors' code instead counts the
two releases as 2T independent subsampled mechanisms, which is slightly optimistic.
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
import tensorflow as tf

from dclens.dpsgd.mechanisms import clip_rows


def group_sizes(num_params: int, num_groups: int) -> list[int]:
    """Contiguous, (nearly) equal groups of the flattened parameters, as the authors'."""
    if not 1 <= num_groups <= num_params:
        raise ValueError(f"num_groups must be in [1, {num_params}], got {num_groups!r}")
    base, extra = divmod(num_params, num_groups)
    return [base + (1 if g < extra else 0) for g in range(num_groups)]


def bases_per_group(sizes: list[int], num_bases: int, anchors: int) -> list[int]:
    """k_g proportional to sqrt(p_g), at least 1, at most min(p_g, anchors)."""
    weights = np.sqrt(np.asarray(sizes, np.float64))
    raw = np.maximum(1, np.round(num_bases * weights / weights.sum()).astype(int))
    return [int(min(k, p, anchors)) for k, p in zip(raw, sizes)]


def anchor_bases(anchor_grads, sizes: list[int], num_bases: int, *,
                 rng: np.random.Generator, power_iterations: int = 1) -> list[np.ndarray]:
    """One orthonormal basis V_g [p_g, k_g] per group from the anchor gradients [m, p].

    Per group: L ~ N(0, 1)^{p_g x k_g} from ``rng``; ``power_iterations`` times
    L = orthonormal columns of A_g^T (A_g L), by Householder QR (Gram-Schmidt's span).
    The products and the QR run in TensorFlow in float32 (NumPy's LAPACK QR was ~10x
    slower here); tested against a float64 NumPy reference (same span).
    """
    anchor_grads = tf.convert_to_tensor(anchor_grads, tf.float32)
    if anchor_grads.shape[1] != sum(sizes):
        raise ValueError(f"anchor gradients have {anchor_grads.shape[1]} parameters, the "
                         f"groups {sum(sizes)}")
    bases, start = [], 0
    for size, k in zip(sizes, bases_per_group(sizes, num_bases, int(anchor_grads.shape[0]))):
        basis = tf.constant(rng.standard_normal((size, k)), tf.float32)
        basis = _power_iterations(anchor_grads[:, start:start + size], basis,
                                  power_iterations)
        bases.append(basis.numpy())
        start += size
    return bases


def anchor_bases_reference(anchor_grads: np.ndarray, sizes: list[int], num_bases: int, *,
                           rng: np.random.Generator, power_iterations: int = 1
                           ) -> list[np.ndarray]:
    """:func:`anchor_bases` in NumPy float64, step by step: the slow reference it is
    tested and benchmarked against (same draws from ``rng``, same span)."""
    anchor_grads = np.asarray(anchor_grads, np.float64)
    bases, start = [], 0
    for size, k in zip(sizes, bases_per_group(sizes, num_bases, len(anchor_grads))):
        block = anchor_grads[:, start:start + size]
        basis = rng.standard_normal((size, k))
        for _ in range(power_iterations):
            basis = np.linalg.qr(block.T @ (block @ basis))[0]
        bases.append(basis)
        start += size
    return bases


@tf.function(autograph=False, reduce_retracing=True)
def _power_iterations(block: tf.Tensor, basis: tf.Tensor, iterations: int) -> tf.Tensor:
    for _ in range(iterations):
        basis = tf.linalg.qr(tf.matmul(block, tf.matmul(block, basis), transpose_a=True))[0]
    return basis


@dataclasses.dataclass(frozen=True)
class Gep:
    """GEP's per-step mechanism (module docstring).

    Attributes:
      clip_embedding: S1.  clip_residual: S2.  sigma: the noise multiplier of both.
      residual: False for B-GEP (the embedding alone).
    """

    clip_embedding: float = 5.0
    clip_residual: float = 2.0
    sigma: float = 1.0
    residual: bool = True

    def __post_init__(self) -> None:
        for name in ("clip_embedding", "clip_residual"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma must be a finite number >= 0, got {self.sigma!r}")

    def event(self, sampling_rate: float, steps: int = 1) -> dp_accounting.DpEvent:
        """The shared-batch event of ``steps`` steps (B-GEP: one Gaussian per step)."""
        if self.sigma == 0:
            return dp_accounting.NonPrivateDpEvent()
        gaussian = dp_accounting.GaussianDpEvent(noise_multiplier=self.sigma)
        inner = (dp_accounting.ComposedDpEvent([gaussian, gaussian]) if self.residual
                 else gaussian)
        event = dp_accounting.PoissonSampledDpEvent(sampling_probability=sampling_rate,
                                                    event=inner)
        return event if steps == 1 else dp_accounting.SelfComposedDpEvent(event, steps)

    def split(self, per_example: tf.Tensor, bases: list[np.ndarray]
              ) -> tuple[tf.Tensor, tf.Tensor]:
        """Clipped embeddings [B, k] and clipped residuals [B, p] of per-example gradients."""
        per_example = tf.convert_to_tensor(per_example, tf.float32)
        sizes = [basis.shape[0] for basis in bases]
        blocks = tf.split(per_example, sizes, axis=1)
        embeddings = [tf.linalg.matmul(block, basis) for block, basis in zip(blocks, bases)]
        residual = tf.concat([block - tf.linalg.matmul(w, basis, transpose_b=True)
                              for block, w, basis in zip(blocks, embeddings, bases)], axis=1)
        return (clip_rows(tf.concat(embeddings, axis=1), self.clip_embedding),
                clip_rows(residual, self.clip_residual))

    def aggregate(self, per_example: tf.Tensor, bases: list[np.ndarray], *,
                  expected_batch: float, noise_embedding: tf.Tensor,
                  noise_residual: tf.Tensor) -> tf.Tensor:
        """The reconstructed noisy gradient [p] (standard normal draws given explicitly)."""
        embeddings, residuals = self.split(per_example, bases)
        w = (tf.reduce_sum(embeddings, axis=0)
             + self.sigma * self.clip_embedding * noise_embedding) / expected_batch
        ks = [basis.shape[1] for basis in bases]
        parts = [tf.linalg.matvec(basis, part)
                 for basis, part in zip(bases, tf.split(w, ks))]
        update = tf.concat(parts, axis=0)
        if self.residual:
            update += (tf.reduce_sum(residuals, axis=0)
                       + self.sigma * self.clip_residual * noise_residual) / expected_batch
        return update
