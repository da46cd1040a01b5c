"""Matching-aware teachers (``TrainConfig.mismatch_negatives``, dclens/datalens/mismatch.py;
issue 39's lever 5):

* exact: the wrong labels against an integer loop (never the label; over K - 1 steps every
  wrong label once per slot); the fake half keeps its first B - m generator images and
  takes the teacher's own real records of the last m slots; 0 is the paper's batch;
* the teachers train on that batch (a spy on the reference ensemble sees it), and the
  fused op with fake labels other than the real ones equals the reference (gradients,
  RTOL_GRAD relative to the largest entry, as tests/test_teacher_op.py);
* privacy: one teacher's records swapped adversarially change that teacher's weights and
  nothing else, and the vote sum moves by at most TopAgg's 2 sqrt(k);
* bad counts are refused by name, in the config and against the run's batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from conftest import synthetic_fashion_mnist
from teacher_swap import assert_a_swapped_teacher_moves_only_itself, two_teacher_config
from dclens.datalens import mismatch, networks, teacher_op, teachers
from dclens.datalens.config import ConfigError, DataLensConfig, TrainConfig
from dclens.datalens.teachers import ADAM_BETA2, ADAM_EPSILON, ParamLayout, TeacherState
from dclens.datalens.train import DataLens, TeacherPlacement

K = 10
RTOL_GRAD = 1e-4


def test_wrong_labels_equal_the_loop_and_visit_every_other_label():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, K, size=(3, 6))
    slots = np.arange(9, 15)
    seen = {(t, j): set() for t in range(3) for j in range(6)}
    for step in range(40, 40 + K - 1):
        got = mismatch.wrong_labels(labels, slots, step, K)
        for t in range(3):
            for j, slot in enumerate(slots):
                shift = 1 + (step + slot) % (K - 1)
                assert got[t, j] == (labels[t, j] + shift) % K
                assert got[t, j] != labels[t, j]
                seen[t, j].add(int(got[t, j]))
    for (t, j), wrong in seen.items():
        assert wrong == set(range(K)) - {int(labels[t, j])}
    # two classes: the one other label, every step
    np.testing.assert_array_equal(
        mismatch.wrong_labels(np.array([[0, 1]]), np.array([0, 1]), 7, 2), [[1, 0]])
    with pytest.raises(ValueError, match="at least 2 classes, got 1"):
        mismatch.wrong_labels(labels, slots, 0, 1)


def test_the_fake_half_takes_the_teachers_own_records_in_its_last_slots():
    rng = np.random.default_rng(1)
    t, b, m = 3, 5, 2
    real = rng.uniform(size=(t, b, 4, 4, 1)).astype(np.float32)
    fake = rng.normal(size=(t, b, 4, 4, 1)).astype(np.float32)
    labels = rng.integers(0, K, size=(t, b))
    images, fake_labels = mismatch.with_mismatched_reals(
        tf.constant(real), labels, tf.constant(fake), m, step=3, num_classes=K)
    images = images.numpy()
    np.testing.assert_array_equal(images[:, :b - m], fake[:, :b - m])
    np.testing.assert_array_equal(images[:, b - m:], real[:, b - m:])
    np.testing.assert_array_equal(fake_labels[:, :b - m], labels[:, :b - m])
    np.testing.assert_array_equal(
        fake_labels[:, b - m:], mismatch.wrong_labels(labels[:, b - m:], np.arange(b - m, b),
                                                      3, K))
    assert np.all(fake_labels[:, b - m:] != labels[:, b - m:])
    # all of the half, and none of it: the paper's batch, the same objects
    whole, whole_labels = mismatch.with_mismatched_reals(
        tf.constant(real), labels, tf.constant(fake), b, step=0, num_classes=K)
    np.testing.assert_array_equal(whole.numpy(), real)
    assert np.all(whole_labels != labels)
    fake_tensor = tf.constant(fake)
    same, same_labels = mismatch.with_mismatched_reals(
        tf.constant(real), labels, fake_tensor, 0, step=0, num_classes=K)
    assert same is fake_tensor and same_labels is labels


def _config(m: int, **train) -> DataLensConfig:
    return two_teacher_config(mismatch_negatives=m, **train)


def test_the_teachers_train_on_the_mismatched_batch():
    """A spy on the reference ensemble's ``train`` sees, for each teacher, the generator's
    class-grid images in the first B - m fake slots and its own partition's records under
    the expected wrong labels in the last m."""
    m = 2
    lens = DataLens(_config(m), synthetic_fashion_mnist(16), root_seed=5,
                    placement=TeacherPlacement(ensemble="reference"))
    seen = []
    original = lens.ensemble.train

    def spy(state, real, real_labels, fake, fake_labels, *, num_steps):
        seen.append(tuple(np.asarray(a) for a in (real, real_labels, fake, fake_labels)))
        return original(state, real, real_labels, fake, fake_labels, num_steps=num_steps)

    lens.ensemble.train = spy
    z = lens.latent(0)
    grid = lens.teacher_fakes(z).numpy()
    lens.train_teachers(lens.teacher_fakes(z))
    (real, real_one_hot, fake, fake_one_hot), = seen
    b = real.shape[1]
    records = lens.partitions[:, lens._slot_columns()]
    np.testing.assert_array_equal(real, lens.images[records])
    real_labels = lens.labels[records]
    np.testing.assert_array_equal(real_one_hot.argmax(-1), real_labels)
    expected = grid[real_labels[:, :b - m], np.arange(b - m)[None, :]]
    np.testing.assert_array_equal(fake[:, :b - m], expected)
    np.testing.assert_array_equal(fake[:, b - m:], lens.images[records[:, b - m:]])
    np.testing.assert_array_equal(
        fake_one_hot.argmax(-1)[:, b - m:],
        mismatch.wrong_labels(real_labels[:, b - m:], np.arange(b - m, b), 0, K))
    np.testing.assert_array_equal(fake_one_hot.argmax(-1)[:, :b - m], real_labels[:, :b - m])


@pytest.mark.skipif(not teacher_op.available(),
                    reason="ops/_dclens_teacher_ops.so not built (make -C ops)")
def test_the_fused_op_with_other_fake_labels_equals_the_reference():
    """Adam's first moment after one step from 0 is (1 - beta1) x the gradient: equal to
    the reference's within RTOL_GRAD when the fake half's labels differ from the real
    half's, and of order 1 away from what the real labels would give the fake half."""
    shape = networks.ImageShape(28, 28, 1, K)
    rng = np.random.default_rng(2)
    layout = ParamLayout.for_shape(shape)
    t, b = 2, 4
    weights = teachers.initial_teacher_weights(layout, t, rng)
    weights += rng.normal(0, 0.05, weights.shape).astype(np.float32)
    real = rng.uniform(size=(t, b, 28, 28, 1)).astype(np.float32)
    fake = rng.normal(0.3, 0.2, size=(t, b, 28, 28, 1)).astype(np.float32)
    labels = rng.integers(0, K, size=(t, b))
    wrong = mismatch.wrong_labels(labels, np.arange(b), 1, K)
    reference = teachers.TeacherEnsemble(shape, learning_rate=1e-3, beta1=0.5)
    state = TeacherState(tf.constant(weights), tf.zeros_like(weights), tf.zeros_like(weights),
                         tf.zeros([t], tf.int64))
    expected, _ = reference.train(state, real, tf.one_hot(labels, K), fake,
                                  tf.one_hot(wrong, K), num_steps=1)

    def fused(fake_labels):
        zeros = np.zeros_like(weights)
        return teacher_op.train(
            weights, zeros, zeros, np.concatenate([real, fake], axis=1),
            np.concatenate([labels, fake_labels], axis=1).astype(np.int32), 0, shape=shape,
            num_steps=1, learning_rate=1e-3, beta1=0.5, beta2=ADAM_BETA2,
            epsilon=ADAM_EPSILON)[1].numpy()

    scale = np.max(np.abs(expected.adam_m.numpy()))
    assert np.max(np.abs(fused(wrong) - expected.adam_m.numpy())) <= RTOL_GRAD * scale
    assert np.max(np.abs(fused(labels) - expected.adam_m.numpy())) > 1e-2 * scale


