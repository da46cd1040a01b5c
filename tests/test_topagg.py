"""Tests for dclens.datalens.topagg: top-k (stochastic) sign voting, Gaussian noise, threshold.

Strategy:

* The voting (``teacher_votes`` and the fast path ``summed_votes``) is checked *exactly*
  against ``_reference_votes``, a slow numpy loop over teachers, images and ranks that
  follows the paper's Alg. 2 literally.  The stochastic sign is made deterministic by
  passing the uniform draws explicitly, so exact equality is required there too.
* Randomised behaviour (the unbiasedness of the stochastic sign, the Gaussian noise of
  ``release``) is checked statistically with z-tests at 6 standard errors: the two-sided
  false-failure probability of one such check is ~2e-9 (< 1e-6 even over the few hundred
  checks in this file), and all seeds are fixed, so the tests are deterministic anyway.
* ``sigma = 0`` (``allow_no_noise=True``) makes ``release`` and ``__call__`` exact.
"""

from __future__ import annotations

import math
import zlib

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from dclens.privacy import accounting
from dclens.datalens import topagg
from dclens.privacy.accounting import Conversion, PrivacyLedger
from dclens.datalens.config import Aggregation, TopAggConfig

STOCH = Aggregation.TOPK_STOCHASTIC_SIGN
SIGN = Aggregation.TOPK_SIGN
METHODS = [STOCH, SIGN]

# 6 standard errors: P(|Z| > 6) ~ 2e-9 per check.
Z_TOL = 6.0


# --------------------------------------------------------------------------------------
# The slow, obviously correct references.
# --------------------------------------------------------------------------------------

def _reference_votes(grads: np.ndarray, uniforms: np.ndarray | None, *, topk: int,
                     max_grad: float, method: Aggregation) -> np.ndarray:
    """Dense votes int32 [T, B, D], one teacher, one image and one rank at a time.

    All arithmetic is float32, as in the TF code, so that equality can be exact.
    """
    grads = np.asarray(grads, np.float32)
    t_count, b_count, dim = grads.shape
    c = np.float32(max_grad)
    one, two = np.float32(1.0), np.float32(2.0)
    votes = np.zeros((t_count, b_count, dim), np.int32)
    for t in range(t_count):
        for b in range(b_count):
            g = grads[t, b]
            # Largest |g| first; ties: lower index first (stable sort).
            order = np.argsort(-np.abs(g), kind="stable")
            idx = order[:topk]
            clipped = np.clip(g[idx], -c, c)
            s = np.max(np.abs(clipped))
            if s == 0:
                normalised = np.zeros_like(clipped)
            else:
                normalised = clipped / s
            for j in range(topk):
                n = normalised[j]
                if method is STOCH:
                    vote = 1 if uniforms[t, b, j] < (one + n) / two else -1
                elif method is SIGN:
                    vote = 1 if n >= 0 else -1
                else:
                    raise AssertionError(method)
                votes[t, b, idx[j]] = vote
    return votes


def _reference_threshold(values: np.ndarray, threshold: float) -> np.ndarray:
    """+1 where >= threshold, -1 where <= -threshold, else 0, one value at a time.

    With threshold 0 a value of exactly 0 satisfies both; it then votes neither way (0).
    """
    out = np.zeros(values.shape, np.float32)
    for i, v in np.ndenumerate(values):
        plus, minus = v >= threshold, v <= -threshold
        if plus and not minus:
            out[i] = 1.0
        elif minus and not plus:
            out[i] = -1.0
    return out


