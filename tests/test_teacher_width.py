"""The teacher discriminators' width (``TrainConfig.teacher_filters`` / ``teacher_dense``,
the authors' ``df_dim`` / ``dfc_dim``; issue 39's lever 4, the teachers' architecture):

* exact: the Keras discriminator and the flat parameter layout have the widths asked for,
  and the defaults are the authors' df_dim 32 and dfc_dim 256, so a default run builds the
  teachers it always built;
* the vectorised reference ensemble equals per-teacher Keras discriminators of the same
  width (logits and image gradients), and the fused C++ op (TF op and in-place C entry
  points) equals the reference ensemble at that width (gradients via Adam's first moment,
  losses, image gradients; tolerances as tests/test_teacher_op.py's: float32 round-off);
* a run with narrow teachers trains with banks of the narrow layout, keeps its width in
  ``config.json``, refuses a resume with another width, and gives the same samples bit for
  bit with its teachers in 2 in-process shard workers;
* privacy: the width is data-independent, so one teacher's records swapped adversarially
  still change that teacher alone and the vote sum moves by at most TopAgg's 2 sqrt(k);
* bad values are refused by name; the CLIs set it (``main.py --df_dim/--dfc_dim``,
  ``reproduce.py --teacher_width`` as a named deviation with the paper's accounting).
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import synthetic_fashion_mnist
from teacher_swap import assert_a_swapped_teacher_moves_only_itself, two_teacher_config
from dclens.cli import main as main_cli
from dclens.cli import reproduce as reproduce_cli
from dclens.datalens import build, config as cfg, networks, resume, run, teacher_op, teachers
from dclens.datalens.fast_ensemble import FastTeacherEnsemble
from dclens.datalens.teachers import ADAM_BETA2, ADAM_EPSILON, ParamLayout, TeacherState
from dclens.datalens.train import DataLens
from dclens.experiments import paper_rows

SHAPE = networks.ImageShape(28, 28, 1, 10)
NARROW = networks.DiscriminatorWidth(filters=8, dense=24)
WIDE = networks.DiscriminatorWidth(filters=48, dense=320)
LR, BETA1 = 1e-3, 0.5
RTOL_GRAD = 1e-4     # relative to the largest entry (test_teacher_op.py's)
RTOL_LOSS = 1e-5

needs_op = pytest.mark.skipif(not teacher_op.available(),
                              reason="ops/_dclens_teacher_ops.so not built (make -C ops)")


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _expected_shapes(width: networks.DiscriminatorWidth) -> dict[str, tuple[int, ...]]:
    k = SHAPE.num_classes
    c0, c1 = 1 + k, width.filters + k
    return {"conv0/kernel": (5, 5, 1 + k, c0), "conv1/kernel": (5, 5, c0 + k, c1),
            "bn1/gamma": (c1,), "dense2/kernel": (7 * 7 * c1 + k, width.dense),
            "bn2/gamma": (width.dense,), "dense3/kernel": (width.dense + k, 1)}


def _case(width, num_teachers: int, batch: int, seed: int):
    rng = np.random.default_rng(seed)
    layout = ParamLayout.for_shape(SHAPE, width)
    weights = teachers.initial_teacher_weights(layout, num_teachers, rng)
    weights += rng.normal(0, 0.05, weights.shape).astype(np.float32)   # not at the init
    dims = (num_teachers, batch, 28, 28, 1)
    real = rng.uniform(size=dims).astype(np.float32)
    fake = rng.normal(0.3, 0.2, size=dims).astype(np.float32)
    labels = rng.integers(0, 10, size=(num_teachers, batch))
    return layout, weights, real, fake, labels


@pytest.mark.parametrize("width", [NARROW, WIDE], ids=["narrow", "wide"])
def test_the_layout_and_the_keras_model_have_the_widths_asked_for(width):
    layout = ParamLayout.for_shape(SHAPE, width)
    shapes = dict(zip(layout.names, layout.shapes))
    for name, shape in _expected_shapes(width).items():
        assert shapes[name] == shape, name
    assert layout.width == width
    model = networks.build_discriminator(SHAPE, seed=1, width=width)
    assert [tuple(v.shape) for v in model.trainable_weights] == list(layout.shapes)
    assert sum(int(np.prod(s)) for s in layout.shapes) == layout.size


def test_the_defaults_are_the_authors_widths():
    assert networks.DiscriminatorWidth() == networks.DiscriminatorWidth(32, 256)
    assert networks.DiscriminatorWidth().is_paper and not NARROW.is_paper
    train = cfg.TrainConfig()
    assert (train.teacher_filters, train.teacher_dense) == (32, 256)
    assert build.teacher_width(cfg.DataLensConfig()) == networks.DiscriminatorWidth()
    assert ParamLayout.for_shape(SHAPE) == ParamLayout.for_shape(
        SHAPE, networks.DiscriminatorWidth(32, 256))
    default = networks.build_discriminator(SHAPE, seed=3)
    explicit = networks.build_discriminator(SHAPE, seed=3,
                                            width=networks.DiscriminatorWidth(32, 256))
    for a, b in zip(default.get_weights(), explicit.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("width", [NARROW, WIDE], ids=["narrow", "wide"])
def test_the_reference_ensemble_equals_keras_at_the_width(width):
    layout, weights, real, _, labels = _case(width, num_teachers=2, batch=5, seed=2)
    one_hot = np.eye(10, dtype=np.float32)[labels]
    ensemble = teachers.TeacherEnsemble(SHAPE, learning_rate=LR, beta1=BETA1, width=width)
    assert ensemble.layout == layout
    logits = ensemble.logits(tf.constant(weights), tf.constant(real), tf.constant(one_hot))
    grads = ensemble.image_gradients(tf.constant(weights), tf.constant(real[0]),
                                     tf.constant(one_hot[0])).numpy()
    for t in range(2):
        model = networks.build_discriminator(SHAPE, seed=0, width=width)
        params = layout.split(tf.constant(weights[t][None]))
        for var, name in zip(model.trainable_weights, layout.names):
            var.assign(params[name][0])
        np.testing.assert_allclose(logits[t], model([real[t], one_hot[t]], training=True)[:, 0],
                                   rtol=1e-4, atol=1e-5)
        x = tf.constant(real[0])
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_mean(tf.nn.softplus(-model([x, tf.constant(one_hot[0])],
                                                           training=True)))
        want = -tape.gradient(loss, x).numpy()
        np.testing.assert_allclose(grads[t], want, rtol=1e-3, atol=1e-4 * np.abs(want).max())


@needs_op
@pytest.mark.parametrize("width", [NARROW, WIDE], ids=["narrow", "wide"])
def test_the_fused_op_equals_the_reference_at_the_width(width):
    _, weights, real, fake, labels = _case(width, num_teachers=3, batch=5, seed=4)
    reference = teachers.TeacherEnsemble(SHAPE, learning_rate=LR, beta1=BETA1, width=width)
    zeros = tf.zeros_like(weights)
    one_hot = tf.one_hot(labels, 10)
    ref_state, ref_loss = reference.train(
        TeacherState(tf.constant(weights), zeros, zeros, tf.zeros([3], tf.int64)),
        real, one_hot, fake, one_hot, num_steps=1)
    images = np.concatenate([real, fake], axis=1)
    both = np.concatenate([labels, labels], axis=1).astype(np.int32)
    op = teacher_op.train(weights, zeros, zeros, images, both, 0, shape=SHAPE, width=width,
                          num_steps=1, learning_rate=LR, beta1=BETA1, beta2=ADAM_BETA2,
                          epsilon=ADAM_EPSILON)
    np.testing.assert_allclose(op[3], ref_loss, rtol=RTOL_LOSS)
    assert _relative(op[1], ref_state.adam_m) < RTOL_GRAD     # m = (1 - beta1) g
    expected = reference.image_gradients(weights, real[0], one_hot[0])
    got = teacher_op.image_gradients(weights, real[0], labels[0].astype(np.int32),
                                     shape=SHAPE, width=width)
    assert _relative(got, expected) < RTOL_GRAD
    if teacher_op.capi_available():         # the in-place C entry points: the op's bits
        state = [weights.copy(), np.zeros_like(weights), np.zeros_like(weights)]
        losses = teacher_op.train_in_place(*state, images, both, 0, shape=SHAPE, width=width,
                                           num_steps=1, learning_rate=LR, beta1=BETA1,
                                           beta2=ADAM_BETA2, epsilon=ADAM_EPSILON)
        for a, b in zip(state + [losses], op):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(
            teacher_op.image_gradients_numpy(weights, real[0], labels[0], shape=SHAPE,
                                             width=width), got)


@needs_op
def test_a_mismatched_width_is_refused_by_the_op():
    """Rows of the narrow layout given to the op as the paper's network: refused, not read
    past (the op checks the row length against its network)."""
    _, weights, real, _, labels = _case(NARROW, num_teachers=1, batch=3, seed=5)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        teacher_op.image_gradients(weights, real[0], labels[0].astype(np.int32), shape=SHAPE)


@needs_op
def test_the_fast_ensemble_paths_agree_at_the_width():
    _, weights, real, fake, labels = _case(NARROW, num_teachers=3, batch=4, seed=7)
    one_hot = tf.one_hot(labels, 10)
    results = {}
    for path in ("fused", "per_teacher"):
        ensemble = FastTeacherEnsemble(SHAPE, learning_rate=LR, beta1=BETA1, conv_path=path,
                                       width=NARROW)
        state = TeacherState(tf.constant(weights), tf.zeros_like(weights),
                             tf.zeros_like(weights), tf.constant([4, 4, 4], tf.int64))
        new_state, loss = ensemble.train(state, real, one_hot, fake, one_hot, num_steps=1)
        results[path] = (new_state, loss, ensemble.image_gradients(weights, real[0],
                                                                   one_hot[0]))
    fused, per_teacher = results["fused"], results["per_teacher"]
    np.testing.assert_allclose(fused[1], per_teacher[1], rtol=RTOL_LOSS)
    assert _relative(fused[0].adam_m, per_teacher[0].adam_m) < RTOL_GRAD
    assert _relative(fused[2], per_teacher[2]) < RTOL_GRAD


@pytest.mark.parametrize("bad", [0, -4, 2.0, True, "32"])
def test_a_bad_width_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"teacher filters \(df_dim\) must be an integer >= 1 "
                                         rf"\(the authors': 32\), got {bad!r}"):
        networks.DiscriminatorWidth(filters=bad)
    with pytest.raises(ValueError, match=r"teacher dense units \(dfc_dim\) must be an integer "
                                         rf">= 1 \(the authors': 256\), got {bad!r}"):
        networks.DiscriminatorWidth(dense=bad)
    for field in ("teacher_filters", "teacher_dense"):
        with pytest.raises(cfg.ConfigError,
                           match=f"{field} must be an integer >= 1, got {bad!r}"):
            cfg.TrainConfig(**{field: bad})


def test_a_run_with_narrow_teachers_trains_and_keeps_its_width():
    config = two_teacher_config(teacher_filters=8, teacher_dense=24)
    lens = DataLens(config, synthetic_fashion_mnist(16), root_seed=5)
    layout = ParamLayout.for_shape(SHAPE, NARROW)
    assert lens.ensemble.layout == layout
    assert lens.bank.weights.shape == (2, layout.size)
    assert layout.size < ParamLayout.for_shape(SHAPE).size
    before = np.array(lens.bank.weights)
    generator_before = [np.array(w) for w in lens.generator.trainable_weights]
    lens.train_step()
    assert np.all(np.any(np.array(lens.bank.weights) != before, axis=1))   # both trained
    after = [np.array(w) for w in lens.generator.trainable_weights]
    assert any(np.any(a != b) for a, b in zip(generator_before, after))    # votes moved it
    loaded = cfg.DataLensConfig.from_dict(config.to_dict())
    assert (loaded.train.teacher_filters, loaded.train.teacher_dense) == (8, 24)
    old = config.to_dict()                   # a config.json from before the option
    del old["train"]["teacher_filters"], old["train"]["teacher_dense"]
    assert build.teacher_width(cfg.DataLensConfig.from_dict(old)) == \
        networks.DiscriminatorWidth()


def test_a_run_resumes_only_with_its_own_width():
    saved = two_teacher_config(teacher_filters=8).to_dict()
    assert resume.resume_differences(saved, two_teacher_config(teacher_filters=8)) == []
    assert resume.resume_differences(saved, two_teacher_config()) == [
        ("train.teacher_filters", 8, 32)]
    old = two_teacher_config().to_dict()
    del old["train"]["teacher_filters"], old["train"]["teacher_dense"]
    assert resume.resume_differences(old, two_teacher_config()) == []


def test_one_teachers_records_swapped_move_only_its_own_teacher():
    assert_a_swapped_teacher_moves_only_itself(
        two_teacher_config(teacher_filters=8, teacher_dense=24))


def test_a_whole_run_with_narrow_teachers_equals_its_sharded_run(tiny_fmnist_dir, tmp_path):
    """Through the run directory: the in-process run and the same run with its teachers in
    2 in-process shard workers (each worker builds its own bank from the config's width)
    give the same samples bit for bit."""
    config = cfg.DataLensConfig(
        train=cfg.TrainConfig(dataset="fashion_mnist", data_dir=str(tiny_fmnist_dir),
                              num_teachers=4, batch_size=6, d_step=1, pretrain_teacher=1,
                              z_dim=8, teacher_chunk=2, epochs=2, num_samples=12, seed=3,
                              teacher_filters=8, teacher_dense=24),
        topagg=cfg.TopAggConfig(topk=40, sigma=5.0, thresh=0.2, max_grad=10.0),
        budget=cfg.BudgetConfig(max_eps=1e6))
    samples = []
    for name, kwargs in (("alone", {}), ("sharded", dict(shards=2,
                                                         shard_backend="inprocess"))):
        out = tmp_path / name
        run.train_run(config, str(out), progress=False, log=lambda line: None, **kwargs)
        samples.append(np.load(os.path.join(out, "samples.npz"))["x"])
        saved = cfg.DataLensConfig.from_dict(run_config(out)["config"])
        assert (saved.train.teacher_filters, saved.train.teacher_dense) == (8, 24)
    np.testing.assert_array_equal(samples[0], samples[1])
    assert samples[0].shape[0] == 12


def run_config(out) -> dict:
    with open(os.path.join(out, "config.json")) as stream:
        return json.load(stream)


def test_reproduce_names_the_lever_and_keeps_the_accounting():
    paper = cfg.paper_preset("fashion_mnist", 1)
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, teacher_width=0.5)
    assert options.default_name() == "fashion_mnist-eps1-tw0.5"
    config, deviations = paper_rows.build_config(options)
    assert (config.train.teacher_filters, config.train.teacher_dense) == (16, 128)
    assert dataclasses.replace(config.train, teacher_filters=32,
                               teacher_dense=256) == paper.train
    assert (config.topagg, config.budget) == (paper.topagg, paper.budget)
    assert deviations == ["beyond the paper: teachers 0.5 x as wide (16 filters and 128 "
                          "dense units instead of 32 and 256; data-independent, the same "
                          "sensitivity)"]
    wide, _ = paper_rows.build_config(paper_rows.ReproduceOptions(teacher_width=2))
    assert (wide.train.teacher_filters, wide.train.teacher_dense) == (64, 512)
    same = paper_rows.ReproduceOptions("fashion_mnist", 1, teacher_width=1)
    assert same.default_name() == "fashion_mnist-eps1"
    assert paper_rows.build_config(same) == (paper, [])
    for bad in (0, -1, 0.3, float("nan"), True, "2"):
        with pytest.raises(paper_rows.ReproduceError,
                           match=f"teacher_width must be a number > 0 .*got {bad!r}"):
            paper_rows.ReproduceOptions(teacher_width=bad)


def test_the_clis_set_it():
    args = main_cli.build_parser().parse_args(["--dataset", "fashion_mnist", "--df_dim", "16",
                                               "--dfc_dim", "128"])
    train = main_cli.resolve(args)[1].train
    assert (train.teacher_filters, train.teacher_dense) == (16, 128)
    default = main_cli.resolve(main_cli.build_parser().parse_args(
        ["--dataset", "fashion_mnist"]))[1].train
    assert (default.teacher_filters, default.teacher_dense) == (32, 256)
    parsed = reproduce_cli.build_parser().parse_args(["fashion_mnist", "--eps", "1",
                                                      "--teacher_width", "2"])
    assert parsed.teacher_width == 2.0
