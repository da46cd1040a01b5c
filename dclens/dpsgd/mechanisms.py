"""Private aggregation of per-example gradients: DP-SGD (GM-DP) and TopAgg for DP-SGD.

One step of DP-SGD (Abadi et al. 2016) on a Poisson-sampled batch (each of the n examples
joins independently with probability q = B / n):

1. every example's gradient g_x is clipped to L2 norm C: g_x / max(1, ||g_x|| / C) (a
   gradient holding a NaN or an infinity is replaced by zeros first, :func:`clip_rows`);
2. (TopAgg, DataLens App. A Alg. 4) **NormTopK** keeps the largest squared coordinates of
   the clipped gradient while their running sum stays <= k ||g||^2 (0 < k <= 1, a
   *fraction*), zeroing the rest, so ||NormTopK(g)||^2 <= k ||g||^2 <= k C^2;
3. the kept gradients are summed, N(0, (sigma * Delta)^2 I) is added with Delta the L2
   sensitivity -- C for GM-DP, sqrt(k) C for NormTopK -- and the sum is divided by the
   expected batch size B.

Adding or removing one example changes the sum by its own processed gradient, whose norm
is at most Delta by construction, so each step is the Poisson-subsampled Gaussian
mechanism with noise multiplier sigma: ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``
(add-or-remove-one adjacency), composed over steps.  GM-DP is NormTopK with k = 1.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import dp_accounting
import numpy as np
import tensorflow as tf


class Method(enum.Enum):
    """How the clipped per-example gradients are aggregated."""

    #: DP-SGD, the Gaussian mechanism on the sum of clipped gradients (DataLens "GM-DP").
    GM = "gm"
    #: TopAgg for DP-SGD (DataLens App. A, Alg. 4): NormTopK of each clipped gradient.
    TOPAGG = "topagg"
    #: The dimension-based variant (DataLens Table 9): keep the fraction k of each clipped
    #: gradient's coordinates with the largest |g|.  Dropping coordinates cannot raise
    #: the norm, so the sensitivity stays C (no sqrt(k) saving can be proven).
    TOPAGG_DIMENSION = "topagg_dimension"
    #: Gradient Embedding Perturbation (:mod:`dclens.dpsgd.gep`): embedding and residual.
    GEP = "gep"
    #: B-GEP: the embedding alone (biased).
    BGEP = "bgep"

    @property
    def is_gep(self) -> bool:
        return self in (Method.GEP, Method.BGEP)


@dataclasses.dataclass(frozen=True)
class PrivateAggregation:
    """The per-step mechanism (see the module docstring).

    Attributes:
      method: :class:`Method`.
      clip: C, the per-example L2 clip.
      sigma: noise multiplier (noise std / sensitivity); 0 only for a non-private run.
      topk: k in (0, 1], the fraction of the squared norm NormTopK keeps (TOPAGG only).
    """

    method: Method = Method.GM
    clip: float = 1.0
    sigma: float = 1.0
    topk: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.method, Method) or self.method.is_gep:
            raise ValueError(f"method must be a clipping Method (GEP has its own mechanism, "
                             f"dclens.dpsgd.gep.Gep), got {self.method!r}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a finite number > 0, got {self.clip!r}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma must be a finite number >= 0, got {self.sigma!r}")
        if not 0 < self.topk <= 1:
            raise ValueError(f"topk must be a fraction in (0, 1], got {self.topk!r}")

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the summed processed gradients to one example."""
        if self.method is Method.TOPAGG:
            return math.sqrt(self.topk) * self.clip
        return self.clip

    def event(self, sampling_rate: float, steps: int = 1) -> dp_accounting.DpEvent:
        """``steps`` Poisson-subsampled Gaussian mechanisms with noise multiplier sigma."""
        if self.sigma == 0:
            return dp_accounting.NonPrivateDpEvent()
        event = dp_accounting.PoissonSampledDpEvent(
            sampling_probability=sampling_rate,
            event=dp_accounting.GaussianDpEvent(noise_multiplier=self.sigma))
        return event if steps == 1 else dp_accounting.SelfComposedDpEvent(event, steps)

    def process(self, per_example: tf.Tensor) -> tf.Tensor:
        """Clipped (and for TOPAGG, NormTopK-compressed) per-example gradients [B, P]."""
        clipped = clip_rows(per_example, self.clip)
        if self.method is Method.TOPAGG:
            return norm_topk(clipped, self.topk)
        if self.method is Method.TOPAGG_DIMENSION:
            return dimension_topk(clipped, self.topk)
        return clipped

    def aggregate(self, per_example: tf.Tensor, *, expected_batch: float,
                  noise: tf.Tensor) -> tf.Tensor:
        """(sum of processed gradients + sigma * Delta * noise) / expected batch size.

        ``noise``: standard normal draws [P] (explicit randomness, one key per step).
        """
        total = tf.reduce_sum(self.process(per_example), axis=0)
        return (total + self.sigma * self.sensitivity * noise) / expected_batch