def _phi(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _assert_binomial(observed_fraction: float, p: float, n: int, what: str) -> None:
    """z-test of a binomial fraction: |obs - p| <= 6 * sqrt(p (1 - p) / n)."""
    se = math.sqrt(p * (1.0 - p) / n)
    assert abs(observed_fraction - p) <= Z_TOL * se, (
        f"{what}: observed {observed_fraction:.6f}, expected {p:.6f} "
        f"(6 SE = {Z_TOL * se:.6f})")


# --------------------------------------------------------------------------------------
# Inputs.
# --------------------------------------------------------------------------------------

def _grads(kind: str, shape: tuple[int, int, int], seed: int) -> np.ndarray:
    """float32 gradients of one of several kinds; clip bound to use is _CLIP[kind]."""
    rng = np.random.default_rng(seed)
    if kind == "normal":  # Paper scale: c = 1e-5, |g| ~ 1e-5, some clipped, some not.
        g = rng.normal(scale=1e-5, size=shape)
    elif kind == "ties":  # Integers with many repeats (ties within and across top-k).
        g = rng.integers(-3, 4, size=shape)
    elif kind == "zeros_mixed":  # Every other image all-zero, the others sparse ints.
        g = rng.integers(-2, 3, size=shape) * (rng.uniform(size=shape) < 0.05)
        g[:, ::2, :] = 0.0
    elif kind == "beyond_clip":  # Almost everything beyond c: n = +-1 for most.
        g = rng.normal(scale=10.0, size=shape)
    else:
        raise AssertionError(kind)
    return np.asarray(g, np.float32)


def _seed(*parts) -> int:
    """A seed derived from test parameters (not hash(): strings hash differently per run)."""
    return zlib.crc32(repr(parts).encode())


_CLIP = {"normal": 1e-5, "ties": 2.0, "zeros_mixed": 1.5, "beyond_clip": 0.5}

# (shape [T, B, D], k): paper shapes with fewer teachers (MNIST 28x28x1 with k = 200,
# CelebA 64x64x3 with k = 700), and the edge cases k = 1 and k = D.
SHAPES = [((3, 15, 784), 200), ((2, 4, 12288), 700), ((4, 3, 10), 1), ((4, 3, 10), 10),
          ((2, 2, 7), 7)]


def _uniforms(shape: tuple[int, int, int], topk: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1000)
    return rng.uniform(size=(shape[0], shape[1], topk)).astype(np.float32)


# --------------------------------------------------------------------------------------
# 0. The tie rule of tf.math.top_k that the module relies on.
# --------------------------------------------------------------------------------------

def test_tf_top_k_breaks_ties_by_lower_index_like_a_stable_argsort():
    values = tf.constant([1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 0.0, 2.0])
    _, idx = tf.math.top_k(values, k=8, sorted=True)
    # 3.0 at indices 1, 2, 4; then 2.0 at 3, 7; then 1.0 at 0; then 0.0 at 5, 6.
    np.testing.assert_array_equal(idx.numpy(), [1, 2, 4, 3, 7, 0, 5, 6])
    # And on large tie-heavy inputs for several k (TF's CPU kernel switches algorithms).
    x = np.abs(np.random.default_rng(0).integers(-2, 3, size=(2, 12288))).astype(np.float32)
    for k in (1, 5, 700, 6000, 12288):
        _, idx = tf.math.top_k(x, k=k, sorted=True)
        for row in range(2):
            np.testing.assert_array_equal(
                idx.numpy()[row], np.argsort(-x[row], kind="stable")[:k], err_msg=f"k={k}")


def test_reference_on_a_hand_example():
    # The reference itself must be right: g = [0.5, -3, 0, 0.5], k = 3, c = 1.
    # |g| order (stable): -3 (idx 1), 0.5 (idx 0), 0.5 (idx 3); clipped [-1, 0.5, 0.5];
    # s = 1; n = [-1, 0.5, 0.5]; deterministic votes idx1 -1, idx0 +1, idx3 +1.
    g = np.array([[[0.5, -3.0, 0.0, 0.5]]], np.float32)
    np.testing.assert_array_equal(
        _reference_votes(g, None, topk=3, max_grad=1.0, method=SIGN), [[[1, -1, 0, 1]]])
    # Stochastic with u = [0.1, 0.8, 0.7] by rank: rank 0 (n=-1): 0.1 < 0 no -> -1;
    # rank 1 (idx 0, n=0.5): 0.8 < 0.75 no -> -1; rank 2 (idx 3): 0.7 < 0.75 -> +1.
    u = np.array([[[0.1, 0.8, 0.7]]], np.float32)
    np.testing.assert_array_equal(
        _reference_votes(g, u, topk=3, max_grad=1.0, method=STOCH), [[[-1, -1, 0, 1]]])


# --------------------------------------------------------------------------------------
# 1. teacher_votes == reference, exactly.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.value)
@pytest.mark.parametrize("kind", ["normal", "ties", "zeros_mixed", "beyond_clip"])
@pytest.mark.parametrize("shape,topk", SHAPES, ids=lambda v: str(v))
def test_teacher_votes_equal_reference(shape, topk, kind, method):
    g = _grads(kind, shape, seed=_seed(shape, topk, kind))
    u = _uniforms(shape, topk, seed=topk)
    c = _CLIP[kind]
    got = topagg.teacher_votes(tf.constant(g), tf.constant(u) if method is STOCH else None,
                               topk=topk, max_grad=c, method=method)
    assert got.dtype == tf.int32
    want = _reference_votes(g, u, topk=topk, max_grad=c, method=method)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.value)
