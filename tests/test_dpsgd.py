"""DP-SGD mechanisms (dclens/dpsgd/): per-example gradients against a slow loop, clipping,
NormTopK, the sensitivity under an adversarial one-example change, noise, and the event."""

import math

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

from dclens.dpsgd import mechanisms as mech
from dclens.dpsgd import per_example
from dclens.dpsgd.models import sample_convnet


def _loss(labels, logits):
    return tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def _slow_per_example(model, images, labels):
    """One tape per example in a Python loop: the obviously correct reference."""
    rows = []
    for i in range(len(labels)):
        with tf.GradientTape() as tape:
            loss = _loss(labels[i:i + 1], model(images[i:i + 1], training=False))[0]
        rows.append(np.concatenate([g.numpy().ravel()
                                    for g in tape.gradient(loss, model.trainable_variables)]))
    return np.stack(rows)


def _odd_convnet(dilation: tuple[int, int] = (1, 1)):
    """Same padding, stride 2, a non-square kernel (dilated if asked), a bias-free conv and
    dense, average pooling and a separate activation layer: the cases the layer-wise path
    must get right."""
    import keras

    init = [keras.initializers.GlorotUniform(seed=s) for s in range(4)]
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=(12, 12, 2)),
        layers.Conv2D(5, 3, strides=2, padding="same", activation="tanh",
                      kernel_initializer=init[0]),
        layers.Conv2D(4, (3, 2), strides=(1, 2) if dilation == (1, 1) else 1,
                      dilation_rate=dilation, use_bias=False,
                      kernel_initializer=init[1]),
        layers.Activation("relu"),
        layers.AveragePooling2D(2, strides=1),
        layers.Flatten(),
        layers.Dense(6, use_bias=False, activation="relu", kernel_initializer=init[2]),
        layers.Dense(10, kernel_initializer=init[3]),
    ])


@pytest.mark.parametrize("case", ["relu", "tanh", "odd", "dilated"])
def test_both_per_example_paths_equal_a_slow_loop(case):
    # "dilated" also runs where TF's CPU Conv2D kernel (oneDNN off) has no dilated gradient
    models = {"odd": _odd_convnet, "dilated": lambda: _odd_convnet(dilation=(2, 1))}
    model = models[case]() if case in models else sample_convnet(seed=0, activation=case)
    shape = model.inputs[0].shape[1:]
    rng = np.random.default_rng(0)
    images = tf.constant(rng.uniform(size=(5, *shape)).astype(np.float32))
    labels = tf.constant([1, 5, 5, 9, 0])
    want = _slow_per_example(model, images, labels)
    assert want.shape[1] == sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert per_example.supports_by_layer(model)
    fast = tf.function(lambda x, y: per_example.by_layer(model, _loss, x, y))
    for got in (per_example.by_layer(model, _loss, images, labels), fast(images, labels),
                per_example.vectorized(model, _loss, images, labels),
                per_example.per_example_gradients(model, _loss, images, labels)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-6)


def test_models_the_layer_wise_path_cannot_take_fall_back_to_the_reference():
    import keras

    model = keras.Sequential([keras.Input(shape=(6, 6, 1)),
                              keras.layers.Conv2D(2, 3, kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
                              keras.layers.LayerNormalization(),
                              keras.layers.Flatten(),
                              keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(seed=2))])
    assert not per_example.supports_by_layer(model)
    with pytest.raises(ValueError, match="use per_example.vectorized"):
        per_example.by_layer(model, _loss, tf.zeros((1, 6, 6, 1)), tf.constant([0]))
    rng = np.random.default_rng(1)
    images = tf.constant(rng.uniform(size=(3, 6, 6, 1)).astype(np.float32))
    labels = tf.constant([2, 0, 7])
    np.testing.assert_allclose(
        per_example.per_example_gradients(model, _loss, images, labels).numpy(),
        _slow_per_example(model, images, labels), rtol=1e-4, atol=1e-6)


def test_clipping_bounds_every_row_and_leaves_small_rows():
    rows = tf.constant([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    clipped = mech.clip_rows(rows, 1.0).numpy()
    np.testing.assert_allclose(clipped, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]], rtol=1e-6)


def _slow_norm_topk(row, fraction):
    order = sorted(range(len(row)), key=lambda i: (-row[i] ** 2, i))
    target, total, out = fraction * float(np.sum(row ** 2)), 0.0, np.zeros_like(row)
    for i in order:
        total += float(row[i]) ** 2
        if total > target and fraction < 1:
            break
        out[i] = row[i]
    return out


@pytest.mark.parametrize("fraction", [0.3, 0.6, 0.8, 1.0])
def test_norm_topk_matches_a_slow_reference_and_bounds_the_norm(fraction):
    rng = np.random.default_rng(1)
    rows = (rng.standard_normal((6, 50)) * rng.uniform(0.1, 3, size=(6, 1))).astype(np.float32)
    got = mech.norm_topk(tf.constant(rows), fraction).numpy()
    np.testing.assert_array_equal(got, mech.norm_topk_literal(tf.constant(rows),
                                                              fraction).numpy())
    for row, kept in zip(rows, got):
        np.testing.assert_array_equal(kept, _slow_norm_topk(row, fraction))
        assert np.sum(kept ** 2) <= fraction * np.sum(row ** 2) * (1 + 1e-6)