@pytest.mark.parametrize("ensemble", ["fast", "reference"])
def test_one_teachers_records_swapped_move_only_its_own_teacher(ensemble):
    """Neighbouring data sets: every record of teacher 0 replaced (noise images, other
    labels). After a training step with m = 2, teacher 1 (same chunk) has bit-equal
    weights and image gradients; the vote sum moves by at most 2 sqrt(k) per image."""
    assert_a_swapped_teacher_moves_only_itself(_config(2), ensemble=ensemble)


def test_mismatch_changes_the_teachers_and_is_off_by_default():
    """The option does something (m = 2 trains other teachers than m = 0), and the default
    is 0: the paper's run (its bits are the golden runs', tests/test_golden_runs.py)."""
    data = synthetic_fashion_mnist(16)

    def trained(config):
        lens = DataLens(config, data, root_seed=6)
        lens.train_step()
        return np.array(lens.bank.weights)

    assert TrainConfig().mismatch_negatives == 0
    assert np.any(trained(_config(2)) != trained(_config(0)))


@pytest.mark.parametrize("bad", [-1, True, 2.0, 5])
def test_a_bad_count_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match=f"mismatch_negatives must be an integer in "
                                          f"\\[0, batch_size=4\\].*got {bad!r}"):
        _config(bad)


def test_a_count_beyond_the_runs_batch_is_refused_when_the_run_starts():
    """batch_size 30 is cut to the partition size (16 records / 2 teachers = 8): m = 9
    passes the config and is refused by the run, quoting both numbers."""
    config = _config(9, batch_size=30)
    with pytest.raises(ValueError, match="mismatch_negatives=9 exceeds the teachers' batch "
                                         "of 8"):
        DataLens(config, synthetic_fashion_mnist(16), root_seed=1)
    with pytest.raises(ValueError, match="mismatch_negatives must be an integer >= 0"):
        mismatch.check_count(-2, 8)