def test_all_zero_gradient_still_votes_on_exactly_k_coordinates(method):
    # All ties: the k lowest indices are chosen; n = 0, so the deterministic sign votes +1
    # and the stochastic sign votes +1 iff u < 1/2.
    g = np.zeros((2, 3, 9), np.float32)
    u = _uniforms(g.shape, 4, seed=7)
    got = topagg.teacher_votes(tf.constant(g), tf.constant(u), topk=4, max_grad=1e-5,
                               method=method).numpy()
    assert np.all(np.count_nonzero(got, axis=-1) == 4)
    assert np.all(got[..., 4:] == 0)
    if method is SIGN:
        assert np.all(got[..., :4] == 1)
    else:
        np.testing.assert_array_equal(got[..., :4], np.where(u < 0.5, 1, -1))
    np.testing.assert_array_equal(
        got, _reference_votes(g, u, topk=4, max_grad=1e-5, method=method))


def test_clipping_happens_before_normalisation():
    # g = [10, 0.5, -0.25], c = 1: clipped [1, 0.5, -0.25], n = [1, 0.5, -0.25].
    # Without clipping n would be [1, 0.05, -0.025].  u = 0.7 at rank 1 (idx 1):
    # 0.7 < (1 + 0.5) / 2 = 0.75 -> +1 (unclipped: 0.7 < 0.525 is false -> -1).
    # u = 0.45 at rank 2 (idx 2): 0.45 < 0.375 false -> -1 (unclipped: 0.45 < 0.4875 -> +1).
    g = tf.constant([[[10.0, 0.5, -0.25]]])
    u = tf.constant([[[0.99, 0.7, 0.45]]])
    got = topagg.teacher_votes(g, u, topk=3, max_grad=1.0, method=STOCH)
    np.testing.assert_array_equal(got.numpy(), [[[1, 1, -1]]])


# --------------------------------------------------------------------------------------
# 2. Exactly k non-zeros in {-1, +1} per teacher and image.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.value)
def test_each_teacher_votes_exactly_k_times_with_plus_minus_one(method):
    rng = np.random.default_rng(123)
    for trial in range(40):
        t, b, d = rng.integers(1, 5), rng.integers(1, 5), rng.integers(1, 300)
        k = int(rng.integers(1, d + 1))
        kind = ["normal", "ties", "zeros_mixed", "beyond_clip"][trial % 4]
        g = _grads(kind, (t, b, d), seed=trial)
        u = rng.uniform(size=(t, b, k)).astype(np.float32)
        votes = topagg.teacher_votes(tf.constant(g), tf.constant(u), topk=k,
                                     max_grad=_CLIP[kind], method=method).numpy()
        assert votes.shape == (t, b, d)
        assert np.all(np.count_nonzero(votes, axis=-1) == k), (trial, t, b, d, k)
        assert set(np.unique(votes)) <= {-1, 0, 1}
        assert np.all(np.abs(votes).sum(axis=-1) == k)


# --------------------------------------------------------------------------------------
# 3. The fast path summed_votes == teacher_votes(...).sum(0) == reference sum.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.value)
@pytest.mark.parametrize("kind", ["normal", "ties", "zeros_mixed"])
@pytest.mark.parametrize("shape,topk", SHAPES, ids=lambda v: str(v))
def test_summed_votes_equals_sum_of_teacher_votes(shape, topk, kind, method):
    g = _grads(kind, shape, seed=_seed(kind, shape))
    u = _uniforms(shape, topk, seed=3)
    uu = tf.constant(u) if method is STOCH else None
    fast = topagg.summed_votes(tf.constant(g), uu, topk=topk, max_grad=_CLIP[kind],
                               method=method)
    assert fast.dtype == tf.int32
    assert fast.shape == (shape[1], shape[2])
    dense = topagg.teacher_votes(tf.constant(g), uu, topk=topk, max_grad=_CLIP[kind],
                                 method=method)
    np.testing.assert_array_equal(fast.numpy(), dense.numpy().sum(axis=0))
    np.testing.assert_array_equal(
        fast.numpy(),
        _reference_votes(g, u, topk=topk, max_grad=_CLIP[kind], method=method).sum(0))


def test_summed_votes_is_not_fooled_by_tf_function_tracing():
    # _vote_sum is a tf.function taking topk, max_grad and method as Python values; a
    # stale trace reused across different values would give wrong votes.
    rng = np.random.default_rng(5)
    g = rng.normal(size=(3, 2, 20)).astype(np.float32)
    for k, c, method in [(2, 0.5, SIGN), (5, 0.5, SIGN), (2, 0.5, STOCH), (2, 0.1, STOCH),
                         (5, 0.1, SIGN), (2, 0.5, SIGN), (20, 2.0, STOCH), (1, 2.0, SIGN)]:
        u = rng.uniform(size=(3, 2, k)).astype(np.float32)
        for t, b in [(3, 2), (1, 2), (3, 1)]:  # Also different (dynamic) shapes.
            got = topagg.summed_votes(tf.constant(g[:t, :b]), tf.constant(u[:t, :b]),
                                      topk=k, max_grad=c, method=method)
            want = _reference_votes(g[:t, :b], u[:t, :b], topk=k, max_grad=c,
                                    method=method).sum(0)
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{k} {c} {method}")