@pytest.mark.parametrize("kind", ["gaussian", "ties", "scaled", "zeros", "mixed"])
def test_norm_topk_equals_the_literal_argsort_version_bit_for_bit(kind):
    """The fast path (one value sort, prefix length and tie ranks) against the literal
    argsort / cumsum / inverse-permutation version, on wide rows with float32 cumulative
    sums, integer-valued rows full of ties, rows of very different scales and zero rows."""
    rng = np.random.default_rng(7)
    rows = {"gaussian": rng.standard_normal((32, 3000)),
            "ties": np.round(rng.standard_normal((32, 3000)) * 2),
            "scaled": rng.standard_normal((32, 3000)) * rng.uniform(1e-3, 1e3, size=(32, 1)),
            "zeros": np.zeros((4, 3000)),
            # heavy-tailed rows (like real gradients: a few coordinates hold most of the
            # norm) beside Gaussian ones
            "mixed": np.concatenate([rng.standard_t(1, (16, 3000)),
                                     rng.standard_normal((16, 3000))])}[kind]
    rows = tf.constant(rows.astype(np.float32))
    for fraction in (1e-4, 0.05, 0.3, 0.8, 0.99):
        np.testing.assert_array_equal(mech.norm_topk(rows, fraction).numpy(),
                                      mech.norm_topk_literal(rows, fraction).numpy(),
                                      err_msg=f"fraction {fraction}")
    np.testing.assert_array_equal(mech.norm_topk(rows, 1.0).numpy(), rows.numpy())
    graph = tf.function(lambda r: mech.norm_topk(r, 0.8))          # inside a graph too
    np.testing.assert_array_equal(graph(rows).numpy(),
                                  mech.norm_topk_literal(rows, 0.8).numpy())


