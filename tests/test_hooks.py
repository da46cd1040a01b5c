"""The documented injection points of a DataLens run (used by the side-by-side harness).

* explicit partitions (``DataLens(partitions=...)``), refused unless disjoint;
* the random draws (:mod:`dclens.datalens.draws`): the default :class:`SeededDraws` reproduces the
  run, an injected :class:`Draws` is used for every draw, per-coordinate stochastic-sign
  draws are restricted to the top-k exactly as a slow reference does;
* the noise given to :meth:`TopAgg.release` and the round observer;
* the authors' fake rendering (``fake_rendering=teacher_labels``) against a literal
  per-teacher generator call.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from conftest import synthetic_fashion_mnist

from dclens import data
from dclens.datalens import topagg
from dclens.datalens.config import (Aggregation, BudgetConfig, DataLensConfig, FakeRendering,
                           TopAggConfig, TrainConfig)
from dclens.datalens.draws import SeededDraws
from dclens.common.rng import SeedTree
from dclens.datalens.teacher_group import ClassGridFakes
from dclens.datalens.train import DataLens

TEACHERS, RECORDS, BATCH = 4, 10, 5


def _dataset(n=TEACHERS * RECORDS):
    return synthetic_fashion_mnist(n)


def _config(**train):
    values = dict(num_teachers=TEACHERS, batch_size=BATCH, d_step=1, pretrain_teacher=0,
                  z_dim=6, teacher_chunk=3)
    values.update(train)
    return DataLensConfig(train=TrainConfig(**values),
                          topagg=TopAggConfig(topk=30, sigma=3.0, thresh=0.3),
                          budget=BudgetConfig(max_eps=1e6))


# ------------------------------------------------------------------ partitions
def test_check_partitions_accepts_disjoint_rows():
    parts = np.arange(12).reshape(3, 4)[:, ::-1]
    np.testing.assert_array_equal(data.check_partitions(parts, num_records=12,
                                                        num_teachers=3), parts)


@pytest.mark.parametrize("parts, message", [
    (np.array([[0, 1], [1, 2]]), "not disjoint: record 1"),
    (np.array([[0, 1], [2, 12]]), r"in \[0, 12\), got values from 0 to 12"),
    (np.array([[0, -1], [2, 3]]), "got values from -1"),
    (np.array([[0, 1, 2]]), "1 rows but the run has 2 teachers"),
    (np.array([0, 1, 2, 3]), "2-D array"),
    (np.array([[0.0, 1.0], [2.0, 3.0]]), "integer record indices"),
])
def test_check_partitions_refuses_bad_partitions(parts, message):
    with pytest.raises(ValueError, match=message):
        data.check_partitions(parts, num_records=12, num_teachers=2)


def test_explicit_partitions_are_used_and_checked():
    parts = np.arange(TEACHERS * RECORDS)[::-1].reshape(TEACHERS, RECORDS)
    lens = DataLens(_config(), _dataset(), root_seed=1, partitions=parts)
    np.testing.assert_array_equal(lens.partitions, parts)
    overlapping = parts.copy()
    overlapping[1, 0] = overlapping[0, 0]
    with pytest.raises(ValueError, match="not disjoint"):
        DataLens(_config(), _dataset(), root_seed=1, partitions=overlapping)


# ------------------------------------------------------------------ draws
class RecordingDraws(SeededDraws):
    """The default draws, recording which ones were asked for."""

    def __init__(self, seeds):
        super().__init__(seeds)
        self.calls = []

    def latent(self, step, shape):
        self.calls.append(("latent", step))
        return super().latent(step, shape)

    def query_labels(self, step, round_index, batch, num_classes):
        self.calls.append(("labels", step, round_index))
        return super().query_labels(step, round_index, batch, num_classes)

    def sign_uniforms(self, step, round_index, first_teacher, grads, count):
        self.calls.append(("uniforms", step, round_index, first_teacher))
        return super().sign_uniforms(step, round_index, first_teacher, grads, count)

    def dp_noise(self, attempt, step, round_index, shape):
        self.calls.append(("noise", step, round_index))
        return super().dp_noise(attempt, step, round_index, shape)


def test_injected_draws_are_used_for_every_draw_and_default_is_unchanged():
    plain = DataLens(_config(), _dataset(), root_seed=3)
    recording = RecordingDraws(SeedTree(3))
    injected = DataLens(_config(), _dataset(), root_seed=3, draws=recording)
    for _ in range(2):
        a, b = plain.train_step(), injected.train_step()
        assert (a.teacher_loss, a.student_loss) == (b.teacher_loss, b.student_loss)
    for x, y in zip(plain.generator.weights, injected.generator.weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    kinds = [c[0] for c in recording.calls]
    assert kinds.count("latent") == 2 and kinds.count("labels") == 2
    assert kinds.count("noise") == 2
    assert kinds.count("uniforms") == 2 * 2          # 2 chunks (3 + 1 teachers) per step
    assert ("uniforms", 1, 0, 3) in recording.calls


class ShiftedNoise(SeededDraws):
    def dp_noise(self, attempt, step, round_index, shape):
        return super().dp_noise(attempt, step, round_index, shape) + 1000.0


def test_injected_noise_changes_the_release():
    """The run really takes its noise from the draws (a shifted noise passes everywhere)."""
    lens = DataLens(_config(), _dataset(), root_seed=3, draws=ShiftedNoise(SeedTree(3)))
    record = lens.train_step()
    assert record.pass_fraction == 1.0


def _slow_per_coordinate_votes(grads, coordinate_uniforms, topk, max_grad):
    """Literal numpy: per teacher and image, vote on the top-k |g| (lower index first on
    ties) with the uniform of that coordinate; +1 iff u < (1 + clip(g)/max|clip|) / 2."""
    t, b, d = grads.shape
    total = np.zeros((b, d), np.int64)
    for i in range(t):
        for j in range(b):
            g = grads[i, j]
            order = sorted(range(d), key=lambda c: (-abs(g[c]), c))[:topk]
            clipped = np.clip(g[order], -max_grad, max_grad)
            scale = np.max(np.abs(clipped))
            normalised = clipped / scale if scale > 0 else clipped
            for c, value in zip(order, normalised):
                prob = np.float32((np.float32(1.0) + np.float32(value)) / np.float32(2.0))
                total[j, c] += 1 if coordinate_uniforms[i, j, c] < prob else -1
    return total


def test_per_coordinate_uniforms_match_a_slow_reference():
    rng = np.random.default_rng(4)
    grads = (rng.standard_normal((3, 2, 40)) * 1e-5).astype(np.float32)
    grads[0, 0, :5] = 0.0                        # ties at zero
    uniforms = rng.uniform(size=grads.shape).astype(np.float32)
    in_order = topagg.uniforms_in_topk_order(tf.constant(grads), tf.constant(uniforms), 25)
    got = topagg.summed_votes(tf.constant(grads), in_order, topk=25, max_grad=1e-5,
                              method=Aggregation.TOPK_STOCHASTIC_SIGN,
                              backend="reference").numpy()
    np.testing.assert_array_equal(got, _slow_per_coordinate_votes(grads, uniforms, 25, 1e-5))
    with pytest.raises(ValueError, match="gradients' shape"):
        topagg.uniforms_in_topk_order(tf.constant(grads), tf.constant(uniforms[..., :5]), 25)


def test_release_with_given_noise_is_sum_plus_sigma_noise_thresholded():
    agg = topagg.TopAgg(TopAggConfig(topk=2, sigma=2.0, thresh=0.5), num_teachers=4)
    vote_sum = tf.constant([[0, 1, -1, 4]], tf.int32)
    noise = tf.constant([[1.0, 0.4, -0.6, -3.0]])
    # noisy = [2, 1.8, -2.2, -2]; threshold 2 -> [+1, 0, -1, -1]
    np.testing.assert_array_equal(agg.release(vote_sum, noise=noise).update.numpy(),
                                  [[1.0, 0.0, -1.0, -1.0]])
    with pytest.raises(ValueError, match="exactly one of seed= and noise="):
        agg.release(vote_sum)
    with pytest.raises(ValueError, match=r"noise must have shape \(1, 4\)"):
        agg.release(vote_sum, noise=noise[:, :2])
    with pytest.raises(ValueError, match="exactly one of seed= and uniforms="):
        agg.vote_sum(tf.zeros((1, 1, 4)))


class Observer:
    def __init__(self):
        self.rounds = []

    def round_released(self, step, round_index, images, one_hot, vote_sum, result):
        self.rounds.append((step, round_index, images.shape, vote_sum.numpy(),
                            result.update.numpy()))


def test_observer_sees_every_round_with_its_votes():
    observer = Observer()
    lens = DataLens(_config(g_step=2), _dataset(), root_seed=2)
    lens.observer = observer
    lens.train_step()
    assert [(s, r) for s, r, *_ in observer.rounds] == [(0, 0), (0, 1)]
    step, round_index, shape, vote_sum, update = observer.rounds[1]
    assert shape == (BATCH, 28, 28, 1) and vote_sum.shape == (BATCH, 784)
    # Each of the 4 teachers votes 30 coordinates per image.
    np.testing.assert_array_equal(np.abs(vote_sum).sum(axis=1) % 2, 0)
    assert np.all(np.abs(vote_sum).sum(axis=1) <= TEACHERS * 30)
    assert set(np.unique(update)) <= {-1.0, 0.0, 1.0}


# ------------------------------------------------------------------ fake rendering
def test_teacher_label_rendering_equals_one_generator_call_per_teacher():
    lens = DataLens(_config(fake_rendering=FakeRendering.TEACHER_LABELS), _dataset(),
                    root_seed=6)
    z = lens.latent(0)
    fakes = lens.teacher_fakes(z)
    real_labels = lens.labels[lens.partitions[:, :BATCH]]
    got = lens._chunk_fakes(fakes, 0, real_labels).numpy()
    for i in range(TEACHERS):
        want = lens.generator([z, tf.one_hot(real_labels[i], 10)], training=True).numpy()
        np.testing.assert_allclose(got[i], want, rtol=0, atol=1e-6)
    # Statistics over B images, not over the class grid's K*B: the renderings differ.
    grid = DataLens(_config(), _dataset(), root_seed=6)
    grid_fakes = ClassGridFakes(grid.teacher_fakes(z))(0, real_labels).numpy()
    assert np.max(np.abs(grid_fakes - got)) > 1e-4


def _generator_state(lens):
    return [v.numpy().copy() for v in lens.generator.non_trainable_variables]


def test_teacher_label_rendering_leaves_the_generators_moving_statistics_alone():
    """The per-teacher renders are a function of private labels; the generator's BN moving
    statistics (published in generator.keras) must not take them in."""
    lens = DataLens(_config(fake_rendering=FakeRendering.TEACHER_LABELS), _dataset(),
                    root_seed=6)
    before = _generator_state(lens)
    lens.teacher_fakes(lens.latent(0))
    for old, new in zip(before, _generator_state(lens)):
        np.testing.assert_array_equal(old, new)
    # The generator's own training-mode call does move them (else the check is empty).
    lens.generator([lens.latent(0), tf.one_hot(np.arange(BATCH), 10)], training=True)
    assert any(np.any(old != new) for old, new in zip(before, _generator_state(lens)))


def test_published_generator_state_beside_the_votes_ignores_one_teachers_labels():
    """Neighbouring datasets (every label of teacher 0's records changed): after one step
    the generator's trainable weights differ (through the votes), its moving statistics
    are bit-equal, so they add nothing to what the ledger covers."""
    config = _config(fake_rendering=FakeRendering.TEACHER_LABELS)
    first = _dataset()
    lens = DataLens(config, first, root_seed=6)
    labels = first.labels.copy()
    swapped = lens.partitions[0]
    labels[swapped] = (labels[swapped] + 1 + np.arange(len(swapped))) % 10
    neighbour = dataclasses.replace(first, labels=labels)
    other = DataLens(config, neighbour, root_seed=6, partitions=lens.partitions)
    lens.train_step()
    other.train_step()
    weights = zip(lens.generator.trainable_variables, other.generator.trainable_variables)
    assert any(np.any(a.numpy() != b.numpy()) for a, b in weights)
    for a, b in zip(_generator_state(lens), _generator_state(other)):
        np.testing.assert_array_equal(a, b)


def test_fake_rendering_is_a_config_value():
    config = _config(fake_rendering=FakeRendering.TEACHER_LABELS)
    assert DataLensConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="fake_rendering must be one of"):
        dataclasses.replace(config.train, fake_rendering="teacher_labels")