def test_summed_votes_stochastic_without_uniforms_raises_like_teacher_votes():
    # teacher_votes refuses the stochastic sign without uniforms; summed_votes is
    # documented to equal teacher_votes(...).sum(0), so it must refuse too.
    # BUG (dclens/datalens/topagg.py, summed_votes): it replaces uniforms=None by zeros *before*
    # looking at the method, so the stochastic sign silently votes with u = 0, i.e. +1 on
    # every top-k coordinate whose normalised value is > -1 (a heavily biased vote)
    # instead of raising.  This test fails until that is fixed.
    g = tf.constant(np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32))
    with pytest.raises(ValueError, match="uniform"):
        topagg.teacher_votes(g, None, topk=3, max_grad=1.0, method=STOCH)
    with pytest.raises(ValueError, match="uniform"):
        topagg.summed_votes(g, None, topk=3, max_grad=1.0, method=STOCH)


# --------------------------------------------------------------------------------------
# 4. The stochastic sign is unbiased (statistical).
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("g,c,n", [
    # c = 1, |g| < c: no clipping; s = 0.5, so n = g / 0.5.
    ([0.5, -0.5, 0.0, 0.25, -0.25, 0.45, -0.05, 0.125], 1.0,
     [1.0, -1.0, 0.0, 0.5, -0.5, 0.9, -0.1, 0.25]),
    # c = 0.1: 0.3 and -0.2 are clipped to +-0.1 first; s = 0.1.
    ([0.3, -0.2, 0.05, -0.025, 0.0, 0.09], 0.1,
     [1.0, -1.0, 0.5, -0.25, 0.0, 0.9]),
], ids=["unclipped", "clipped"])
def test_stochastic_sign_is_unbiased(g, c, n):
    # M teachers with the same gradient, k = D, each drawing its own uniforms through
    # TopAgg.vote_sum: the summed vote / M is the mean of M iid votes with mean n.  A +-1
    # vote with mean n has variance 1 - n^2, so the standard error is sqrt((1 - n^2) / M);
    # we allow 6 standard errors (n = +-1 has variance 0: the vote must be exact).
    m = 200_000
    d = len(g)
    agg = topagg.TopAgg(TopAggConfig(topk=d, sigma=1.0, thresh=0.0, max_grad=c,
                                     method=STOCH), num_teachers=m)
    grads = tf.constant(np.tile(np.asarray(g, np.float32), (m, 1, 1)))
    mean = agg.vote_sum(grads, seed=tf.constant([11, 12])).numpy()[0] / m
    n = np.asarray(n)
    se = np.sqrt((1.0 - n**2) / m)
    assert np.all(np.abs(mean - n) <= Z_TOL * se), (mean, n, Z_TOL * se)


# --------------------------------------------------------------------------------------
# TopAgg.vote_sum wiring: its uniforms, flattening and seeds.
# --------------------------------------------------------------------------------------

def test_vote_sum_uses_stateless_uniforms_and_flattens_images():
    cfg = TopAggConfig(topk=50, sigma=3.0, thresh=0.5, max_grad=1e-5, method=STOCH)
    agg = topagg.TopAgg(cfg, num_teachers=4)
    g = np.random.default_rng(9).normal(scale=1e-5, size=(4, 3, 8, 8, 3)).astype(np.float32)
    seed = tf.constant([3, 4])
    got = agg.vote_sum(tf.constant(g), seed=seed).numpy()
    u = tf.random.stateless_uniform((4, 3, 50), seed=seed, dtype=tf.float32).numpy()
    np.testing.assert_array_equal(agg.uniforms(4, 3, seed).numpy(), u)
    want = _reference_votes(g.reshape(4, 3, -1), u, topk=50, max_grad=1e-5,
                            method=STOCH).sum(0)
    np.testing.assert_array_equal(got, want)
    # Same seed: identical; another seed: different draws, different votes.
    np.testing.assert_array_equal(agg.vote_sum(tf.constant(g), seed=seed).numpy(), got)
    other = agg.vote_sum(tf.constant(g), seed=tf.constant([3, 5])).numpy()
    assert np.any(other != got)


