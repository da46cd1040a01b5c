"""The vectorised teacher ensemble equals plain per-teacher Keras discriminators.

Reference: ``networks.build_discriminator`` (a Keras model, one per teacher) loaded with the
same weights, called with ``training=True`` (batch statistics, as the ensemble always
uses), differentiated with ``tf.GradientTape`` and stepped with ``keras.optimizers.Adam``.
Tolerances are float32 round-off of different summation orders (im2col matmul vs. conv).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from dclens.datalens import teacher_bank
from dclens.datalens import networks, teachers

SHAPES = {
    "28x28x1": networks.ImageShape(28, 28, 1, 10),
    "8x8x3": networks.ImageShape(8, 8, 3, 2),
}


def _keras_teacher(shape, flat_weights, layout):
    model = networks.build_discriminator(shape, seed=0)
    params = layout.split(tf.constant(flat_weights[None]))
    for var, name in zip(model.trainable_weights, layout.names):
        assert tuple(var.shape) == tuple(params[name].shape[1:]), (var.path, name)
        var.assign(params[name][0])
    return model


def _random_batch(rng, shape, teachers_count, batch):
    images = rng.uniform(size=(teachers_count, batch, shape.height, shape.width,
                               shape.channels)).astype(np.float32)
    labels = rng.integers(0, shape.num_classes, size=(teachers_count, batch))
    return images, np.eye(shape.num_classes, dtype=np.float32)[labels]


def _bank(shape, n, seed=1):
    layout = teachers.ParamLayout.for_shape(shape)
    bank = teacher_bank.TeacherBank.create(layout, n, seed=seed)
    # Non-trivial BN parameters so that gamma/beta are exercised too.
    rng = np.random.default_rng(seed)
    bank.weights[:] += rng.normal(0, 0.05, bank.weights.shape).astype(np.float32)
    return layout, bank


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_logits_match_keras(shape_name):
    shape = SHAPES[shape_name]
    layout, bank = _bank(shape, 3)
    ensemble = teachers.TeacherEnsemble(shape, learning_rate=1e-3, beta1=0.5)
    images, labels = _random_batch(np.random.default_rng(0), shape, 3, 5)
    got = ensemble.logits(tf.constant(bank.weights), tf.constant(images), tf.constant(labels))
    for t in range(3):
        model = _keras_teacher(shape, bank.weights[t], layout)
        want = model([images[t], labels[t]], training=True)[:, 0]
        np.testing.assert_allclose(got[t], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_image_gradients_match_keras(shape_name):
    shape = SHAPES[shape_name]
    layout, bank = _bank(shape, 3)
    ensemble = teachers.TeacherEnsemble(shape, learning_rate=1e-3, beta1=0.5)
    images, labels = _random_batch(np.random.default_rng(1), shape, 1, 4)
    got = ensemble.image_gradients(tf.constant(bank.weights), tf.constant(images[0]),
                                   tf.constant(labels[0])).numpy()
    assert got.shape == (3, 4, shape.height, shape.width, shape.channels)
    for t in range(3):
        model = _keras_teacher(shape, bank.weights[t], layout)
        x = tf.constant(images[0])
        with tf.GradientTape() as tape:
            tape.watch(x)
            logit = model([x, tf.constant(labels[0])], training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.ones_like(logit), logits=logit))
        want = -tape.gradient(loss, x).numpy()
        scale = np.abs(want).max()
        assert scale > 0
        np.testing.assert_allclose(got[t], want, rtol=1e-3, atol=1e-4 * scale)


def test_gradients_differ_between_teachers():
    shape = SHAPES["8x8x3"]
    _, bank = _bank(shape, 2)
    ensemble = teachers.TeacherEnsemble(shape, learning_rate=1e-3, beta1=0.5)
    images, labels = _random_batch(np.random.default_rng(2), shape, 1, 4)
    grads = ensemble.image_gradients(tf.constant(bank.weights), tf.constant(images[0]),
                                     tf.constant(labels[0])).numpy()
    assert not np.allclose(grads[0], grads[1])


@pytest.mark.parametrize("num_steps", [1, 2])
def test_adam_steps_match_keras(num_steps):
    shape = SHAPES["8x8x3"]
    layout, bank = _bank(shape, 3)
    ensemble = teachers.TeacherEnsemble(shape, learning_rate=1e-3, beta1=0.5)
    rng = np.random.default_rng(3)
    real, real_y = _random_batch(rng, shape, 3, 6)
    fake, fake_y = _random_batch(rng, shape, 3, 6)
    state, losses = ensemble.train(bank.read(0, 3), tf.constant(real), tf.constant(real_y),
                                   tf.constant(fake), tf.constant(fake_y), num_steps=num_steps)
    assert state.steps.numpy().tolist() == [num_steps] * 3
    for t in range(3):
        model = _keras_teacher(shape, bank.weights[t], layout)
        optimizer = keras.optimizers.Adam(1e-3, beta_1=0.5, beta_2=teachers.ADAM_BETA2,
                                          epsilon=teachers.ADAM_EPSILON)
        conditioned = np.ones(layout.size, bool)
        for _ in range(num_steps):
            with tf.GradientTape() as tape:
                lr = model([real[t], real_y[t]], training=True)
                lf = model([fake[t], fake_y[t]], training=True)
                loss = (tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                            labels=tf.ones_like(lr), logits=lr))
                        + tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                            labels=tf.zeros_like(lf), logits=lf)))
            grads = tape.gradient(loss, model.trainable_weights)
            flat_grads = layout.join({n: g[None] for n, g in zip(layout.names, grads)})
            conditioned &= np.abs(flat_grads.numpy()[0]) > 1e-5
            optimizer.apply_gradients(zip(grads, model.trainable_weights))
        np.testing.assert_allclose(losses[t], loss, rtol=1e-4)
        want = layout.join({name: var[None] for name, var in
                            zip(layout.names, model.trainable_weights)}).numpy()[0]
        moved = np.abs(want - bank.weights[t]).max()
        assert moved > 1e-4  # the step did something measurable
        # Adam divides by sqrt(v) + 1e-8: where a gradient is ~0 (e.g. a bias followed by
        # batch norm, whose exact gradient is 0), round-off decides the step.  There we only
        # check that the step stays within Adam's bound lr * (1 - beta1) / sqrt(1 - beta2)
        # (about 16 lr here); elsewhere the results must agree.
        got = state.weights.numpy()[t]
        assert conditioned.mean() > 0.9
        np.testing.assert_allclose(got[conditioned], want[conditioned], atol=2e-6 * num_steps)
        bound = 1e-3 * 0.5 / np.sqrt(1 - teachers.ADAM_BETA2) * num_steps
        assert np.abs(got - bank.weights[t]).max() <= bound


def test_teachers_are_independent():
    """Changing teacher 0's data changes teacher 0's update only (one-teacher sensitivity)."""
    shape = SHAPES["8x8x3"]
    _, bank = _bank(shape, 3)
    ensemble = teachers.TeacherEnsemble(shape, learning_rate=1e-3, beta1=0.5)
    rng = np.random.default_rng(4)
    real, real_y = _random_batch(rng, shape, 3, 6)
    fake, fake_y = _random_batch(rng, shape, 3, 6)
    base, _ = ensemble.train(bank.read(0, 3), real, real_y, fake, fake_y, num_steps=2)
    real2 = real.copy()
    real2[0] = rng.uniform(size=real2[0].shape)
    changed, _ = ensemble.train(bank.read(0, 3), real2, real_y, fake, fake_y, num_steps=2)
    assert not np.allclose(base.weights[0], changed.weights[0])
    np.testing.assert_array_equal(base.weights[1:], changed.weights[1:])
    np.testing.assert_array_equal(base.adam_m[1:], changed.adam_m[1:])


def test_bank_initialisation_distinct_and_seeded(tmp_path):
    shape = SHAPES["28x28x1"]
    layout = teachers.ParamLayout.for_shape(shape)
    assert layout.size == 555_655  # ~555k parameters per 28x28 teacher (docs/design.md)
    bank = teacher_bank.TeacherBank.create(layout, 4, seed=7, directory=tmp_path)
    again = teacher_bank.TeacherBank.create(layout, 4, seed=7)
    np.testing.assert_array_equal(bank.weights, again.weights)
    assert not np.array_equal(bank.weights[0], bank.weights[1])
    params = layout.split(tf.constant(bank.weights))
    conv = params["conv0/kernel"].numpy()
    assert np.abs(conv).max() <= 2 * networks.INIT_STDDEV + 1e-7   # truncated normal
    assert 0.015 < conv.std() < 0.02
    np.testing.assert_array_equal(params["bn1/gamma"], 1.0)
    assert (tmp_path / "weights.npy").exists()


def test_bank_read_write_roundtrip():
    shape = SHAPES["8x8x3"]
    layout, bank = _bank(shape, 5)
    state = bank.read(1, 3)
    new = teachers.TeacherState(state.weights + 1.0, state.adam_m + 2.0, state.adam_v + 3.0,
                                state.steps + 1)
    before = bank.weights.copy()
    bank.write(1, 3, new)
    np.testing.assert_array_equal(bank.weights[1:3], before[1:3] + 1.0)
    np.testing.assert_array_equal(bank.weights[[0, 3, 4]], before[[0, 3, 4]])
    assert bank.steps.tolist() == [0, 1, 1, 0, 0]
    assert list(bank.chunks(2)) == [(0, 2), (2, 4), (4, 5)]
