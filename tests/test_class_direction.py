"""The class-direction diagnostic (:mod:`dclens.datalens.class_direction`, issue 39 lever 5):
how much of the teachers' summed class evidence their gradients, vote and released update
carry.

* exactly: the chunked direction equals the gradient of the whole ensemble's label
  cross-entropy written out with one tape, per label shift (slow reference);
* its sign: a small step along it lowers that cross-entropy;
* the cosines on built vectors (1, -1, 0, zero rows left out);
* in a run: it reads only (a run with it trains bit for bit as one without), records the
  steps asked for, and is refused for runs on private records.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from conftest import synthetic_fashion_mnist
from dclens.datalens import class_direction, networks, teachers
from dclens.datalens.config import (BudgetConfig, ConfigError, DataLensConfig, TopAggConfig,
                                    TrainConfig, TrainingRecords)
from dclens.datalens.fast_ensemble import FastTeacherEnsemble
from dclens.datalens.train import DataLens

SHAPE = networks.ImageShape(28, 28, 1, 10)
T, B = 3, 4


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(3)
    layout = teachers.ParamLayout.for_shape(SHAPE)
    weights = np.asarray(teachers.initial_teacher_weights(layout, T, rng))
    weights = weights * (1 + 0.5 * rng.standard_normal(weights.shape))   # not at init
    images = rng.uniform(size=(B, 28, 28, 1)).astype(np.float32)
    labels = rng.integers(0, 10, B)
    ensemble = FastTeacherEnsemble(SHAPE, learning_rate=1e-3, beta1=0.5)
    return ensemble, tf.constant(weights, tf.float32), tf.constant(images), labels


def _cross_entropy(ensemble, weights, images, labels) -> tf.Tensor:
    """sum_b logsumexp_s S(x_b, y_b + s) - S(x_b, y_b), S the teachers' summed logits,
    written out label shift by label shift (the slow reference)."""
    t = int(weights.shape[0])
    x = tf.broadcast_to(images[None], [t, *images.shape])
    summed = []
    for shift in range(10):
        one_hot = tf.one_hot((labels + shift) % 10, 10)
        summed.append(tf.reduce_sum(ensemble.logits(
            weights, x, tf.broadcast_to(one_hot[None], [t, *one_hot.shape])), axis=0))
    scores = tf.stack(summed, axis=-1)                                      # [B, K]
    return tf.reduce_sum(tf.reduce_logsumexp(scores, axis=-1) - scores[:, 0])


def test_the_chunked_direction_is_the_whole_ensembles_cross_entropy_gradient(inputs):
    ensemble, weights, images, labels = inputs
    with tf.GradientTape() as tape:
        tape.watch(images)
        loss = _cross_entropy(ensemble, weights, images, labels)
    expected = -tape.gradient(loss, images).numpy()
    got = class_direction.class_direction(ensemble, weights, images, tf.one_hot(labels, 10),
                                          teacher_chunk=2).numpy()   # chunks of 2 and 1
    assert np.abs(expected).max() > 0
    # float32 round-off of a different summation order (chunks, then the softmax's chain
    # rule): the relative L2 error, not element-wise, where tiny entries differ by 1e-8.
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error < 1e-4, error          # measured 4.7e-6; a wrong formula is O(1)


def test_a_step_along_the_direction_lowers_the_ensembles_cross_entropy(inputs):
    ensemble, weights, images, labels = inputs
    direction = class_direction.class_direction(ensemble, weights, images,
                                                tf.one_hot(labels, 10))
    before = float(_cross_entropy(ensemble, weights, images, labels))
    step = 1e-2 / float(tf.reduce_max(tf.abs(direction)))
    after = float(_cross_entropy(ensemble, weights, images + step * direction, labels))
    assert after < before


def test_mean_cosine_on_built_vectors():
    rng = np.random.default_rng(0)
    c = rng.standard_normal((3, 5, 2))
    assert class_direction.mean_cosine(c, c) == pytest.approx(1.0)
    assert class_direction.mean_cosine(-2 * c, c) == pytest.approx(-1.0)
    flat = c.reshape(3, -1)
    orthogonal = flat[:, ::-1] - (np.sum(flat[:, ::-1] * flat, axis=1, keepdims=True)
                                  / np.sum(flat * flat, axis=1, keepdims=True)) * flat
    assert class_direction.mean_cosine(orthogonal, flat) == pytest.approx(0.0, abs=1e-12)
    mixed = c.copy()
    mixed[1] = -c[1]
    mixed[2] = 0.0                              # no direction: left out, not counted as 0
    assert class_direction.mean_cosine(mixed, c) == pytest.approx(0.0)
    assert np.isnan(class_direction.mean_cosine(np.zeros_like(c), c))


def _lens(tmp_path=None, every: int | None = None) -> DataLens:
    config = DataLensConfig(
        train=TrainConfig(num_teachers=3, batch_size=4, d_step=1, pretrain_teacher=1, z_dim=8,
                          teacher_chunk=2, num_samples=10),
        topagg=TopAggConfig(topk=30, sigma=5.0, thresh=0.2, max_grad=1e-5),
        budget=BudgetConfig(max_eps=1e6))
    lens = DataLens(config, synthetic_fashion_mnist(24), root_seed=4)
    if every is not None:
        lens.observer = class_direction.ClassDirectionLog([lens], str(tmp_path), every,
                                                          teacher_chunk=2)
    return lens


def test_the_log_reads_only_and_records_the_steps_asked_for(tmp_path):
    plain, logged = _lens(), _lens(tmp_path, every=2)
    for _ in range(3):
        plain.train_step()
        logged.train_step()
    np.testing.assert_array_equal(plain.bank.weights, logged.bank.weights)
    for a, b in zip(plain.generator.weights, logged.generator.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    records = json.loads((tmp_path / class_direction.FILE).read_text())["records"]
    assert [r["step"] for r in records] == [0, 2]
    for record in records:
        assert record["teachers"] == 3 and record["images"] == 4
        for name in ("mean_gradient_vs_class", "vote_vs_class", "update_vs_class",
                     "vote_vs_mean_gradient", "update_vs_mean_gradient"):
            assert -1.0 <= record[name] <= 1.0, (name, record)
    # A resumed run redoing step 2 replaces its record and keeps the earlier ones.
    again = class_direction.ClassDirectionLog([logged], str(tmp_path), 2)
    assert [r["step"] for r in again.records] == [0, 2]
    again.records = again.records[:1]           # as if step 2 had not been written
    logged.observer = again
    logged.step = 2
    logged.train_step()
    assert [r["step"] for r in json.loads(
        (tmp_path / class_direction.FILE).read_text())["records"]] == [0, 2]


@pytest.mark.parametrize("records", [TrainingRecords.ALL, TrainingRecords.PRIVATE])
def test_the_diagnostic_is_refused_for_runs_on_private_records(records):
    with pytest.raises(ConfigError, match="only for screening runs on the tuning split"):
        TrainConfig(class_direction_every=5, training_records=records)
    with pytest.raises(ConfigError, match="class_direction_every must be an integer >= 0"):
        TrainConfig(class_direction_every=-1, training_records=TrainingRecords.TUNING)
    assert TrainConfig(class_direction_every=5,
                       training_records=TrainingRecords.TUNING).class_direction_every == 5