# --------------------------------------------------------------------------------------
# 5. sigma = 0: exact release.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("thresh,n_teachers", [(0.6, 5), (0.5, 7), (0.0, 3), (0.9, 10)])
def test_release_without_noise_is_exactly_the_threshold(thresh, n_teachers):
    cfg = TopAggConfig(topk=3, sigma=0.0, thresh=thresh)
    agg = topagg.TopAgg(cfg, num_teachers=n_teachers, allow_no_noise=True)
    assert agg.threshold == thresh * n_teachers
    rng = np.random.default_rng(n_teachers)
    vote_sum = rng.integers(-n_teachers, n_teachers + 1, size=(6, 50)).astype(np.int32)
    result = agg.release(tf.constant(vote_sum), seed=tf.constant([1, 2]))
    want = _reference_threshold(vote_sum.astype(np.float64), thresh * n_teachers)
    assert result.update.dtype == tf.float32
    np.testing.assert_array_equal(result.update.numpy(), want)
    assert isinstance(result.event, dp_accounting.NonPrivateDpEvent)
    assert result.queries == 6
    assert result.pass_fraction == pytest.approx(np.mean(np.abs(want)), abs=1e-7)


def test_integer_threshold_is_inclusive_without_noise():
    # beta * N = 0.6 * 5 = 3.0 exactly: vote sums +-3 pass, +-2 do not.
    agg = topagg.TopAgg(TopAggConfig(topk=1, sigma=0.0, thresh=0.6), num_teachers=5,
                        allow_no_noise=True)
    assert agg.threshold == 3.0
    result = agg.release(tf.constant([[3, -3, 2, -2, 5, -5, 0]]), seed=tf.constant([0, 0]))
    np.testing.assert_array_equal(result.update.numpy(), [[1, -1, 0, 0, 1, -1, 0]])
    assert result.pass_fraction == pytest.approx(4 / 7)


def test_zero_sigma_requires_allow_no_noise():
    with pytest.raises(ValueError, match="allow_no_noise"):
        topagg.TopAgg(TopAggConfig(sigma=0.0), num_teachers=3)
    topagg.TopAgg(TopAggConfig(sigma=0.0), num_teachers=3, allow_no_noise=True)


# --------------------------------------------------------------------------------------
# 6. threshold_votes.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("thr", [2.5, 3600.0, 1.0, 0.75])
def test_threshold_votes_boundaries(thr):
    t = np.float32(thr)
    inside_pos = np.nextafter(t, np.float32(0))
    inside_neg = np.nextafter(-t, np.float32(0))
    outside_pos = np.nextafter(t, np.float32(np.inf))
    outside_neg = np.nextafter(-t, np.float32(-np.inf))
    values = np.array([t, -t, inside_pos, inside_neg, outside_pos, outside_neg, 0.0,
                       1e9, -1e9], np.float32)
    got = topagg.threshold_votes(tf.constant(values), thr)
    assert got.dtype == tf.float32
    np.testing.assert_array_equal(got.numpy(), [1, -1, 0, 0, 1, -1, 0, 1, -1])


def test_threshold_zero_is_a_strict_sign_with_ties_at_zero():
    # beta = 0 is allowed (0 <= thresh < 1); the two rules overlap at exactly 0, and
    # threshold_votes gives 0 there (1 - 1): an exact tie votes neither way.
    values = np.array([0.0, -0.0, 1e-30, -1e-30, 5.0, -5.0], np.float32)
    np.testing.assert_array_equal(topagg.threshold_votes(values, 0.0).numpy(),
                                  [0, 0, 1, -1, 1, -1])


def test_threshold_votes_matches_reference_on_random_values():
    rng = np.random.default_rng(4)
    values = rng.normal(scale=3.0, size=(7, 13)).astype(np.float32)
    values[0, :4] = [2.0, -2.0, 1.9999999, -1.9999999]
    np.testing.assert_array_equal(topagg.threshold_votes(values, 2.0).numpy(),
                                  _reference_threshold(values, np.float32(2.0)))


# --------------------------------------------------------------------------------------
# 7. The noise: std sigma, independent per coordinate and image, seeded.
# --------------------------------------------------------------------------------------

# (sigma, thresh, N, vote-sum offset m): the F-MNIST eps=1 preset, the demo preset, and
# the F-MNIST eps=10 preset with a non-zero vote sum.
NOISE_CASES = [(5000.0, 0.9, 4000, 0.0), (40.0, 0.3, 200, 0.0), (1000.0, 0.27, 4000, 500.0)]


