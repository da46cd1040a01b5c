"""The fused teacher-step op (ops/teacher_step_op.cc) against the plain reference ensemble.

dclens.datalens.teachers.TeacherEnsemble (checked against Keras in test_teachers.py) is the slow,
obviously correct reference.  The op computes the same math with other summation orders
and FMA, so results agree within float32 round-off:

* gradients: Adam's first moment after ONE step from m = 0 is exactly (1 - beta1) g, so
  comparing it compares every parameter's gradient; RTOL_GRAD relative to the largest
  entry (a wrong tap, label, group or teacher gives differences of order 1);
* several steps: round-off amplified by Adam where a gradient is tiny (see
  test_several_steps_stay_with_the_reference), so weights within Adam's reach (lr per
  step) and moments within 2e-2;
* losses RTOL_LOSS, image gradients RTOL_GRAD.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from dclens.datalens import networks, teacher_op, teachers
from dclens.datalens.fast_ensemble import FastTeacherEnsemble
from dclens.datalens.teachers import ADAM_BETA2, ADAM_EPSILON, ParamLayout, TeacherState

RTOL_GRAD = 1e-4
RTOL_LOSS = 1e-5
LR, BETA1 = 1e-3, 0.5

pytestmark = pytest.mark.skipif(not teacher_op.available(),
                                reason="ops/_dclens_teacher_ops.so not built (make -C ops)")


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _case(shape: networks.ImageShape, num_teachers: int, batch: int, seed: int):
    rng = np.random.default_rng(seed)
    layout = ParamLayout.for_shape(shape)
    weights = teachers.initial_teacher_weights(layout, num_teachers, rng)
    weights += rng.normal(0, 0.05, weights.shape).astype(np.float32)   # not at the init
    dims = (num_teachers, batch, shape.height, shape.width, shape.channels)
    real = rng.uniform(size=dims).astype(np.float32)
    fake = rng.normal(0.3, 0.2, size=dims).astype(np.float32)     # other statistics
    labels = rng.integers(0, shape.num_classes, size=(num_teachers, batch))
    return layout, weights, real, fake, labels


def _reference_train(shape, weights, real, fake, labels, num_steps):
    reference = teachers.TeacherEnsemble(shape, learning_rate=LR, beta1=BETA1)
    t = weights.shape[0]
    state = TeacherState(tf.constant(weights), tf.zeros_like(weights), tf.zeros_like(weights),
                         tf.zeros([t], tf.int64))
    one_hot = tf.one_hot(labels, shape.num_classes)
    return reference.train(state, real, one_hot, fake, one_hot, num_steps=num_steps)


def _op_train(shape, weights, real, fake, labels, num_steps, first_step=0):
    zeros = np.zeros_like(weights)
    return teacher_op.train(
        weights, zeros, zeros, np.concatenate([real, fake], axis=1),
        np.concatenate([labels, labels], axis=1).astype(np.int32), first_step, shape=shape,
        num_steps=num_steps, learning_rate=LR, beta1=BETA1, beta2=ADAM_BETA2,
        epsilon=ADAM_EPSILON)


SHAPES = [networks.ImageShape(28, 28, 1, 10),      # Fashion-MNIST
          networks.ImageShape(8, 12, 3, 2)]         # colour, not square, 2 classes


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.height}x{s.width}x{s.channels}")
def test_one_step_gradients_and_loss_equal_the_reference(shape):
    _, weights, real, fake, labels = _case(shape, num_teachers=3, batch=5, seed=1)
    (ref_state, ref_loss) = _reference_train(shape, weights, real, fake, labels, 1)
    _, adam_m, adam_v, loss = _op_train(shape, weights, real, fake, labels, 1)
    np.testing.assert_allclose(loss, ref_loss, rtol=RTOL_LOSS)
    # m = (1 - beta1) g: the gradient of every parameter of every teacher
    assert _relative(adam_m, ref_state.adam_m) < RTOL_GRAD
    assert _relative(adam_v, ref_state.adam_v) < 2 * RTOL_GRAD


def test_celeba_sized_teacher_equals_the_reference():
    """64x64x3 with 2 classes (the CelebA-Gender teacher, 2.2M parameters): the larger
    buffers of every layer; one teacher, six images per half (batch norm over two images per
    half is too ill-conditioned for a 1e-4 comparison of gradients)."""
    shape = networks.ImageShape(64, 64, 3, 2)
    _, weights, real, fake, labels = _case(shape, num_teachers=1, batch=6, seed=14)
    ref_state, ref_loss = _reference_train(shape, weights, real, fake, labels, 1)
    _, adam_m, _, loss = _op_train(shape, weights, real, fake, labels, 1)
    np.testing.assert_allclose(loss, ref_loss, rtol=RTOL_LOSS)
    assert _relative(adam_m, ref_state.adam_m) < RTOL_GRAD
    reference = teachers.TeacherEnsemble(shape, learning_rate=LR, beta1=BETA1)
    expected = reference.image_gradients(weights, real[0], tf.one_hot(labels[0], 2))
    got = teacher_op.image_gradients_numpy(weights, real[0], labels[0], shape=shape)
    assert _relative(got, expected) < RTOL_GRAD


def test_several_steps_stay_with_the_reference():
    """After the first step the weights differ by round-off amplified by Adam where a
    gradient is tiny (Adam's step is +-lr whatever the size of g), and later gradients
    follow: TF's own fast path departs from the reference by the same amount on this case
    (measured: Adam moments 3.7e-3 relative after 2 steps, 0.31 of a reach at most, on both
    paths).  Held: moments within 2e-2, no weight a whole Adam reach away, and at most 2%
    of the weights beyond 1% of a reach (a wrong learning rate, moment or normalisation
    moves nearly all of them by a whole reach)."""
    shape = SHAPES[0]
    _, weights, real, fake, labels = _case(shape, num_teachers=2, batch=6, seed=2)
    ref_state, ref_loss = _reference_train(shape, weights, real, fake, labels, 3)
    new_weights, adam_m, adam_v, loss = _op_train(shape, weights, real, fake, labels, 3)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-3)
    assert _relative(adam_m, ref_state.adam_m) < 2e-2
    assert _relative(adam_v, ref_state.adam_v) < 4e-2
    reach = 3 * LR                                       # Adam moves a weight <= lr a step
    difference = np.abs(np.asarray(new_weights) - np.asarray(ref_state.weights))
    assert difference.max() < reach
    assert np.mean(difference > 0.01 * reach) < 0.02
    # the weights did move (the comparison is not of two unchanged copies)
    assert np.abs(np.asarray(new_weights) - weights).max() > 0.5 * LR


def test_adam_step_count_sets_the_bias_correction():
    shape = SHAPES[1]
    _, weights, real, fake, labels = _case(shape, num_teachers=2, batch=4, seed=3)
    reference = teachers.TeacherEnsemble(shape, learning_rate=LR, beta1=BETA1)
    rng = np.random.default_rng(4)
    m = rng.normal(0, 1e-3, weights.shape).astype(np.float32)
    v = rng.uniform(0, 1e-6, weights.shape).astype(np.float32)
    state = TeacherState(tf.constant(weights), tf.constant(m), tf.constant(v),
                         tf.constant([7, 7], tf.int64))
    one_hot = tf.one_hot(labels, shape.num_classes)
    ref_state, _ = reference.train(state, real, one_hot, fake, one_hot, num_steps=1)
    new_weights, adam_m, _, _ = teacher_op.train(
        weights, m, v, np.concatenate([real, fake], 1),
        np.concatenate([labels, labels], 1).astype(np.int32), 7, shape=shape, num_steps=1,
        learning_rate=LR, beta1=BETA1, beta2=ADAM_BETA2, epsilon=ADAM_EPSILON)
    assert _relative(adam_m, ref_state.adam_m) < RTOL_GRAD
    step = np.asarray(new_weights) - weights
    ref_step = np.asarray(ref_state.weights) - weights
    assert _relative(step, ref_step) < 1e-3          # alpha_8 = lr sqrt(1-b2^8)/(1-b1^8)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.height}x{s.width}x{s.channels}")
def test_image_gradients_equal_the_reference(shape):
    _, weights, real, _, labels = _case(shape, num_teachers=3, batch=5, seed=5)
    reference = teachers.TeacherEnsemble(shape, learning_rate=LR, beta1=BETA1)
    one_hot = tf.one_hot(labels[0], shape.num_classes)
    expected = reference.image_gradients(weights, real[0], one_hot)
    got = teacher_op.image_gradients(weights, real[0], labels[0].astype(np.int32), shape=shape)
    assert got.shape == expected.shape
    assert _relative(got, expected) < RTOL_GRAD


def test_same_inputs_give_the_same_bits():
    shape = SHAPES[0]
    _, weights, real, fake, labels = _case(shape, num_teachers=4, batch=3, seed=6)
    first = _op_train(shape, weights, real, fake, labels, 2)
    second = _op_train(shape, weights, real, fake, labels, 2)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    # and a teacher's result does not depend on the other teachers of its chunk
    alone = _op_train(shape, weights[2:3], real[2:3], fake[2:3], labels[2:3], 2)
    for a, b in zip(first, alone):
        np.testing.assert_array_equal(np.asarray(a)[2:3], b)


def test_fast_ensemble_on_the_fused_path_equals_the_per_teacher_path():
    shape = SHAPES[0]
    _, weights, real, fake, labels = _case(shape, num_teachers=3, batch=4, seed=7)
    one_hot = tf.one_hot(labels, shape.num_classes)
    results = {}
    for path in ("fused", "per_teacher"):
        ensemble = FastTeacherEnsemble(shape, learning_rate=LR, beta1=BETA1, conv_path=path)
        state = TeacherState(tf.constant(weights), tf.zeros_like(weights),
                             tf.zeros_like(weights), tf.constant([4, 4, 4], tf.int64))
        new_state, loss = ensemble.train(state, real, one_hot, fake, one_hot, num_steps=2)
        grads = ensemble.image_gradients(weights, real[0], one_hot[0])
        results[path] = (new_state, loss, grads)
    fused, per_teacher = results["fused"], results["per_teacher"]
    np.testing.assert_array_equal(fused[0].steps, [6, 6, 6])
    np.testing.assert_allclose(fused[1], per_teacher[1], rtol=RTOL_LOSS)
    assert _relative(fused[0].adam_m, per_teacher[0].adam_m) < RTOL_GRAD
    assert _relative(fused[2], per_teacher[2]) < RTOL_GRAD


def test_mixed_step_counts_fall_back_to_the_formula():
    shape = SHAPES[1]
    _, weights, real, fake, labels = _case(shape, num_teachers=2, batch=4, seed=8)
    one_hot = tf.one_hot(labels, shape.num_classes)
    ensemble = FastTeacherEnsemble(shape, learning_rate=LR, beta1=BETA1, conv_path="fused")
    state = TeacherState(tf.constant(weights), tf.zeros_like(weights), tf.zeros_like(weights),
                         tf.constant([0, 3], tf.int64))
    new_state, _ = ensemble.train(state, real, one_hot, fake, one_hot, num_steps=1)
    np.testing.assert_array_equal(new_state.steps, [1, 4])
    assert np.all(np.isfinite(new_state.weights))


@pytest.mark.parametrize("change, message", [
    ("label", r"label 10 at position 0 is outside \[0, 10\)"),
    ("weights", r"weights must be \[teachers, 555"),
    ("odd", r"real then fake halves of equal size, got 5 images"),
    ("teachers", r"weights has 2 teachers, the images 3"),
])
def test_bad_inputs_are_refused_by_name(change, message):
    shape = SHAPES[0]
    _, weights, real, fake, labels = _case(shape, num_teachers=3, batch=3, seed=9)
    images = np.concatenate([real, fake], 1)
    both = np.concatenate([labels, labels], 1).astype(np.int32)
    if change == "label":
        both[0, 0] = 10
    elif change == "weights":
        weights = weights[:, :-1]
    elif change == "odd":
        images, both = images[:, :5], both[:, :5]
    elif change == "teachers":
        weights = weights[:2]
    zeros = np.zeros_like(weights)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        teacher_op.train(weights, zeros, zeros, images, both, 0, shape=shape, num_steps=1,
                         learning_rate=LR, beta1=BETA1, beta2=ADAM_BETA2,
                         epsilon=ADAM_EPSILON)


def test_every_entry_point_refuses_an_uneven_batch_split_in_the_kernels_validate():
    """The kernel's batch-norm groups (real half, fake half) and the pooled buffers sized
    from them need the batch to split evenly; the shared Validate refuses anything else
    for the TF ops and the C entry points alike (no entry point checks it on its own)."""
    shape = SHAPES[0]
    _, weights, real, fake, labels = _case(shape, num_teachers=2, batch=3, seed=12)
    images = np.ascontiguousarray(np.concatenate([real, fake], 1)[:, :5])
    both = np.ascontiguousarray(np.concatenate([labels, labels], 1)[:, :5].astype(np.int32))
    state = [weights.copy(), np.zeros_like(weights), np.zeros_like(weights)]
    with pytest.raises(ValueError, match=r"real then fake halves of equal size, got 5 images"):
        teacher_op.train_in_place(*state, images, both, 0, shape=shape, num_steps=1,
                                  learning_rate=LR, beta1=BETA1, beta2=ADAM_BETA2,
                                  epsilon=ADAM_EPSILON)
    np.testing.assert_array_equal(state[0], weights)         # nothing was written
    empty = np.zeros((0, *real.shape[2:]), np.float32)
    with pytest.raises(ValueError, match="the batch is empty"):
        teacher_op.image_gradients_numpy(weights, empty, np.zeros(0, np.int32), shape=shape)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the batch is empty"):
        teacher_op.image_gradients(weights, empty, np.zeros(0, np.int32), shape=shape)


# ------------------------------------------------------------- numpy state, in place (ctypes)
def _in_place_case(shape, seed: int):
    """Three teachers' (weights, m, v) away from the init, their merged real + fake images
    [3, 8, ...] and labels [3, 8], and the real half's (images, labels) for queries."""
    _, weights, real, fake, labels = _case(shape, num_teachers=3, batch=4, seed=seed)
    rng = np.random.default_rng(seed + 1)
    m = rng.normal(0, 1e-3, weights.shape).astype(np.float32)
    v = rng.uniform(0, 1e-6, weights.shape).astype(np.float32)
    images = np.concatenate([real, fake], 1)
    both = np.concatenate([labels, labels], 1).astype(np.int32)
    return (weights, m, v), images, both, (real, labels)


def test_in_place_entry_point_gives_the_ops_bits_and_overwrites_the_state():
    assert teacher_op.capi_available(), teacher_op.CAPI_LIBRARY
    shape = SHAPES[1]
    (weights, m, v), images, both, (real, labels) = _in_place_case(shape, seed=10)
    expected = teacher_op.train(weights, m, v, images, both, 5, shape=shape, num_steps=2,
                                learning_rate=LR, beta1=BETA1, beta2=ADAM_BETA2,
                                epsilon=ADAM_EPSILON)
    state = [weights.copy(), m.copy(), v.copy()]
    losses = teacher_op.train_in_place(*state, images, both, 5, shape=shape, num_steps=2,
                                       learning_rate=LR, beta1=BETA1, beta2=ADAM_BETA2,
                                       epsilon=ADAM_EPSILON)
    for got, want in zip(state + [losses], expected):
        np.testing.assert_array_equal(got, want)
    queries = teacher_op.image_gradients_numpy(weights, real[0], labels[0], shape=shape)
    np.testing.assert_array_equal(
        queries, teacher_op.image_gradients(weights, real[0], labels[0].astype(np.int32),
                                            shape=shape))


def test_in_place_entry_point_takes_rows_of_a_padded_buffer_and_leaves_the_padding():
    """A disk bank's staging rows are P floats of a wider row (teacher_bank.aligned_rows):
    training and querying them in place gives the packed arrays' bits, and the padding
    after each row (filled with a NaN sentinel here) is never read or written."""
    shape = SHAPES[1]
    (weights, m, v), images, both, (real, labels) = _in_place_case(shape, seed=14)
    packed = [weights.copy(), m.copy(), v.copy()]
    packed_losses = teacher_op.train_in_place(
        *packed, images, both, 3, shape=shape, num_steps=2, learning_rate=LR, beta1=BETA1,
        beta2=ADAM_BETA2, epsilon=ADAM_EPSILON)
    p = weights.shape[1]
    padded = []
    for array in (weights, m, v):
        wide = np.full((3, p + 29), np.nan, np.float32)
        wide[:, :p] = array
        padded.append(wide)
    views = [wide[:, :p] for wide in padded]
    assert teacher_op.row_stride(views[0]) == p + 29 and teacher_op.in_place_ready(*views)
    losses = teacher_op.train_in_place(
        *views, images, both, 3, shape=shape, num_steps=2, learning_rate=LR, beta1=BETA1,
        beta2=ADAM_BETA2, epsilon=ADAM_EPSILON)
    np.testing.assert_array_equal(losses, packed_losses)
    for wide, want in zip(padded, packed):
        np.testing.assert_array_equal(wide[:, :p], want)
        assert np.isnan(wide[:, p:]).all()
    np.testing.assert_array_equal(
        teacher_op.image_gradients_numpy(views[0], real[0], labels[0], shape=shape),
        teacher_op.image_gradients_numpy(packed[0], real[0], labels[0], shape=shape))
    assert not teacher_op.in_place_ready(views[0], packed[1], packed[2])   # strides differ
    assert teacher_op.row_stride(np.asfortranarray(weights)) is None


def test_in_place_entry_point_refuses_bad_input_and_writes_nothing():
    shape = SHAPES[0]
    _, weights, real, fake, labels = _case(shape, num_teachers=2, batch=3, seed=12)
    both = np.concatenate([labels, labels], 1)
    both[1, 2] = -1
    before = weights.copy()
    zeros = [np.zeros_like(weights), np.zeros_like(weights)]
    with pytest.raises(ValueError, match=r"label -1 at position 8 is outside \[0, 10\)"):
        teacher_op.train_in_place(weights, *zeros, np.concatenate([real, fake], 1), both, 0,
                                  shape=shape, num_steps=1, learning_rate=LR, beta1=BETA1,
                                  beta2=ADAM_BETA2, epsilon=ADAM_EPSILON)
    np.testing.assert_array_equal(weights, before)
    with pytest.raises(ValueError, match="writable float32 .* contiguous rows"):
        teacher_op.train_in_place(weights.astype(np.float64), *zeros,
                                  np.concatenate([real, fake], 1), both, 0, shape=shape,
                                  num_steps=1, learning_rate=LR, beta1=BETA1,
                                  beta2=ADAM_BETA2, epsilon=ADAM_EPSILON)


def test_fast_ensemble_trains_a_bank_chunk_in_place_as_train_does():
    shape = SHAPES[0]
    _, weights, real, fake, labels = _case(shape, num_teachers=2, batch=3, seed=13)
    one_hot = tf.one_hot(labels, shape.num_classes)
    ensemble = FastTeacherEnsemble(shape, learning_rate=LR, beta1=BETA1, conv_path="fused")
    state = TeacherState(weights.copy(), np.zeros_like(weights), np.zeros_like(weights),
                         np.array([2, 2]))
    assert ensemble.can_train_in_place(state)
    copied, loss = ensemble.train(state, real, one_hot, fake, one_hot, num_steps=2)
    np.testing.assert_array_equal(state.weights, weights)       # train() copies
    in_place_loss = ensemble.train_in_place(state, real, one_hot, fake, one_hot, num_steps=2)
    np.testing.assert_array_equal(in_place_loss, loss)
    np.testing.assert_array_equal(state.weights, copied.weights)
    np.testing.assert_array_equal(state.adam_v, copied.adam_v)
    mixed = state._replace(steps=np.array([1, 2]))
    assert not ensemble.can_train_in_place(mixed)
    assert not ensemble.can_train_in_place(state._replace(weights=tf.constant(weights)))


def test_a_c_library_from_other_sources_is_refused_not_called(monkeypatch):
    """A library without the current signature version (here the TopAgg op's, which has
    none) would be called with the wrong arguments: it is refused with the build hint."""
    other = teacher_op.OPS_DIR / "_dclens_ops.so"
    if not other.exists():
        pytest.skip(f"{other} not built")
    monkeypatch.setenv(teacher_op.ENV_CAPI_LIBRARY, str(other))
    assert not teacher_op.capi_available()
    with pytest.raises(teacher_op.TeacherOpUnavailable, match="older sources.*make -C ops"):
        teacher_op.load_capi()
