"""Fast paths equal the plain reference within float32 round-off.

* :class:`dclens.datalens.fast_ensemble.FastTeacherEnsemble` (label maps folded out of the
  convolutions, grouped layout, real+fake in one pass, fused Adam) against
  :class:`dclens.datalens.teachers.TeacherEnsemble` (itself tested against Keras in test_teachers.py):
  logits, loss gradients, teacher updates, image gradients.
* The streamed, disk-backed bank (:mod:`dclens.datalens.bank_stream`) against the bank in RAM, and
  the fused "train a chunk, then query it" generator step against training all teachers
  first and querying them afterwards.
"""

import concurrent.futures

import numpy as np
import pytest
import tensorflow as tf

from dclens.datalens import teacher_bank
from dclens.datalens import bank_stream, networks, teachers
from dclens import data
from dclens.datalens.config import BudgetConfig, DataLensConfig, TopAggConfig, TrainConfig
from dclens.datalens.fast_ensemble import FastTeacherEnsemble, same_padding_taps
from dclens.common.profiling import PhaseTimer
from dclens.datalens.build import bank_location
from dclens.datalens.train import DataLens, TeacherPlacement

SHAPES = {
    "28x28x1": networks.ImageShape(28, 28, 1, 10),
    "8x8x3": networks.ImageShape(8, 8, 3, 2),
}
LR, BETA1 = 1e-3, 0.5


def _pair(shape):
    return (teachers.TeacherEnsemble(shape, learning_rate=LR, beta1=BETA1),
            FastTeacherEnsemble(shape, learning_rate=LR, beta1=BETA1))


def _bank(shape, n, seed=1, directory=None, resident_rows=0):
    layout = teachers.ParamLayout.for_shape(shape)
    bank = teacher_bank.TeacherBank.create(layout, n, seed=seed, directory=directory,
                                       resident_rows=resident_rows)
    rng = np.random.default_rng(seed)   # non-trivial batch-norm parameters
    bank.assign("weights", bank.weights + rng.normal(0, 0.05, bank.weights.shape)
                .astype(np.float32))
    return bank


def _batch(rng, shape, t, b):
    images = rng.uniform(size=(t, b, shape.height, shape.width, shape.channels))
    labels = rng.integers(0, shape.num_classes, size=(t, b))
    return (tf.constant(images.astype(np.float32)),
            tf.constant(np.eye(shape.num_classes, dtype=np.float32)[labels]))