def clip_rows(rows: tf.Tensor, clip: float) -> tf.Tensor:
    """Each row g scaled to g / max(1, ||g|| / C); a row holding a NaN or an infinity
    becomes zeros.

    The bound ||clipped g|| <= C is what every sensitivity here rests on, and it fails for
    a non-finite row: NaN / max(1, NaN) stays NaN, inf / inf is NaN, and either poisons
    the whole sum.  Zeroing such a row (one example's gradient, a function of that example
    alone) keeps it inside the ball like any other clipped row.  A finite row whose norm
    overflows to inf is scaled to zeros by the same formula.
    """
    rows = tf.convert_to_tensor(rows, tf.float32)
    finite = tf.reduce_all(tf.math.is_finite(rows), axis=1, keepdims=True)
    rows = tf.where(finite, rows, tf.zeros_like(rows))
    norms = tf.norm(rows, axis=1, keepdims=True)
    return rows / tf.maximum(1.0, norms / clip)


def _kept_prefix(squares: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``squares`` [B, P] (>= 0): the length ``count`` of the longest prefix
    of its descending order whose float32 running sum is <= ``target`` [B, 1], and the
    value ``last`` at the prefix's end (the largest value when ``count`` is 0).

    Only the top of each row is sorted. The m largest values are found by a linear-time
    partition (exact zeros -- most of a ReLU net's squared gradient -- are first replaced
    by distinct negative numbers, which keeps the partition off its many-equal-values
    worst case and sorts them below every positive value), then sorted. If the running sum
    passes the target inside them, at position e, the prefix is the first e values: they
    are the first e of the full descending order, summed in the same order, so the floats
    are the same; fillers cannot come first (a negative addend cannot pass the target).
    Other rows are tried again with 4m, and at m = P by the full sort as defined."""
    rows_total, width = squares.shape
    count = np.zeros(rows_total, np.int64)
    last = np.zeros(rows_total, squares.dtype)
    fillers = -1.0 - np.arange(width, dtype=squares.dtype)
    filled = np.where(squares > 0, squares, fillers)
    pending = np.arange(rows_total)
    size = max(1, width // 8)
    while pending.size:
        if size >= width:                                  # the full sort, as defined
            ordered = np.sort(squares[pending], axis=1)[:, ::-1]
            cumulative = np.cumsum(ordered, axis=1, dtype=np.float32)
            found = np.sum(cumulative <= target[pending], axis=1)
            count[pending] = found
            last[pending] = ordered[np.arange(len(pending)), np.maximum(found - 1, 0)]
            break
        top = np.sort(np.partition(filled[pending], width - size, axis=1)[:, width - size:],
                      axis=1)[:, ::-1]
        exceeds = np.cumsum(top, axis=1, dtype=np.float32) > target[pending]
        done = exceeds.any(axis=1)
        found = np.argmax(exceeds, axis=1)[done]
        count[pending[done]] = found
        last[pending[done]] = top[done][np.arange(len(found)), np.maximum(found - 1, 0)]
        pending = pending[~done]
        size = min(width, 4 * size)
    return count, last


def _norm_topk_mask(squares: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The NormTopK mask of each row of ``squares`` [B, P] for its ``target`` [B, 1].

    The kept set is a prefix of the descending order of g^2, so only its length ``count``
    and the value ``last`` at its end are needed (:func:`_kept_prefix`, which sorts only
    the top of each row): every coordinate above ``last`` is kept, and of those equal to
    it the first ``count - (number above)`` in index order. No argsort or inverse
    permutation; the float32 cumulative sum is taken in the same order as the literal
    version's, so the masks are equal bit for bit (tested)."""
    count, last = _kept_prefix(squares, target)
    last = last[:, None]
    keep = squares >= last
    ties = squares == last
    tied = np.count_nonzero(ties, axis=1)
    room = count - (np.count_nonzero(keep, axis=1) - tied)      # ties the prefix takes
    partial = np.flatnonzero(room < tied)                       # rows that cut a tie group
    if partial.size:
        rank = np.cumsum(ties[partial], axis=1)                 # 1-based, index order
        keep[partial] &= ~ties[partial] | (rank <= room[partial, None])
    keep[count == 0] = False
    return keep


def norm_topk(rows: tf.Tensor, fraction: float) -> tf.Tensor:
    """NormTopK of each row g: keep the largest squared coordinates while their cumulative
    sum (float32, in descending order) is <= fraction * ||g||^2, zero the rest; ties in
    g^2 are taken in index order. fraction >= 1 keeps every coordinate (GM-DP).

    The mask comes from :func:`_norm_topk_mask` (a partial value sort; equal bit for bit to
    :func:`norm_topk_literal`, tested; ``scripts/bench_dpsgd.py`` measures the two).
    """
    rows = tf.convert_to_tensor(rows, tf.float32)
    if fraction >= 1.0:
        return rows
    squares = tf.square(rows)
    target = fraction * tf.reduce_sum(squares, axis=1, keepdims=True)
    keep = tf.numpy_function(_norm_topk_mask, [squares, target], tf.bool, stateful=False)
    keep.set_shape(squares.shape)
    return tf.where(keep, rows, tf.zeros_like(rows))


def norm_topk_literal(rows: tf.Tensor, fraction: float) -> tf.Tensor:
    """:func:`norm_topk` as the definition reads -- argsort by g^2 (stable, descending),
    cumulative sum, mask, scatter the mask back by the inverse permutation: the slow
    reference the fast path is tested and benchmarked against."""
    rows = tf.convert_to_tensor(rows, tf.float32)
    squares = tf.square(rows)
    order = tf.argsort(squares, axis=1, direction="DESCENDING", stable=True)
    cumulative = tf.cumsum(tf.gather(squares, order, batch_dims=1), axis=1)
    keep_sorted = cumulative <= fraction * tf.reduce_sum(squares, axis=1, keepdims=True)
    if fraction >= 1.0:
        keep_sorted = tf.ones_like(keep_sorted)
    keep = tf.gather(keep_sorted, tf.argsort(order, axis=1, stable=True), batch_dims=1)
    return tf.where(keep, rows, tf.zeros_like(rows))


def dimension_topk(rows: tf.Tensor, fraction: float) -> tf.Tensor:
    """Keep the ceil(fraction * P) coordinates of largest |g| of each row (lower index
    first on ties), zero the rest."""
    rows = tf.convert_to_tensor(rows, tf.float32)
    count = max(1, math.ceil(fraction * int(rows.shape[1])))
    kept = tf.math.top_k(tf.abs(rows), k=count).indices
    mask = tf.reduce_sum(tf.one_hot(kept, int(rows.shape[1])), axis=1) > 0
    return tf.where(mask, rows, tf.zeros_like(rows))


def poisson_batch(rng: np.random.Generator, num_examples: int, rate: float) -> np.ndarray:
    """Indices of a Poisson-sampled batch: every example joins independently w.p. ``rate``
    (the sampling the accounting assumes; the batch size varies, may be 0)."""
    return np.flatnonzero(rng.random(num_examples) < rate)
