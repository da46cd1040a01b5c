"""Class guidance (``TrainConfig.class_guidance``, issue 39's lever 5): each teacher's
submitted image gradient also descends lambda times its own label cross-entropy; and the
diagnostic that led to it (:mod:`dclens.datalens.class_signal`, the teachers read as
classifiers).

* exactly (no noise): the ensemble's gradient equals a slow per-teacher, per-label loop;
  the fast ensemble equals the reference; lambda = 0 is the paper's gradient bit for bit;
* the sign is right: a small step along a teacher's class term lowers that teacher's
  label cross-entropy;
* privacy: one teacher's records swapped adversarially (other images, other labels) after
  a training step change that teacher's weights and guided gradient and nothing else, and
  the vote sum moves by at most TopAgg's charged sensitivity 2 sqrt(k).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tensorflow as tf

from conftest import load_script, write_idx
from teacher_swap import assert_a_swapped_teacher_moves_only_itself
from dclens.data import splits
from dclens.datalens import class_signal, networks, teacher_conv, teachers
from dclens.datalens.config import (BudgetConfig, DataLensConfig, GuidanceForm, TopAggConfig,
                                    TrainConfig, TrainingRecords)
from dclens.datalens.fast_ensemble import FastTeacherEnsemble
from dclens.runs.checkpoint import CheckpointStore

SHAPE = networks.ImageShape(28, 28, 1, 10)
T, B = 2, 4


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    layout = teachers.ParamLayout.for_shape(SHAPE)
    weights = teachers.initial_teacher_weights(layout, T, rng)
    # trained teachers are not at their initialisation: spread the weights a little
    weights = np.asarray(weights) * (1 + 0.5 * rng.standard_normal(np.shape(weights)))
    images = rng.uniform(size=(B, 28, 28, 1)).astype(np.float32)
    labels = rng.integers(0, 10, B)
    return (tf.constant(weights, tf.float32), tf.constant(images),
            tf.one_hot(labels, 10), labels)


def _slow_gradients(ensemble: teachers.TeacherEnsemble, weights, images, labels: np.ndarray,
                    lam: float, form: str = "cross_entropy") -> np.ndarray:
    """Teacher by teacher, label by label: -d/dx [mean_b softplus(-D(x_b, y_b))
    + lam * mean_b (log sum_c exp D(x_b, y_b + c) - D(x_b, y_b))], the shifted labels
    built from the integers (not by the implementation's roll)."""
    out = []
    for t in range(T):
        x = tf.Variable(images[None])
        with tf.GradientTape() as tape:
            per_shift = []
            for c in range(10):
                one_hot = tf.one_hot((labels + c) % 10, 10)[None]
                per_shift.append(ensemble.logits(weights[t:t + 1], x, one_hot)[0])
            logits = tf.stack(per_shift, axis=-1)                       # [B, K]
            realism = tf.reduce_mean(tf.nn.softplus(-logits[:, 0]))
            pooled = (tf.reduce_sum(logits, axis=-1) / 10.0 if form == "margin"
                      else tf.math.log(tf.reduce_sum(tf.exp(logits), axis=-1)))
            ce = tf.reduce_mean(pooled - logits[:, 0])
            loss = realism + lam * ce
        out.append(-tape.gradient(loss, x)[0].numpy())
    return np.stack(out)


LAMBDA = 0.7


@pytest.fixture(scope="module")
def guided():
    """Inputs, the reference's guided and unguided gradients (each traced once here)."""
    weights, images, one_hot, labels = _inputs()
    ensemble = teachers.TeacherEnsemble(SHAPE, learning_rate=1e-3, beta1=0.5,
                                        class_guidance=LAMBDA)
    plain = teachers.TeacherEnsemble(SHAPE, learning_rate=1e-3, beta1=0.5)
    return {"inputs": (weights, images, one_hot, labels), "ensemble": ensemble,
            "guided": ensemble.image_gradients(weights, images, one_hot).numpy(),
            "plain": plain.image_gradients(weights, images, one_hot).numpy()}


def test_the_guided_gradient_equals_a_per_teacher_per_label_loop(guided):
    weights, images, _, labels = guided["inputs"]
    got = guided["guided"]
    want = _slow_gradients(guided["ensemble"], weights, images, labels, LAMBDA)
    scale = np.abs(want).max()
    assert scale > 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)
    # and the class term is not negligible here (else the check above is empty)
    assert np.abs(got - guided["plain"]).max() > 0.05 * scale