def test_kept_prefix_from_the_partitioned_top_equals_the_full_sort():
    """The prefix length and end value from the partitioned top (and its retries) against
    the full descending sort, on rows like a ReLU net's squared gradients (most entries
    exactly 0, the rest heavy-tailed) beside Gaussian and all-zero rows, so that every
    path runs: found in the first top (P / 8), after a retry, by the full sort."""
    rng = np.random.default_rng(3)
    width = 4000
    sparse = np.square(rng.standard_t(1, (8, width))) * (rng.random((8, width)) < 0.35)
    squares = np.concatenate([sparse, np.square(rng.standard_normal((6, width))),
                              np.zeros((2, width))]).astype(np.float32)
    rows = np.arange(len(squares))
    found_first = found_later = 0
    for fraction in (0.01, 0.3, 0.8, 0.999):
        target = (fraction * squares.sum(axis=1, keepdims=True)).astype(np.float32)
        count, last = mech._kept_prefix(squares, target)
        ordered = np.sort(squares, axis=1)[:, ::-1]
        want = np.sum(np.cumsum(ordered, axis=1, dtype=np.float32) <= target, axis=1)
        np.testing.assert_array_equal(count, want, err_msg=f"fraction {fraction}")
        np.testing.assert_array_equal(last, ordered[rows, np.maximum(want - 1, 0)])
        found_first += int(np.sum((want < width // 8) & (want > 0)))
        found_later += int(np.sum((want >= width // 8) & (want < width)))
    assert found_first and found_later                  # both the first top and retries ran
    assert np.all(mech._kept_prefix(squares[-2:], np.zeros((2, 1), np.float32))[0] == width)


@pytest.mark.parametrize("method, topk", [(mech.Method.GM, 1.0), (mech.Method.TOPAGG, 0.7),
                                          (mech.Method.TOPAGG_DIMENSION, 0.7)])
def test_one_example_moves_the_sum_by_at_most_the_sensitivity(method, topk):
    agg = mech.PrivateAggregation(method=method, clip=2.0, sigma=0.0, topk=topk)
    rng = np.random.default_rng(2)
    worst = 0.0
    for trial in range(100):
        batch = rng.standard_normal((8, 40)).astype(np.float32) * 5
        extra = rng.standard_normal((1, 40)).astype(np.float32) * 10.0 ** rng.uniform(-2, 4)
        if trial % 3 == 0:
            extra = np.zeros((1, 40), np.float32)
            extra[0, trial % 40] = 1e6                       # a spike
        elif trial % 3 == 1 and trial % 2:                   # a non-finite gradient
            extra[0, trial % 40] = (np.nan, np.inf, -np.inf)[trial % 9 // 3]
        with_it = tf.reduce_sum(agg.process(tf.constant(np.vstack([batch, extra]))), 0)
        without = tf.reduce_sum(agg.process(tf.constant(batch)), 0)
        moved = float(tf.norm(with_it - without))
        assert math.isfinite(moved), (trial, extra)
        worst = max(worst, moved)
    assert worst <= agg.sensitivity * (1 + 1e-6)
    # Reached: an example of norm >= C spread evenly over 40 coordinates (k * 40 = 28);
    # the dimension variant reaches C with a gradient on fewer than 28 coordinates.
    even = np.full((1, 40), 10.0, np.float32)
    if method is mech.Method.TOPAGG_DIMENSION:
        even[0, 20:] = 0.0
    moved = float(tf.norm(tf.reduce_sum(agg.process(tf.constant(even)), 0)))
    assert moved == pytest.approx(agg.sensitivity, rel=1e-5)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_nonfinite_example_gradient_is_clipped_to_zeros(bad):
    """Exact: a per-example row with a NaN or an infinity contributes zeros (it used to
    stay NaN or become NaN and poison the sum); finite rows are clipped as before."""
    rows = np.random.default_rng(4).standard_normal((4, 30)).astype(np.float32) * 3
    broken = rows.copy()
    broken[1, 5] = bad
    clipped = mech.clip_rows(tf.constant(broken), 1.0).numpy()
    np.testing.assert_array_equal(clipped[1], np.zeros(30, np.float32))
    others = [0, 2, 3]
    np.testing.assert_array_equal(clipped[others],
                                  mech.clip_rows(tf.constant(rows[others]), 1.0).numpy())
    for method, topk in ((mech.Method.GM, 1.0), (mech.Method.TOPAGG, 0.5),
                         (mech.Method.TOPAGG_DIMENSION, 0.5)):
        agg = mech.PrivateAggregation(method=method, clip=1.0, sigma=1.0, topk=topk)
        out = agg.aggregate(tf.constant(broken), expected_batch=4.0,
                            noise=tf.zeros(30)).numpy()
        assert np.all(np.isfinite(out)), method


def test_noise_off_is_the_mean_of_the_processed_gradients_and_noise_has_its_std():
    agg = mech.PrivateAggregation(method=mech.Method.TOPAGG, clip=1.0, sigma=2.0, topk=0.5)
    rows = tf.constant(np.random.default_rng(3).standard_normal((5, 30)).astype(np.float32))
    exact = agg.aggregate(rows, expected_batch=4.0, noise=tf.zeros(30)).numpy()
    np.testing.assert_allclose(exact, tf.reduce_sum(agg.process(rows), 0).numpy() / 4.0,
                               rtol=1e-6)
    # Noise std sigma * sqrt(k) * C / B over 40,000 coordinates; the sample std's relative
    # standard error is 1/sqrt(2 * 40000) = 0.35%: tolerance 2% (> 5 standard errors).
    noise = tf.random.stateless_normal((40_000,), seed=[4, 5])
    noisy = agg.aggregate(tf.zeros((1, 40_000)), expected_batch=4.0, noise=noise).numpy()
    assert np.std(noisy) == pytest.approx(2.0 * math.sqrt(0.5) * 1.0 / 4.0, rel=0.02)


def test_event_matches_hand_computed_rdp():
    """Poisson-subsampled Gaussian at integer order 2 (Mironov et al. 2019):
    A_2 = (1-q)^2 + 2q(1-q) + q^2 e^(1/sigma^2), RDP(2) = log A_2; ``steps`` compose."""
    q, sigma, steps, delta = 0.01, 1.1, 1000, 1e-5
    agg = mech.PrivateAggregation(sigma=sigma)
    accountant = dp_accounting.rdp.RdpAccountant(orders=[2.0])
    accountant.compose(agg.event(q, steps))
    rdp = steps * math.log((1 - q) ** 2 + 2 * q * (1 - q) + q ** 2 * math.exp(1 / sigma ** 2))
    # dp_accounting's conversion (Canonne et al. 2020) at the single order 2.
    want = rdp + math.log(1 / 2) - (math.log(delta) + math.log(2)) / 1
    assert accountant.get_epsilon(delta) == pytest.approx(want, rel=1e-9)
    assert isinstance(mech.PrivateAggregation(sigma=0.0).event(q), dp_accounting.NonPrivateDpEvent)


def test_poisson_batches_have_the_right_rate_and_settings_are_checked():
    rng = np.random.default_rng(6)
    sizes = [len(mech.poisson_batch(rng, 10_000, 0.02)) for _ in range(200)]
    # Mean 200, standard error of the mean sqrt(200 * 0.98 / 200) ~ 1: tolerance 5.
    assert abs(np.mean(sizes) - 200) < 5
    with pytest.raises(ValueError, match="topk must be a fraction"):
        mech.PrivateAggregation(topk=1.5)
    with pytest.raises(ValueError, match="clip must be"):
        mech.PrivateAggregation(clip=0.0)


def test_dimension_topk_keeps_the_largest_fraction_of_coordinates():
    rows = tf.constant([[0.1, -3.0, 2.0, 0.5, -0.2]])
    np.testing.assert_array_equal(mech.dimension_topk(rows, 0.4).numpy(),
                                  [[0.0, -3.0, 2.0, 0.0, 0.0]])
    assert mech.PrivateAggregation(method=mech.Method.TOPAGG_DIMENSION, clip=2.0,
                                   topk=0.4).sensitivity == 2.0