@pytest.mark.parametrize("sigma,thresh,n_teachers,offset", NOISE_CASES)
def test_release_noise_has_std_sigma(sigma, thresh, n_teachers, offset):
    # update = +1 iff m + sigma Z >= t, -1 iff m + sigma Z <= -t (t = beta N, Z ~ N(0,1)),
    # so P(+1) = 1 - Phi((t - m) / sigma) and P(-1) = Phi((-t - m) / sigma).  Each of the
    # n = B*D coordinates is an independent Bernoulli, so the observed fractions are
    # checked at 6 binomial standard errors sqrt(p (1 - p) / n).  With n ~ 1e6 this
    # detects an error of ~0.5% in the noise std.
    b, d = 256, 4096
    agg = topagg.TopAgg(TopAggConfig(topk=200, sigma=sigma, thresh=thresh),
                        num_teachers=n_teachers)
    t = thresh * n_teachers
    vote_sum = tf.fill((b, d), offset)
    result = agg.release(vote_sum, seed=tf.constant([7, 8]))
    update = result.update.numpy()
    assert set(np.unique(update)) <= {-1.0, 0.0, 1.0}
    n = b * d
    p_plus = 1.0 - _phi((t - offset) / sigma)
    p_minus = _phi((-t - offset) / sigma)
    _assert_binomial(np.mean(update == 1.0), p_plus, n, "P(+1)")
    _assert_binomial(np.mean(update == -1.0), p_minus, n, "P(-1)")
    assert result.pass_fraction == pytest.approx(np.mean(np.abs(update)), abs=1e-6)
    # Independence across images and across coordinates: two coordinates agree with
    # probability q = p+^2 + p-^2 + p0^2 (noise shared across rows or columns would give
    # agreement 1).  n/2 independent pairs, 6 binomial standard errors.
    p_zero = 1.0 - p_plus - p_minus
    q = p_plus**2 + p_minus**2 + p_zero**2
    _assert_binomial(np.mean(update[: b // 2] == update[b // 2:]), q, n // 2,
                     "agreement across images")
    _assert_binomial(np.mean(update[:, : d // 2] == update[:, d // 2:]), q, n // 2,
                     "agreement across coordinates")


def test_release_noise_is_seeded():
    agg = topagg.TopAgg(TopAggConfig(topk=10, sigma=2.0, thresh=0.1), num_teachers=10)
    vote_sum = tf.constant(np.random.default_rng(0).integers(-10, 11, size=(8, 500)))
    a = agg.release(vote_sum, seed=tf.constant([1, 2])).update.numpy()
    b = agg.release(vote_sum, seed=tf.constant([1, 2])).update.numpy()
    c = agg.release(vote_sum, seed=tf.constant([1, 3])).update.numpy()
    np.testing.assert_array_equal(a, b)
    assert np.mean(a != c) > 0.05  # ~25% of coordinates differ; 0 if the seed is ignored.


# --------------------------------------------------------------------------------------
# 8. The privacy event.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("conversion", list(Conversion), ids=lambda c: c.value)
@pytest.mark.parametrize("sigma,topk,batch", [(5000.0, 200, 30), (700.0, 500, 1),
                                              (40.0, 200, 7)])
def test_release_event_matches_ledger_spend_topagg(sigma, topk, batch, conversion):
    agg = topagg.TopAgg(TopAggConfig(topk=topk, sigma=sigma, thresh=0.5), num_teachers=9)
    result = agg.release(tf.zeros((batch, 20), tf.int32), seed=tf.constant([0, 1]))
    assert result.queries == batch
    z = sigma / (2.0 * math.sqrt(topk))
    if batch == 1:
        assert result.event == dp_accounting.GaussianDpEvent(noise_multiplier=z)
    else:
        assert result.event == dp_accounting.SelfComposedDpEvent(
            event=dp_accounting.GaussianDpEvent(noise_multiplier=z), count=batch)
    assert result.event == accounting.topagg_event(sigma=sigma, topk=topk, queries=batch)
    assert agg.event(batch) == result.event  # The same event, without releasing.
    via_event = PrivacyLedger(delta=1e-5, conversion=conversion)
    via_event.spend(result.event)
    via_event.spend(result.event)  # Two generator steps.
    direct = PrivacyLedger(delta=1e-5, conversion=conversion)
    direct.spend_topagg(sigma=sigma, topk=topk, queries=2 * batch)
    assert via_event.queries == direct.queries == 2 * batch
    assert via_event.epsilon().epsilon == pytest.approx(direct.epsilon().epsilon,
                                                        rel=1e-12)
    assert via_event.epsilon().epsilon > 0


# --------------------------------------------------------------------------------------
# 9. Chunking over teachers.
# --------------------------------------------------------------------------------------

def test_chunked_vote_sums_add_up_to_the_full_sum():
    rng = np.random.default_rng(21)
    g = rng.normal(scale=1e-5, size=(10, 5, 784)).astype(np.float32)
    agg = topagg.TopAgg(TopAggConfig(topk=200, sigma=1.0, thresh=0.5, method=SIGN),
                        num_teachers=10)
    seed = tf.constant([0, 0])
    full = agg.vote_sum(tf.constant(g), seed=seed).numpy()
    chunks = [g[:4], g[4:5], g[5:]]
    total = sum(agg.vote_sum(tf.constant(ch), seed=tf.constant([i, 9])).numpy()
                for i, ch in enumerate(chunks))
    np.testing.assert_array_equal(total, full)
    np.testing.assert_array_equal(
        full, _reference_votes(g, None, topk=200, max_grad=1e-5, method=SIGN).sum(0))
    # The stochastic sign too, when each chunk gets its own teachers' uniforms.
    u = rng.uniform(size=(10, 5, 200)).astype(np.float32)
    full_s = topagg.summed_votes(tf.constant(g), tf.constant(u), topk=200, max_grad=1e-5,
                                 method=STOCH).numpy()
    total_s = sum(topagg.summed_votes(tf.constant(g[a:z]), tf.constant(u[a:z]), topk=200,
                                      max_grad=1e-5, method=STOCH).numpy()
                  for a, z in [(0, 3), (3, 4), (4, 10)])
    np.testing.assert_array_equal(total_s, full_s)


# --------------------------------------------------------------------------------------
# 10. Errors.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [topagg.teacher_votes, topagg.summed_votes],
                         ids=["teacher_votes", "summed_votes"])
def test_topk_larger_than_dimension_raises(fn):
    g = tf.zeros((2, 3, 4))
    with pytest.raises(ValueError, match=r"topk=5.*dimension 4"):
        fn(g, tf.zeros((2, 3, 5)), topk=5, max_grad=1.0, method=SIGN)
    fn(g, tf.zeros((2, 3, 4)), topk=4, max_grad=1.0, method=SIGN)  # k = D is fine.


def test_topk_larger_than_dimension_raises_through_topagg():
    agg = topagg.TopAgg(TopAggConfig(topk=13, sigma=1.0), num_teachers=2)
    with pytest.raises(ValueError, match=r"topk=13.*dimension 12"):
        agg.vote_sum(tf.zeros((2, 1, 2, 2, 3)), seed=tf.constant([0, 0]))


@pytest.mark.parametrize("fn", [topagg.teacher_votes, topagg.summed_votes],
                         ids=["teacher_votes", "summed_votes"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4, 5), (6,)])
def test_gradients_of_wrong_rank_raise(fn, shape):
    with pytest.raises(ValueError, match=r"\[teachers, images, dim\]"):
        fn(tf.zeros(shape), None, topk=1, max_grad=1.0, method=SIGN)


def test_topagg_argument_errors():
    with pytest.raises(ValueError, match="num_teachers"):
        topagg.TopAgg(TopAggConfig(), num_teachers=0)
    agg = topagg.TopAgg(TopAggConfig(topk=1, sigma=1.0), num_teachers=3)
    with pytest.raises(ValueError, match="3 teachers, got 2"):
        agg(tf.zeros((2, 1, 4)), vote_seed=tf.constant([0, 0]),
            noise_seed=tf.constant([0, 0]))


# --------------------------------------------------------------------------------------
# 11. TopAgg.__call__ on a hand-made example.
# --------------------------------------------------------------------------------------

def test_call_on_a_hand_example():
    # 3 teachers, 1 image, D = 4, k = 2, c = 1, deterministic sign, sigma = 0,
    # beta = 0.3 -> threshold beta * N = 0.9.
    grads = tf.constant([
        [[0.5, -2.0, 0.1, 0.0]],   # top-2 |g|: idx 1 (2.0), idx 0 (0.5); -2 clips to -1,
                                   # signs: idx1 -1, idx0 +1        -> [+1, -1,  0, 0]
        [[0.0, 0.3, -0.3, 0.3]],   # three-way tie at 0.3: lower index first -> idx 1, 2;
                                   # signs: idx1 +1, idx2 -1        -> [ 0, +1, -1, 0]
        [[0.0, 0.0, 0.0, 0.0]],    # all zero: idx 0, 1; n = 0 -> sign +1
                                   #                                 -> [+1, +1,  0, 0]
    ])
    # Vote sum: [2, 1, -1, 0]; thresholded at +-0.9: [+1, +1, -1, 0].
    agg = topagg.TopAgg(TopAggConfig(topk=2, sigma=0.0, thresh=0.3, max_grad=1.0,
                                     method=SIGN), num_teachers=3, allow_no_noise=True)
    np.testing.assert_array_equal(agg.vote_sum(grads, seed=tf.constant([0, 0])).numpy(),
                                  [[2, 1, -1, 0]])
    result = agg(grads, vote_seed=tf.constant([5, 6]), noise_seed=tf.constant([7, 8]))
    np.testing.assert_array_equal(result.update.numpy(), [[1.0, 1.0, -1.0, 0.0]])
    assert isinstance(result.event, dp_accounting.NonPrivateDpEvent)
    assert result.queries == 1
    assert result.pass_fraction == pytest.approx(0.75)


# --------------------------------------------------------------------------------------
# 12. The deterministic sign without threshold (Aggregation.NO_THRESHOLD_SIGN; the
#     authors' --signsgd_nothresh without --stochastic).
# --------------------------------------------------------------------------------------

NO_THRESH_SIGN = Aggregation.NO_THRESHOLD_SIGN


def _slow_sign_vote_sum(grads: np.ndarray, topk: int) -> np.ndarray:
    """Sum over teachers of the sign of each teacher's k largest |g| (ties: lower index
    first; g >= 0, an exact zero included, votes +1), one teacher and image at a time.
    Clipping and L-inf normalisation never change a sign, so they are left out."""
    t_count, b_count, dim = grads.shape
    total = np.zeros((b_count, dim), np.int64)
    for t in range(t_count):
        for b in range(b_count):
            g = grads[t, b]
            for index in np.argsort(-np.abs(g), kind="stable")[:topk]:
                total[b, index] += 1 if g[index] >= 0 else -1
    return total


@pytest.mark.parametrize("kind", ["normal", "ties", "zeros_mixed", "beyond_clip"])
@pytest.mark.parametrize("shape,topk", SHAPES, ids=lambda v: str(v))
def test_no_threshold_sign_votes_and_releases_the_sum_over_k_without_noise(shape, topk,
                                                                           kind):
    g = _grads(kind, shape, seed=_seed("no_threshold_sign", shape, kind))
    agg = topagg.TopAgg(TopAggConfig(topk=topk, sigma=0.0, thresh=0.5, max_grad=_CLIP[kind],
                                     method=NO_THRESH_SIGN),
                        num_teachers=shape[0], allow_no_noise=True)
    assert agg.uniform_count(shape[2]) == 0          # no random draws for the sign
    votes = agg.vote_sum(tf.constant(g))             # needs neither seed nor uniforms
    want = _slow_sign_vote_sum(g, topk)
    np.testing.assert_array_equal(votes.numpy(), want)
    result = agg.release(votes, noise=tf.zeros(shape[1:], tf.float32))
    # Released as sum / k in float32 (no threshold: values other than -1, 0, 1 occur).
    np.testing.assert_array_equal(result.update.numpy(),
                                  want.astype(np.float32) / np.float32(topk))
    assert result.pass_fraction == pytest.approx(np.mean(want != 0), abs=1e-6)


def test_no_threshold_sign_release_adds_sigma_times_the_noise_then_divides_by_k():
    """sigma = 3, k = 4, the noise injected: update = (v + 3 n) / 4, whatever beta."""
    for thresh in (0.0, 0.9):
        agg = topagg.TopAgg(TopAggConfig(topk=4, sigma=3.0, thresh=thresh,
                                         method=NO_THRESH_SIGN), num_teachers=5)
        result = agg.release(tf.constant([[5, -3, 0, 1]]),
                             noise=tf.constant([[0.5, -1.0, 2.0, 0.0]]))
        np.testing.assert_array_equal(result.update.numpy(), [[1.625, -1.5, 1.5, 0.25]])
        assert result.event.noise_multiplier == pytest.approx(3.0 / (2 * 2.0))   # one query


def test_no_threshold_sign_votes_like_the_thresholded_deterministic_sign():
    """The same votes as TOPK_SIGN (only the release differs), through the default
    backend (the custom op when it loads)."""
    g = _grads("normal", (3, 4, 60), seed=17)
    sums = [topagg.TopAgg(TopAggConfig(topk=9, sigma=1.0, method=method),
                          num_teachers=3).vote_sum(tf.constant(g)).numpy()
            for method in (SIGN, NO_THRESH_SIGN)]
    np.testing.assert_array_equal(sums[0], sums[1])
    np.testing.assert_array_equal(sums[1], _slow_sign_vote_sum(g, 9))