@pytest.mark.parametrize("conv_path", ["per_teacher", "grouped"])
def test_the_fast_ensemble_equals_the_reference_with_guidance(guided, conv_path):
    weights, images, one_hot, _ = guided["inputs"]
    try:
        teacher_conv.resolve_conv_path(conv_path)
    except ValueError as error:           # grouped gradients need oneDNN
        pytest.skip(str(error))
    fast = FastTeacherEnsemble(SHAPE, learning_rate=1e-3, beta1=0.5, conv_path=conv_path,
                               class_guidance=LAMBDA)
    want = guided["guided"]
    got = fast.image_gradients(weights, images, one_hot).numpy()
    # float32 in another summation order; K = 10 passes give a leaky ReLU ten chances to
    # fall on the other side of its kink, which moves a patch of pixels by ~1e-3 of the
    # scale. So the measure is each teacher's relative L2 error (a wrong shift, sign or
    # batch statistic would make it O(1)): at most 1e-3.
    for t in range(T):
        error = np.linalg.norm(got[t] - want[t]) / np.linalg.norm(want[t])
        assert error < 1e-3, (t, error)


def test_the_margin_form_equals_its_loop_on_both_ensembles():
    """The margin form (mean over the labels instead of logsumexp): the reference equals a
    per-teacher, per-label loop, and the fast ensemble equals the reference; it differs
    from the cross-entropy form (else the form would be ignored)."""
    weights, images, one_hot, labels = _inputs(1)
    make = dict(learning_rate=1e-3, beta1=0.5, class_guidance=LAMBDA,
                class_guidance_form="margin")
    reference = teachers.TeacherEnsemble(SHAPE, **make)
    got = reference.image_gradients(weights, images, one_hot).numpy()
    want = _slow_gradients(reference, weights, images, labels, LAMBDA, form="margin")
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)
    cross = _slow_gradients(reference, weights, images, labels, LAMBDA)
    assert np.abs(got - cross).max() > 0.05 * scale
    fast = FastTeacherEnsemble(SHAPE, conv_path="per_teacher", **make)
    fast_got = fast.image_gradients(weights, images, one_hot).numpy()
    for t in range(T):
        error = np.linalg.norm(fast_got[t] - got[t]) / np.linalg.norm(got[t])
        assert error < 1e-3, (t, error)


def test_zero_guidance_is_the_papers_gradient_bit_for_bit():
    weights, images, one_hot, _ = _inputs(2)
    for make in (lambda **kw: teachers.TeacherEnsemble(SHAPE, learning_rate=1e-3, beta1=0.5,
                                                       **kw),
                 lambda **kw: FastTeacherEnsemble(SHAPE, learning_rate=1e-3, beta1=0.5,
                                                  **kw)):
        paper = make().image_gradients(weights, images, one_hot).numpy()
        zero = make(class_guidance=0.0).image_gradients(weights, images, one_hot).numpy()
        np.testing.assert_array_equal(paper, zero)


def test_a_step_along_the_class_term_lowers_each_teachers_label_cross_entropy(guided):
    weights, images, one_hot, _ = guided["inputs"]
    ensemble = guided["ensemble"]

    def cross_entropy(x):                                              # [T]
        tiled = tf.tile(x[None], [T, 1, 1, 1, 1])
        labels = tf.tile(one_hot[None], [T, 1, 1])
        shifted = [ensemble.logits(weights, tiled, teachers.shifted_labels(labels, c))
                   for c in range(10)]
        return teachers.class_guidance_loss(tf.stack(shifted, axis=-1)).numpy()

    # the class term alone: the guided gradient minus the unguided one (lambda > 0)
    direction = guided["guided"] - guided["plain"]
    before = cross_entropy(images)
    for t in range(T):
        step = 1e-2 / max(np.abs(direction[t]).max(), 1e-12)
        after = cross_entropy(images + step * direction[t])
        assert after[t] < before[t], (t, before[t], after[t])


def test_bad_guidance_is_refused_by_name():
    for bad in (-1.0, math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError, match="class_guidance must be a finite number >= 0"):
            TrainConfig(class_guidance=bad)
        with pytest.raises(ValueError, match="class_guidance must be a finite number >= 0"):
            teachers.TeacherEnsemble(SHAPE, learning_rate=1e-3, beta1=0.5,
                                     class_guidance=bad)
    config = DataLensConfig(train=TrainConfig(class_guidance=0.5))
    assert DataLensConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="class_guidance_form must be one of"):
        TrainConfig(class_guidance_form="hinge")
    with pytest.raises(ValueError, match="'hinge' is not a valid GuidanceForm"):
        teachers.TeacherEnsemble(SHAPE, learning_rate=1e-3, beta1=0.5,
                                 class_guidance_form="hinge")
    with pytest.raises(ValueError, match="chooses the class term of class_guidance, "
                                         "which is 0"):
        TrainConfig(class_guidance_form=GuidanceForm.MARGIN)
    margin = DataLensConfig(train=TrainConfig(class_guidance=0.5,
                                              class_guidance_form=GuidanceForm.MARGIN))
    assert DataLensConfig.from_dict(margin.to_dict()) == margin


