"""TopAgg: top-k stochastic-sign voting, Gaussian noise and thresholding (paper Alg. 2, 3).

For one fake image and N teachers with gradients g_1..g_N (each of dimension D):

1. Each teacher keeps the k coordinates of largest |g_i| (ties: lower index first, as
   ``tf.math.top_k``), clips them to [-c, c], divides by their largest magnitude
   (L-inf normalisation; an all-zero gradient stays 0) and votes on each of them:
   stochastic sign: +1 with probability (1 + g) / 2, else -1 (an unbiased estimate of g);
   deterministic sign: +1 if g >= 0, else -1.  Exactly k votes in {-1, +1}, 0 elsewhere.
2. The N vote vectors are summed: v in Z^D.
3. Noise: v + N(0, sigma^2 I_D).
4. Threshold: +1 where the noisy sum >= beta*N, -1 where <= -beta*N, else 0.

Privacy: replacing one record changes one teacher's partition and hence at most its own
vote vector, whose k entries in {-1, +1} can all flip: ||v - v'||_2 <= 2*sqrt(k).  Step 3
is the Gaussian mechanism with noise multiplier sigma / (2*sqrt(k)); step 4 is
post-processing.  A batch of B fake images is B such mechanisms (B queries), returned as
one ``dp_accounting`` event.

Non-finite gradients: a (teacher, image) row holding a NaN or an infinity votes as an
all-zero gradient (:func:`zero_nonfinite_rows`), in every aggregation, so a diverged
teacher stays inside the charged sensitivity (a NaN would otherwise survive clipping and
release 0 whatever the noise).

Summing is linear, so votes can be accumulated chunk by chunk of teachers
(:meth:`TopAgg.vote_sum`) and noised once (:meth:`TopAgg.release`).

Steps 1-2 (:func:`summed_votes`) run either as the pure-TF reference below or as the
custom op ``Dclens>TopkSignVote`` (``ops/``, loaded lazily by :mod:`dclens.datalens.vote_op`);
both give identical vote sums.  Noise and thresholding are always TF.

The paper's ablations and comparisons are other values of
:class:`dclens.datalens.config.Aggregation`, run by the same :class:`TopAgg` object: the
deterministic sign; the stochastic sign on all D coordinates (no top-k, sensitivity
2 sqrt(D)); no threshold, with the stochastic or the deterministic sign (the noisy sum / k
is released, sensitivity 2 sqrt(k)); D2P-Fed's L-level stochastic
quantisation (:func:`klevel_sum`, sensitivity (L - 1) sqrt(D)); FetchSGD's count sketch
of the top-k votes (noise on the sketch, sensitivity from its public hashes,
:mod:`dclens.datalens.sketch`).  Each charges the Gaussian mechanism of its own sensitivity
(:meth:`TopAgg.event`).
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
import tensorflow as tf

from dclens.privacy import accounting
from dclens.datalens import vote_op
from dclens.datalens.config import (DETERMINISTIC_SIGN_METHODS, TOPK_METHODS,
                                    UNTHRESHOLDED_METHODS, Aggregation, SketchAccounting,
                                    TopAggConfig)
from dclens.datalens.sketch import CountSketch
from dclens.datalens.vote_op import Backend


def _check_grads(grads: tf.Tensor, topk: int) -> tf.Tensor:
    grads = tf.convert_to_tensor(grads, tf.float32)
    if grads.shape.rank != 3:
        raise ValueError(f"teacher gradients must be [teachers, images, dim], got shape "
                         f"{grads.shape}")
    if grads.shape[-1] is not None and topk > grads.shape[-1]:
        raise ValueError(f"topk={topk} is larger than the image dimension {grads.shape[-1]}; "
                         f"use topk <= {grads.shape[-1]}")
    return grads


def zero_nonfinite_rows(grads: tf.Tensor) -> tf.Tensor:
    """Gradients [T, B, D] with every (teacher, image) row that holds a NaN or an infinity
    replaced by zeros; finite rows pass through bit for bit.

    The sensitivity of every aggregation is a bound on what one teacher's vote can move,
    proven for finite inputs.  A non-finite row is a function of one teacher's data too
    (a diverged teacher), and arithmetic on it is not bounded: a NaN survives clipping,
    makes its coordinate of the vote sum NaN, and thresholding NaN releases 0 whatever the
    noise.  Zeroing the row maps it to the vote of an all-zero gradient, which is inside
    the charged sensitivity like any other vote.
    """
    finite = tf.reduce_all(tf.math.is_finite(grads), axis=-1, keepdims=True)
    return tf.where(finite, grads, tf.zeros_like(grads))


def topk_indices(grads: tf.Tensor, topk: int) -> tf.Tensor:
    """The voted coordinates int32 [T, B, k] of gradients [T, B, D], in top-k order:
    largest |g| first, ties broken by the lower index (``tf.math.top_k``)."""
    return tf.math.top_k(tf.abs(grads), k=topk, sorted=True).indices


def uniforms_in_topk_order(grads: tf.Tensor, coordinate_uniforms: tf.Tensor,
                           topk: int) -> tf.Tensor:
    """The stochastic sign's draws [T, B, k] from one draw per coordinate [T, B, D].

    For an implementation that draws a uniform for every coordinate and uses those of the
    voted ones (the authors' ``stachastic_convert2topk``): the k draws of the voted
    coordinates, in the order :func:`summed_votes` consumes them.
    """
    grads = _check_grads(grads, topk)
    coordinate_uniforms = tf.convert_to_tensor(coordinate_uniforms, tf.float32)
    if coordinate_uniforms.shape != grads.shape:
        raise ValueError(f"per-coordinate uniforms must have the gradients' shape "
                         f"{grads.shape}, got {coordinate_uniforms.shape}")
    return tf.gather(coordinate_uniforms, topk_indices(grads, topk), batch_dims=2)


def _topk_signs(grads: tf.Tensor, uniforms: tf.Tensor | None, *, topk: int,
                max_grad: float, method: Aggregation) -> tuple[tf.Tensor, tf.Tensor]:
    """Top-k indices [T, B, k] (int32) and their votes [T, B, k] (int32, in {-1, +1})."""
    indices = topk_indices(grads, topk)
    chosen = tf.clip_by_value(tf.gather(grads, indices, batch_dims=2), -max_grad, max_grad)
    scale = tf.reduce_max(tf.abs(chosen), axis=-1, keepdims=True)
    normalised = tf.math.divide_no_nan(chosen, scale)
    if method is Aggregation.TOPK_STOCHASTIC_SIGN:
        if uniforms is None:
            raise ValueError("the stochastic sign needs uniform draws")
        positive = uniforms < (1.0 + normalised) / 2.0
    elif method is Aggregation.TOPK_SIGN:
        positive = normalised >= 0.0
    else:
        raise ValueError(f"unknown aggregation method {method!r}")
    votes = tf.where(positive, 1, -1)
    return indices, tf.cast(votes, tf.int32)


def teacher_votes(grads: tf.Tensor, uniforms: tf.Tensor | None, *, topk: int,
                  max_grad: float, method: Aggregation) -> tf.Tensor:
    """Every teacher's dense vote vectors: int32 [T, B, D], exactly k non-zeros in {-1, +1}.

    Args:
      grads: float32 [T, B, D] teacher gradients (T teachers, B images).
      uniforms: float32 [T, B, k] draws from U[0, 1), one per voted coordinate in top-k
        order (largest |g| first); ignored (may be None) for the deterministic sign.
    """
    grads = _check_grads(grads, topk)
    indices, votes = _topk_signs(grads, uniforms, topk=topk, max_grad=max_grad, method=method)
    t, b = tf.shape(grads)[0], tf.shape(grads)[1]
    teacher = tf.broadcast_to(tf.range(t)[:, None, None], tf.shape(indices))
    image = tf.broadcast_to(tf.range(b)[None, :, None], tf.shape(indices))
    where = tf.stack([teacher, image, indices], axis=-1)
    return tf.scatter_nd(where, votes, tf.shape(grads, out_type=tf.int32))


# Never jit_compile=True: with the custom backend the op has no XLA kernel (the reference
# path alone would compile, but it is kept on the same footing).
@tf.function(reduce_retracing=True, jit_compile=False)
def _vote_sum(grads, uniforms, topk, max_grad, method):
    indices, votes = _topk_signs(grads, uniforms, topk=topk, max_grad=max_grad, method=method)
    b, d = tf.shape(grads)[1], tf.shape(grads)[2]
    image = tf.broadcast_to(tf.range(b)[None, :, None], tf.shape(indices))
    where = tf.stack([image, indices], axis=-1)
    return tf.scatter_nd(tf.reshape(where, (-1, 2)), tf.reshape(votes, (-1,)),
                         tf.stack([b, d]))


def summed_votes(grads: tf.Tensor, uniforms: tf.Tensor | None, *, topk: int,
                 max_grad: float, method: Aggregation,
                 backend: Backend | str = Backend.AUTO) -> tf.Tensor:
    """sum_i votes_i: int32 [B, D] (the fast path; equals teacher_votes(...).sum(0)).

    Args:
      backend: ``"reference"`` (pure TF), ``"custom"`` (the op ``Dclens>TopkSignVote``;
        :class:`dclens.datalens.vote_op.VoteOpUnavailable` if it cannot be loaded) or ``"auto"``
        (the op if it loads, else the reference with one warning; ``$DCLENS_VOTE_OP``
        can force either, see :mod:`dclens.datalens.vote_op`).  The result is the same.
    """
    grads = _check_grads(grads, topk)
    if method not in (Aggregation.TOPK_STOCHASTIC_SIGN, Aggregation.TOPK_SIGN):
        raise ValueError(f"unknown aggregation method {method!r}")
    stochastic = method is Aggregation.TOPK_STOCHASTIC_SIGN
    if uniforms is None and stochastic:
        raise ValueError("the stochastic sign needs uniform draws")
    if vote_op.resolve(backend) is Backend.CUSTOM:
        return vote_op.topk_sign_vote(grads, uniforms if stochastic else None, topk=topk,
                                      max_grad=max_grad, stochastic=stochastic)
    if uniforms is None:
        uniforms = tf.zeros(tf.concat([tf.shape(grads)[:2], [topk]], 0), tf.float32)
    return _vote_sum(grads, uniforms, topk, float(max_grad), method)


def klevel_values(grads: tf.Tensor, uniforms: tf.Tensor, *, levels: int,
                  bound: float) -> tf.Tensor:
    """D2P-Fed's stochastic L-level quantisation (paper Alg. 5, no rotation), per teacher.

    Every coordinate g is clipped to [-c, c] (c = ``bound``), placed on the grid
    m_r = -c + r * 2c / (L - 1), r = 0..L-1, and rounded to a neighbour at random:
    with m_r <= g <= m_{r+1}, level r + 1 with probability (g - m_r) / (m_{r+1} - m_r),
    else level r (unbiased).  Level r is released as the value -L/2 + r (the authors'
    ``stochastic_klevel``), so every value lies in [-L/2, L/2 - 1]: one teacher moves each
    coordinate of the sum by at most L - 1, i.e. the L2 sensitivity is (L - 1) sqrt(D).

    Args: grads float32 [T, B, D]; uniforms float32 [T, B, D] in [0, 1), one per
    coordinate.  Returns float32 [T, B, D].
    """
    grads = tf.convert_to_tensor(grads, tf.float32)
    uniforms = tf.convert_to_tensor(uniforms, tf.float32)
    if uniforms.shape != grads.shape:
        raise ValueError(f"klevel needs one uniform per coordinate: shape {grads.shape}, "
                         f"got {uniforms.shape}")
    step = 2.0 * bound / (levels - 1)
    position = (tf.clip_by_value(grads, -bound, bound) + bound) / step     # in [0, L-1]
    lower = tf.clip_by_value(tf.floor(position), 0.0, float(levels - 2))
    level = lower + tf.cast(uniforms < position - lower, tf.float32)
    return level - levels / 2.0


def count_sketch(config: TopAggConfig, dim: int) -> CountSketch:
    """FetchSGD's count sketch for images of ``dim`` values (public hashes from the
    config's seed)."""
    return CountSketch(dim, rows=config.sketch_rows, columns=config.sketch_columns,
                       seed=config.sketch_seed)


def sensitivity(config: TopAggConfig, dim: int) -> float:
    """The L2 sensitivity of one call's noised statistic, for images of ``dim`` values:
    what one teacher's vote can move it by (replace-one adjacency).

    * top-k signs (stochastic or deterministic, thresholded or not): 2 sqrt(k) -- k votes
      in {-1, +1} can all flip;
    * the stochastic sign on all D coordinates: 2 sqrt(D);
    * D2P-Fed's L-level quantisation: (L - 1) sqrt(D) -- each value lies in
      [-L/2, L/2 - 1];
    * FetchSGD: the count sketch's bound for k-sparse {-1, +1} changes
      (:meth:`dclens.datalens.sketch.CountSketch.sensitivity`); under the authors'
      unproven accounting, their 2 sqrt(k).
    """
    method = config.method
    if method is Aggregation.FETCHSGD:
        if config.sketch_accounting is SketchAccounting.AUTHORS_UNPROVEN:
            return 2.0 * math.sqrt(config.topk)              # the authors' charge
        return count_sketch(config, dim).sensitivity(config.topk)
    if method in TOPK_METHODS:
        return 2.0 * math.sqrt(config.topk)
    if method is Aggregation.NO_TOPK:
        return 2.0 * math.sqrt(dim)
    return (config.klevel - 1) * math.sqrt(dim)


def noise_multiplier(config: TopAggConfig, dim: int) -> float:
    """sigma / :func:`sensitivity`: the noise in units of the L2 sensitivity of one call."""
    return config.sigma / sensitivity(config, dim)


#: Largest image dimension for which D2P-Fed's dense D x D rotation is built (64 MiB).
MAX_ROTATION_DIM = 4096


def random_rotation(dim: int, seed: int) -> np.ndarray:
    """A Haar-random orthogonal matrix float32 [D, D] from a public seed (QR of a Gaussian
    matrix with the signs of R's diagonal folded in)."""
    if dim > MAX_ROTATION_DIM:
        raise ValueError(f"a dense random rotation of dimension {dim} is too large (limit "
                         f"{MAX_ROTATION_DIM}); run D2P-Fed without --klevel_rotation")
    gaussian = np.random.default_rng(seed).standard_normal((dim, dim))
    q, r = np.linalg.qr(gaussian)
    return (q * np.sign(np.diag(r))).astype(np.float32)


def klevel_sum(grads: tf.Tensor, uniforms: tf.Tensor, *, levels: int,
               bound: float) -> tf.Tensor:
    """sum over teachers of :func:`klevel_values`: float32 [B, D] (exact: multiples of
    1/2 far below 2^24)."""
    return tf.reduce_sum(klevel_values(grads, uniforms, levels=levels, bound=bound), axis=0)


def threshold_votes(noisy_sum: tf.Tensor, threshold: float) -> tf.Tensor:
    """+1 where noisy_sum >= threshold, -1 where <= -threshold, else 0 (float32)."""
    noisy_sum = tf.convert_to_tensor(noisy_sum, tf.float32)
    return (tf.cast(noisy_sum >= threshold, tf.float32)
            - tf.cast(noisy_sum <= -threshold, tf.float32))


@dataclasses.dataclass(frozen=True)
class TopAggResult:
    """What one TopAgg round releases, and what it cost.

    Attributes:
      update: float32 [B, D]: the thresholded noisy vote (g_bar) in {-1, 0, +1}; for the
        methods without threshold (:data:`dclens.datalens.config.UNTHRESHOLDED_METHODS`)
        the noisy vote sum / k, real-valued.
      event: the DP event spent (B Gaussian mechanisms with noise multiplier
        sigma / (2 sqrt(k))), or ``NonPrivateDpEvent`` when sigma = 0.
      queries: B, the number of TopAgg queries (fake images) in the round.
      pass_fraction: fraction of coordinates whose noisy vote passed the threshold (the
        fraction of non-zero coordinates; 1 without threshold, but for exact zeros).
    """

    update: tf.Tensor
    event: dp_accounting.DpEvent
    queries: int
    pass_fraction: float
    #: False only under FetchSGD's authors' accounting, which no proof supports.
    accounting_proven: bool = True


class TopAgg:
    """The TopAgg mechanism for an ensemble of ``num_teachers`` teachers.

    Usage, chunk by chunk of teachers::

        total = sum(topagg.vote_sum(grads_chunk, seed=...) for each chunk)
        result = topagg.release(total, seed=...)

    ``sigma = 0`` is allowed only with ``allow_no_noise=True`` (``--non_private``); the
    released update is then not private and its event says so.  ``dim`` (the image
    dimension D) is needed by the variants without top-k, whose sensitivity depends on it.
    """

    def __init__(self, config: TopAggConfig, *, num_teachers: int,
                 allow_no_noise: bool = False, dim: int | None = None):
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be >= 1, got {num_teachers!r}")
        if config.sigma == 0 and not allow_no_noise:
            raise ValueError("sigma = 0 gives no privacy; pass allow_no_noise=True "
                             "(--non_private) to run without noise")
        if dim is None and config.method not in TOPK_METHODS:
            raise ValueError(f"aggregation {config.method.value!r} needs the image "
                             f"dimension (dim=)")
        self.config = config
        self.num_teachers = num_teachers
        self.dim = dim
        self.sketch = (count_sketch(config, dim) if config.method is Aggregation.FETCHSGD
                       else None)
        self.rotation = (tf.constant(random_rotation(dim, config.rotation_seed))
                         if config.method is Aggregation.KLEVEL and config.klevel_rotation
                         else None)
        self._sensitivity = sensitivity(config, dim or 0)

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of one call's noised statistic (see :class:`Aggregation`)."""
        return self._sensitivity

    @property
    def _noise_on_sketch(self) -> bool:
        return (self.sketch is not None
                and self.config.sketch_accounting is SketchAccounting.PROVEN)

    def noise_shape(self, vote_sum_shape: tuple[int, int]) -> tuple[int, int]:
        """Shape of a round's standard normal draws: the vote sum's [B, D], or the count
        sketch's [B, rows * columns] for FetchSGD with the proven accounting."""
        if self._noise_on_sketch:
            return (vote_sum_shape[0], self.sketch.rows * self.sketch.columns)
        return tuple(vote_sum_shape)

    @property
    def noise_multiplier(self) -> float:
        return self.config.sigma / self.sensitivity

    def uniform_count(self, dim: int) -> int:
        """Uniform draws per teacher and image: k (top-k order) for the top-k stochastic
        sign, D for the stochastic sign on all coordinates (top-k order) and for k-level
        quantisation (coordinate order), 0 for the deterministic sign (thresholded or not)."""
        method = self.config.method
        if method in DETERMINISTIC_SIGN_METHODS:
            return 0
        if method in TOPK_METHODS or method is Aggregation.FETCHSGD:
            return self.config.topk
        return dim

    @property
    def threshold(self) -> float:
        """beta * N, in votes."""
        return self.config.thresh * self.num_teachers

    def uniforms(self, num_teachers: int, num_images: int, seed: tf.Tensor,
                 dim: int | None = None) -> tf.Tensor:
        """The U[0, 1) draws [T, B, :meth:`uniform_count`] for a stateless seed."""
        count = self.uniform_count(dim if dim is not None else self.dim or 0)
        return tf.random.stateless_uniform((num_teachers, num_images, count),
                                           seed=seed, dtype=tf.float32)

    def vote_sum(self, grads: tf.Tensor, *, seed: tf.Tensor | None = None,
                 uniforms: tf.Tensor | None = None) -> tf.Tensor:
        """Summed votes [B, D] of a chunk of teachers' gradients [T, B, ...] (int32; float32
        k-level values for D2P-Fed).

        The draws are :meth:`uniforms` of ``seed``, or ``uniforms`` [T, B,
        :meth:`uniform_count`] when given (see :mod:`dclens.datalens.draws`); the deterministic
        sign needs neither.  Uses the custom op when it is available (``backend="auto"``,
        see :func:`summed_votes`).  A teacher's row that is not finite votes as an all-zero
        gradient (:func:`zero_nonfinite_rows`), so the sensitivity holds for every input.
        """
        grads = tf.reshape(tf.convert_to_tensor(grads, tf.float32),
                           (grads.shape[0], grads.shape[1], -1))
        grads = zero_nonfinite_rows(grads)
        dim = int(grads.shape[-1])
        method = self.config.method
        if self.uniform_count(dim):
            if (seed is None) == (uniforms is None):
                raise ValueError("this aggregation needs exactly one of seed= and uniforms=")
            if uniforms is None:
                uniforms = self.uniforms(grads.shape[0], grads.shape[1], seed, dim)
        else:
            uniforms = None
        if method is Aggregation.KLEVEL:
            if self.rotation is not None:     # R clip(g), per teacher and image
                clipped = tf.clip_by_value(grads, -self.config.max_grad, self.config.max_grad)
                grads = tf.linalg.matmul(clipped, self.rotation, transpose_b=True)
            return klevel_sum(grads, uniforms, levels=self.config.klevel,
                              bound=self.config.max_grad)
        if method in DETERMINISTIC_SIGN_METHODS:     # with or without threshold
            return summed_votes(grads, None, topk=self.config.topk,
                                max_grad=self.config.max_grad, method=Aggregation.TOPK_SIGN,
                                backend=Backend.AUTO)
        # The stochastic sign on the top-k (also FetchSGD's votes: its sketch is linear, so
        # release sketches the sum), or on all D coordinates (k = D).
        topk = dim if method is Aggregation.NO_TOPK else self.config.topk
        return summed_votes(grads, uniforms, topk=topk, max_grad=self.config.max_grad,
                            method=Aggregation.TOPK_STOCHASTIC_SIGN, backend=Backend.AUTO)

    def event(self, num_images: int) -> dp_accounting.DpEvent:
        """The DP event of one round over ``num_images`` fake images (one query each)."""
        if self.config.sigma > 0:
            return accounting.gaussian_queries_event(noise_multiplier=self.noise_multiplier,
                                                     queries=num_images)
        return dp_accounting.NonPrivateDpEvent()

    def release(self, vote_sum: tf.Tensor, *, seed: tf.Tensor | None = None,
                noise: tf.Tensor | None = None) -> TopAggResult:
        """Adds N(0, sigma^2) to every coordinate of the vote sum [B, D] and thresholds
        (or, for :data:`dclens.datalens.config.UNTHRESHOLDED_METHODS`, divides by k: the
        update is (vote sum + noise) / k, post-processing of the Gaussian mechanism).

        The noise is sigma times standard normal draws: those of the stateless ``seed``, or
        ``noise`` (float32, the vote sum's shape) when given -- only for replaying another
        implementation's draws; noise that anyone knows is no privacy.
        """
        if (seed is None) == (noise is None):
            raise ValueError("release needs exactly one of seed= and noise=")
        vote_sum = tf.cast(vote_sum, tf.float32)
        num_images = int(vote_sum.shape[0])
        if noise is None:
            noise = tf.random.stateless_normal(self.noise_shape(tuple(vote_sum.shape)),
                                               seed=seed, dtype=tf.float32)
        else:
            noise = tf.convert_to_tensor(noise, tf.float32)
            want = self.noise_shape(tuple(vote_sum.shape))
            if tuple(noise.shape) != want:
                raise ValueError(f"noise must have shape {want} (the vote sum's, or the "
                                 f"sketch's for FetchSGD), got {tuple(noise.shape)}")
        if self.sketch is not None:
            update = self._fetchsgd_release(vote_sum, noise)
        elif self.config.method in UNTHRESHOLDED_METHODS:
            noisy = vote_sum + self.config.sigma * noise
            update = noisy / float(self.config.topk)      # post-processing, as the authors'
        else:
            update = threshold_votes(vote_sum + self.config.sigma * noise, self.threshold)
        passed = float(tf.reduce_mean(tf.cast(update != 0, tf.float32)))
        if self.rotation is not None:         # back from the rotated basis: R^T g_bar
            update = tf.linalg.matmul(update, self.rotation)
        return TopAggResult(update, self.event(num_images), num_images, passed,
                            accounting_proven=self.config.accounting_proven)

    def _fetchsgd_release(self, vote_sum: tf.Tensor, noise: tf.Tensor) -> tf.Tensor:
        """FetchSGD: unsketch, keep the top-k of |estimate|, threshold at +-beta N.

        Proven accounting: the noise is on the sketch of the vote sum (the statistic whose
        sensitivity :meth:`dclens.datalens.sketch.CountSketch.sensitivity` bounds); everything after
        is post-processing.  The authors': unsketch and top-k first, then the noise on every
        coordinate of that vector (their ``sketchtopk_aggregate``).
        """
        sketch, sigma, k = self.sketch, self.config.sigma, self.config.topk
        table = sketch.sketch(vote_sum)
        if self._noise_on_sketch:
            table = table + sigma * tf.reshape(noise, tf.shape(table))
        estimate = sketch.unsketch(table)
        kept = tf.math.top_k(tf.abs(estimate), k=k).indices
        mask = tf.reduce_sum(tf.one_hot(kept, tf.shape(estimate)[-1]), axis=1)
        estimate = estimate * mask
        if not self._noise_on_sketch:
            estimate = estimate + sigma * noise
        return threshold_votes(estimate, self.threshold)

    def __call__(self, grads: tf.Tensor, *, vote_seed: tf.Tensor,
                 noise_seed: tf.Tensor) -> TopAggResult:
        """One round over all teachers at once: grads [N, B, ...] -> update [B, D]."""
        if grads.shape[0] != self.num_teachers:
            raise ValueError(f"expected gradients of {self.num_teachers} teachers, got "
                             f"{grads.shape[0]}")
        return self.release(self.vote_sum(grads, seed=vote_seed), seed=noise_seed)