def test_same_padding_taps_count_inside_taps():
    taps = same_padding_taps(28, 28)
    assert taps.shape == (14 * 14, 25)
    assert taps[14 * 7 + 7].sum() == 25          # interior output: every tap inside
    assert taps[0].sum() == 16                    # corner: 4 x 4 taps (pad 1 top/left)
    assert taps[-1].sum() == 9                    # opposite corner (pad 2 bottom/right)


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_logits_match_reference(shape_name):
    shape = SHAPES[shape_name]
    reference, fast = _pair(shape)
    bank = _bank(shape, 3)
    images, labels = _batch(np.random.default_rng(0), shape, 3, 5)
    weights = tf.constant(bank.weights)
    np.testing.assert_allclose(fast.logits(weights, images, labels),
                               reference.logits(weights, images, labels),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_loss_gradients_match_reference(shape_name):
    """Real and fake in one pass (batch norm per half) = two separate passes."""
    shape = SHAPES[shape_name]
    reference, fast = _pair(shape)
    bank = _bank(shape, 3)
    rng = np.random.default_rng(1)
    real, real_y = _batch(rng, shape, 3, 6)
    fake, fake_y = _batch(rng, shape, 3, 6)
    weights = tf.constant(bank.weights)
    with tf.GradientTape() as tape:
        tape.watch(weights)
        want_losses = reference.discriminator_loss(weights, real, real_y, fake, fake_y)
        want_total = tf.reduce_sum(want_losses)
    want = tape.gradient(want_total, weights).numpy()
    both, labels = fast._merge(real, real_y, fake, fake_y)
    got_losses, got = fast._grad(weights, both, labels)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    scale = np.abs(want).max(axis=1, keepdims=True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-5 * scale.max())


@pytest.mark.parametrize("num_steps", [1, 2])
def test_train_matches_reference(num_steps):
    shape = SHAPES["8x8x3"]
    reference, fast = _pair(shape)
    bank = _bank(shape, 3)
    rng = np.random.default_rng(3)
    real, real_y = _batch(rng, shape, 3, 6)
    fake, fake_y = _batch(rng, shape, 3, 6)
    state = bank.read(0, 3)
    want, want_losses = reference.train(state, real, real_y, fake, fake_y, num_steps=num_steps)
    got, got_losses = fast.train(state, real, real_y, fake, fake_y, num_steps=num_steps)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    assert got.steps.numpy().tolist() == [num_steps] * 3
    # Where a gradient is ~0 (a bias followed by batch norm has exact gradient 0), Adam's
    # step is decided by round-off (see test_teachers.py); compare elsewhere, bound there.
    conditioned = np.ones(bank.weights.shape, bool)
    current = state
    for _ in range(num_steps):
        with tf.GradientTape() as tape:
            tape.watch(current.weights)
            total = tf.reduce_sum(reference.discriminator_loss(current.weights, real, real_y,
                                                               fake, fake_y))
        conditioned &= np.abs(tape.gradient(total, current.weights).numpy()) > 1e-5
        current, _ = reference.train(current, real, real_y, fake, fake_y, num_steps=1)
    assert conditioned.mean() > 0.9
    np.testing.assert_allclose(got.weights.numpy()[conditioned],
                               want.weights.numpy()[conditioned], atol=2e-6 * num_steps)
    for name in ("adam_m", "adam_v"):   # moments: relative to their largest value
        mine, theirs = getattr(got, name).numpy(), getattr(want, name).numpy()
        np.testing.assert_allclose(mine, theirs, rtol=1e-3, atol=1e-4 * np.abs(theirs).max())
    bound = LR * (1 - BETA1) / np.sqrt(1 - teachers.ADAM_BETA2) * num_steps
    assert np.abs(got.weights.numpy() - bank.weights).max() <= bound


def test_train_with_mixed_step_counts_uses_the_formula():
    """Teachers at different Adam steps (not one count for the chunk) still match."""
    shape = SHAPES["8x8x3"]
    reference, fast = _pair(shape)
    bank = _bank(shape, 2)
    rng = np.random.default_rng(4)
    real, real_y = _batch(rng, shape, 2, 4)
    fake, fake_y = _batch(rng, shape, 2, 4)
    state = bank.read(0, 2)
    state = teachers.TeacherState(state.weights, state.adam_m + 1e-3, state.adam_v + 1e-4,
                                  tf.constant([3, 7], tf.int64))
    want, _ = reference.train(state, real, real_y, fake, fake_y, num_steps=1)
    got, _ = fast.train(state, real, real_y, fake, fake_y, num_steps=1)
    assert got.steps.numpy().tolist() == [4, 8]
    np.testing.assert_allclose(got.weights, want.weights, atol=1e-6)


def test_train_returns_snapshots():
    """A later call (same chunk size, same variables) does not change an earlier result."""
    shape = SHAPES["8x8x3"]
    _, fast = _pair(shape)
    bank = _bank(shape, 2)
    real, real_y = _batch(np.random.default_rng(5), shape, 2, 4)
    first, _ = fast.train(bank.read(0, 2), real, real_y, real, real_y, num_steps=1)
    kept = first.weights.numpy().copy()
    fast.train(bank.read(0, 2), real + 0.5, real_y, real, real_y, num_steps=1)
    np.testing.assert_array_equal(first.weights.numpy(), kept)


def test_fast_teachers_are_independent():
    shape = SHAPES["8x8x3"]
    _, fast = _pair(shape)
    bank = _bank(shape, 3)
    rng = np.random.default_rng(6)
    real, real_y = _batch(rng, shape, 3, 6)
    fake, fake_y = _batch(rng, shape, 3, 6)
    base, _ = fast.train(bank.read(0, 3), real, real_y, fake, fake_y, num_steps=2)
    base = [x.numpy() for x in base[:3]]
    changed_real = real.numpy()
    changed_real[0] = rng.uniform(size=changed_real[0].shape)
    changed, _ = fast.train(bank.read(0, 3), changed_real, real_y, fake, fake_y, num_steps=2)
    assert not np.allclose(base[0][0], changed.weights.numpy()[0])
    for mine, theirs in zip(base, changed[:3]):
        np.testing.assert_array_equal(mine[1:], theirs.numpy()[1:])


@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_image_gradients_match_reference(shape_name):
    shape = SHAPES[shape_name]
    reference, fast = _pair(shape)
    bank = _bank(shape, 3)
    images, labels = _batch(np.random.default_rng(7), shape, 1, 4)
    weights = tf.constant(bank.weights)
    want = reference.image_gradients(weights, images[0], labels[0]).numpy()
    got = fast.image_gradients(weights, images[0], labels[0]).numpy()
    assert got.shape == want.shape == (3, 4, shape.height, shape.width, shape.channels)
    for t in range(3):
        scale = np.abs(want[t]).max()
        np.testing.assert_allclose(got[t], want[t], rtol=1e-3, atol=1e-4 * scale)


# ----------------------------------------------------------------------------- bank I/O
@pytest.mark.parametrize("where", ["ram", "disk", "disk+4 resident"])
@pytest.mark.parametrize("overlap", [False, True])
def test_chunk_stream_reads_and_writes_every_chunk(tmp_path, where, overlap):
    """Chunks of 3 over 7 teachers; with 4 resident rows chunk [3, 6) straddles the tier."""
    shape = SHAPES["8x8x3"]
    on_disk = where != "ram"
    bank = _bank(shape, 7, directory=tmp_path / "bank" if on_disk else None,
                 resident_rows=4 if "resident" in where else 0)
    assert bank.on_disk == on_disk
    before = np.array(bank.weights)
    timer = PhaseTimer()
    with bank_stream.ChunkStream(bank, 3, with_adam=True, timer=timer,
                                 overlap=overlap) as stream:
        seen = []
        for chunk in stream:
            np.testing.assert_array_equal(chunk.state.weights, before[chunk.start:chunk.stop])
            seen.append((chunk.start, chunk.stop))
            new = teachers.TeacherState(tf.constant(chunk.state.weights) + 1.0,
                                        tf.constant(chunk.state.adam_m) + 2.0,
                                        tf.constant(chunk.state.adam_v) + 3.0,
                                        chunk.state.steps + 1)
            stream.write_back(chunk, new)
    assert seen == [(0, 3), (3, 6), (6, 7)]
    np.testing.assert_array_equal(bank.weights, before + 1.0)
    np.testing.assert_array_equal(bank.adam_v, 3.0)
    assert bank.steps.tolist() == [1] * 7
    seconds = timer.take()
    assert "teacher_io" in seconds and "teacher_io_background" in seconds
    with bank_stream.ChunkStream(bank, 4, with_adam=False, overlap=overlap) as stream:
        chunks = list(stream)
    assert chunks[1].state.adam_m is None
    np.testing.assert_array_equal(chunks[1].state.weights, before[4:7] + 1.0)


def test_resident_rows_sync_to_files(tmp_path):
    bank = _bank(SHAPES["8x8x3"], 5, directory=tmp_path, resident_rows=2)
    assert bank.resident_rows == 2
    new = np.arange(bank.weights.size, dtype=np.float32).reshape(bank.weights.shape)
    bank.assign("weights", new)
    whole = bank.weights                         # synced, read-only
    np.testing.assert_array_equal(whole, new)
    assert not whole.flags.writeable
    on_disk = np.load(tmp_path / "weights.npy")     # rows padded to whole disk blocks
    assert on_disk.shape == (5, teacher_bank.padded_columns(new.shape[1]))
    np.testing.assert_array_equal(on_disk[:, :new.shape[1]], new)
    assert not on_disk[:, new.shape[1]:].any()
    state = bank.row_views(0, 2)
    np.testing.assert_array_equal(state.weights, new[:2])
    assert not bank.in_ram(1, 3)


def test_chunk_stream_raises_write_errors():
    bank = _bank(SHAPES["8x8x3"], 4)
    with pytest.raises(ValueError, match="need shape"):
        with bank_stream.ChunkStream(bank, 2, with_adam=True) as stream:
            for chunk in stream:
                stream.write_back(chunk, teachers.TeacherState(
                    np.zeros((1, 1), np.float32), chunk.state.adam_m, chunk.state.adam_v,
                    chunk.state.steps))


class _WriteFinishingBetweenLooks(concurrent.futures.Future):
    """A failed write that is still running at the first look and finished at every later
    one: the moment a write lands between two passes over the queued writes."""

    def __init__(self):
        super().__init__()
        self.set_exception(OSError("disk gone"))
        self.looks = 0

    def done(self):
        self.looks += 1
        return self.looks > 1


def test_a_write_finishing_while_the_queue_is_pruned_still_raises(monkeypatch):
    """write_back looks at each queued write once: a write that finishes while the queue is
    pruned stays queued, so close() raises its error (before, it was dropped unraised)."""
    bank = _bank(SHAPES["8x8x3"], 4)
    stream = bank_stream.ChunkStream(bank, 2, with_adam=True, overlap=False)
    racing = _WriteFinishingBetweenLooks()
    monkeypatch.setattr(stream, "_submit", lambda work: racing)
    chunk = next(iter(stream))
    stream.write_back(chunk, chunk.state)
    assert racing.looks == 1 and stream._pending == [racing]
    with pytest.raises(OSError, match="disk gone"):
        stream.close()


def test_disk_bank_refuses_a_disk_too_small(tmp_path, monkeypatch):
    layout = teachers.ParamLayout.for_shape(SHAPES["8x8x3"])
    usage = teacher_bank.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(teacher_bank.shutil, "disk_usage",
                        lambda path: usage._replace(free=1000))
    with pytest.raises(teacher_bank.BankSpaceError, match="needs"):
        teacher_bank.TeacherBank.create(layout, 4, seed=0, directory=tmp_path)


def test_bank_location_by_budget():
    config = DataLensConfig(train=TrainConfig(num_teachers=4000))
    assert bank_location(config, "/x", ram_budget=30 * 2 ** 30) is None
    assert bank_location(config, "/x", ram_budget=20 * 2 ** 30) == "/x"   # 24.8 GiB bank


# ----------------------------------------------------------------------------- DataLens
def _tiny_lens(bank_dir=None, ensemble="fast", g_step=1, bank_ram_bytes=None,
               bank_direct_io=None) -> DataLens:
    rng = np.random.default_rng(0)
    n = 70
    dataset = data.LabeledImages(rng.uniform(size=(n, 28, 28, 1)).astype(np.float32),
                                 (np.arange(n) % 10).astype(np.int64),
                                 data.dataset_spec("fashion_mnist"), "synthetic")
    config = DataLensConfig(
        train=TrainConfig(num_teachers=7, batch_size=10, d_step=2, pretrain_teacher=0,
                          z_dim=8, teacher_chunk=3, g_step=g_step),
        topagg=TopAggConfig(topk=50, sigma=5.0, thresh=0.2),
        budget=BudgetConfig(max_eps=1e6))
    return DataLens(config, dataset, root_seed=5, placement=TeacherPlacement(
        bank_dir=bank_dir, ensemble=ensemble, bank_ram_bytes=bank_ram_bytes,
        bank_direct_io=bank_direct_io))


@pytest.mark.parametrize("direct_io", [False, None], ids=["buffered", "direct if possible"])
def test_disk_bank_run_equals_ram_bank_run(tmp_path, direct_io):
    """7 teachers in chunks of 3, 4 of them resident: RAM, straddling and disk chunks."""
    layout = teachers.ParamLayout.for_shape(SHAPES["28x28x1"])
    ram = _tiny_lens()
    disk = _tiny_lens(bank_dir=str(tmp_path / "bank"),
                      bank_ram_bytes=4 * teacher_bank.bank_bytes(layout, 1),
                      bank_direct_io=direct_io)
    assert disk.bank.resident_rows == 4
    if direct_io is False:
        assert not disk.bank.direct_io
    for _ in range(2):
        a, b = ram.train_step(), disk.train_step()
        assert (a.teacher_loss, a.student_loss) == (b.teacher_loss, b.student_loss)
    for name in teacher_bank.TeacherBank.FILES:
        np.testing.assert_array_equal(getattr(ram.bank, name), getattr(disk.bank, name))
    phases = disk.timer.take()
    assert {"teacher_training", "image_gradients", "voting", "noise", "student_update",
            "teacher_io"} <= set(phases)


def test_fused_first_round_equals_querying_after_training():
    """Votes gathered chunk by chunk during training = a vote pass after all training."""
    lens = _tiny_lens(ensemble="reference")
    z = lens.latent(0)
    fakes = lens.teacher_fakes(z)
    images, one_hot = lens.query(z, 0)
    _, fused = lens.train_teachers(fakes, (images, one_hot))
    np.testing.assert_array_equal(fused, lens.vote(images, one_hot, 0))