@pytest.mark.parametrize("form", ["cross_entropy", "margin"])
def test_one_teachers_records_swapped_move_only_its_own_guided_vote(form):
    """Neighbouring data sets: every record of teacher 0 replaced (noise images, other
    labels). After one step of training, teacher 1 (in the same chunk) has bit-equal
    weights and guided gradients; the vote sum moves by at most 2 sqrt(k) per image."""
    config = DataLensConfig(
        train=TrainConfig(num_teachers=2, batch_size=4, d_step=1, pretrain_teacher=1,
                          z_dim=8, teacher_chunk=2, num_samples=10, class_guidance=1.0,
                          class_guidance_form=GuidanceForm(form)),
        topagg=TopAggConfig(topk=30, sigma=5.0, thresh=0.2, max_grad=1e-5),
        budget=BudgetConfig(max_eps=1e6))
    assert_a_swapped_teacher_moves_only_itself(config)


# ---------------------------------------------------------------- the diagnostic
def test_class_signal_counts_arg_max_shifts_exactly():
    # 2 teachers, 4 records, 3 labels; shift 0 is the record's own label
    logits = np.array([[[3, 1, 0], [0, 2, 1], [5, 4, 4], [1, 1, 2]],
                       [[0, 1, 0], [0, 1, 2], [1, 0, 0], [9, 0, 0]]], np.float32)
    signal = class_signal.class_signal(logits)
    np.testing.assert_array_equal(signal.teacher_accuracy, [0.5, 0.5])
    # summed: [3,2,0] [0,3,3] [6,4,4] [10,1,2] -> right on records 0, 2, 3
    assert signal.ensemble_accuracy == 0.75
    # D(x, y) > D(x, y + c), c = 1, 2: teacher 0: 2+0+2+0, teacher 1: 0+0+2+2 of 16
    assert signal.pairwise == 8 / 16
    assert signal.to_dict()["chance"] == pytest.approx(1 / 3)


def test_shifted_logits_score_each_batch_under_every_label():
    weights, images, _, labels = _inputs(4)
    ensemble = teachers.TeacherEnsemble(SHAPE, learning_rate=1e-3, beta1=0.5)
    got = class_signal.shifted_logits(ensemble, weights.numpy(), images.numpy(), labels,
                                      batch_size=B, teacher_chunk=2)
    for t in range(T):
        for c in range(10):
            one_hot = np.eye(10, dtype=np.float32)[(labels + c) % 10][None]
            want = ensemble.logits(weights[t:t + 1], images[None], one_hot)[0].numpy()
            np.testing.assert_allclose(got[t, :, c], want, rtol=1e-5, atol=1e-6)


def _class_signal_run(tmp_path, records: str, *, checkpoint: bool):
    run = tmp_path / f"run-{records}-{checkpoint}"
    run.mkdir()
    config = DataLensConfig(train=TrainConfig(num_teachers=T, batch_size=4,
                                              training_records=TrainingRecords(records),
                                              data_dir=str(tmp_path / "data")))
    (run / "config.json").write_text(json.dumps({"config": config.to_dict(),
                                                 "partition_size": 4}))
    if checkpoint:
        weights, *_ = _inputs(5)
        CheckpointStore(run / "checkpoints").save(
            7, {"teachers_weights": weights.numpy()}, {})
    return run


def test_the_cli_reads_screening_runs_only_and_writes_its_record(tmp_path, capsys):
    total = splits.TUNING_RECORDS + 20
    rng = np.random.default_rng(0)
    folder = tmp_path / "data" / "fashion_mnist"
    folder.mkdir(parents=True)
    write_idx(folder / "train-images-idx3-ubyte.gz",
              rng.integers(0, 256, size=(total, 28, 28)).astype(np.uint8))
    write_idx(folder / "train-labels-idx1-ubyte.gz", (np.arange(total) % 10).astype(np.uint8))
    evaluate = load_script("evaluate")
    private = _class_signal_run(tmp_path, "all", checkpoint=True)
    assert evaluate.main([str(private), "--teacher_classes", "20"]) == 2
    assert "training_records='all'" in capsys.readouterr().err
    bare = _class_signal_run(tmp_path, "tuning", checkpoint=False)
    assert evaluate.main([str(bare), "--teacher_classes", "20"]) == 2
    assert "has no checkpoint" in capsys.readouterr().err
    run = _class_signal_run(tmp_path, "tuning", checkpoint=True)
    assert evaluate.main([str(run), "--teacher_classes", "20"]) == 0
    record = json.loads((run / "teacher_classes.json").read_text())
    assert record["teachers"] == T and record["records"] == 20 and record["step"] == 7
    assert 0 <= record["teacher_accuracy_mean"] <= 1
    assert "teachers as classifiers (20 records" in capsys.readouterr().out
