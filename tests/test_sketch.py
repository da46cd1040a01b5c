"""The count sketch of FetchSGD (dclens/datalens/sketch.py): linear, exact without collisions, and
its computed sensitivity bounds one teacher's effect under adversarial swaps."""

import math

import numpy as np
import pytest
import tensorflow as tf

from dclens.datalens.sketch import CountSketch


def _slow_sketch(sketch: CountSketch, vector: np.ndarray) -> np.ndarray:
    table = np.zeros((sketch.rows, sketch.columns))
    for r in range(sketch.rows):
        for j in range(sketch.dim):
            table[r, sketch.buckets[r, j]] += sketch.signs[r, j] * vector[j]
    return table


def test_sketch_matches_a_literal_loop_and_is_linear():
    sketch = CountSketch(30, rows=3, columns=7, seed=1)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 30)).astype(np.float32)
    got = sketch.sketch(tf.constant(np.stack([a, b]))).numpy()
    np.testing.assert_allclose(got[0], _slow_sketch(sketch, a), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sketch.sketch(tf.constant([a + b])).numpy()[0],
                               got[0] + got[1], rtol=1e-5, atol=1e-5)


def test_unsketch_is_exact_without_collisions_and_a_median_otherwise():
    wide = CountSketch(20, rows=5, columns=100_000, seed=2)   # collisions ~improbable
    assert all(len(set(row)) == 20 for row in wide.buckets)
    votes = np.random.default_rng(1).integers(-4, 5, size=(3, 20)).astype(np.float32)
    np.testing.assert_array_equal(wide.unsketch(wide.sketch(tf.constant(votes))).numpy(),
                                  votes)
    narrow = CountSketch(20, rows=3, columns=4, seed=3)
    table = narrow.sketch(tf.constant(votes[:1])).numpy()[0]
    estimates = np.array([[narrow.signs[r, j] * table[r, narrow.buckets[r, j]]
                           for r in range(3)] for j in range(20)])
    np.testing.assert_allclose(narrow.unsketch(tf.constant(table[None])).numpy()[0],
                               np.median(estimates, axis=1), rtol=1e-6)


def _top_k_votes(rng, dim, k):
    votes = np.zeros(dim, np.float32)
    votes[rng.choice(dim, size=k, replace=False)] = rng.choice([-1.0, 1.0], size=k)
    return votes


@pytest.mark.parametrize("columns", [5, 40, 10_000])
def test_sensitivity_bounds_one_teacher_under_adversarial_swaps(columns):
    dim, rows, k = 60, 4, 8
    sketch = CountSketch(dim, rows=rows, columns=columns, seed=columns)
    bound = sketch.sensitivity(k)
    rng = np.random.default_rng(columns)
    worst = 0.0
    for _ in range(300):
        before = _top_k_votes(rng, dim, k)
        after = -before if rng.uniform() < 0.3 else _top_k_votes(rng, dim, k)
        change = sketch.sketch(tf.constant([after - before])).numpy()
        worst = max(worst, float(np.sqrt((change ** 2).sum())))
    assert worst <= bound + 1e-4
    # The adversary that knows the hashes: k votes on the coordinates of the fullest
    # buckets of row 0, all flipped -- reaches row 0's bound.
    order = np.argsort(-np.bincount(sketch.buckets[0], minlength=columns))
    chosen = [j for b in order for j in np.flatnonzero(sketch.buckets[0] == b)][:k]
    before = np.zeros(dim, np.float32)
    before[chosen] = sketch.signs[0, chosen]
    row0 = sketch.sketch(tf.constant([-2 * before])).numpy()[0, 0]
    assert float(np.sqrt((row0 ** 2).sum())) == pytest.approx(
        sketch.row_bound(0, l1=2 * k, linf=2), rel=1e-6)


def test_without_collisions_the_sensitivity_is_two_sqrt_k_rows():
    sketch = CountSketch(50, rows=6, columns=1_000_000, seed=4)
    assert sketch.sensitivity(10) == pytest.approx(2 * math.sqrt(10 * 6), rel=1e-12)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="columns must be an integer >= 1, got 0"):
        CountSketch(10, rows=2, columns=0)
