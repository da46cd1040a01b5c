"""The side-by-side harness against the authors' TF1 code (dclens/parity/).

The harness needs the authors' repository (``../shared/authors-datalens`` beside the
checkout, as in CI) and the real Fashion-MNIST (scripts/setup.sh installs it); without
either, the tests that run it are skipped with the reason.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from dclens import data
from dclens.datalens.config import Aggregation
from dclens.parity import compare, side_by_side, tf1_compat

AUTHORS = Path(__file__).resolve().parents[2] / "shared" / "authors-datalens"


def _fashion_mnist_available() -> bool:
    try:
        data.load_dataset("fashion_mnist", None)
    except data.DataError:
        return False
    return True


needs_authors = pytest.mark.skipif(
    not AUTHORS.is_dir() or not _fashion_mnist_available(),
    reason=f"needs the authors' repository at {AUTHORS} and the real Fashion-MNIST")

TINY = dict(teachers=2, records=10, steps=3, topk=20, sigma=10.0, thresh=0.3, d_step=2,
            pretrain_teacher=2, z_dim=6)


@needs_authors
@pytest.mark.parametrize("stochastic, threshold", [
    (True, True), (False, True),      # their --signsgd (--stochastic)
    (True, False), (False, False),    # their --signsgd_nothresh (--stochastic)
], ids=["stochastic", "deterministic", "stochastic-nothreshold", "deterministic-nothreshold"])
def test_dclens_agrees_with_the_authors_code_step_by_step(stochastic, threshold):
    config = side_by_side.SideBySideConfig(stochastic=stochastic, threshold=threshold, **TINY)
    report = side_by_side.run_side_by_side(config, AUTHORS, log=lambda line: None)
    failed = {row["step"]: [c for c, ok in row["checks"].items() if not ok]
              for row in report["steps"] if not row["agree"]}
    assert report["agree"], failed
    assert [row["epoch"] for row in report["steps"]] == [0, 1, 2]   # pretrain epoch first
    for row in report["steps"]:
        # The votes are not trivially equal: every teacher voted k coordinates per image.
        assert row["vote_sum_abs_total"] > 0
        assert row["same_inputs"]["vote_sum_mismatches"] == 0
        assert row["epsilon"]["rel"] < 1e-9
        update = row["same_inputs"]["noisy_update"]
        if threshold:
            assert update["max_abs"] == 0
        else:
            # The noisy vote sum / k: real-valued (not the thresholded {-1, 0, 1}), equal
            # up to float32 round-off.
            assert row["noisy_update_passed"] == 1.0
            assert update["max_rel"] <= compare.TOLERANCES["noisy_update_unthresholded"]


@needs_authors
@pytest.mark.parametrize("perturb, failing", [
    ("noise", "noisy_update_same_votes"),
    ("weights", "teacher_weights"),
])
def test_the_harness_flags_a_perturbed_input(perturb, failing):
    config = side_by_side.SideBySideConfig(**TINY)
    report = side_by_side.run_side_by_side(config, AUTHORS, perturb=perturb,
                                           log=lambda line: None)
    assert report["agree"] is False
    assert not report["steps"][0]["checks"][failing]


def test_config_refuses_partitions_the_authors_would_wrap():
    with pytest.raises(side_by_side.SideBySideError, match="multiple of the 10 classes"):
        side_by_side.SideBySideConfig(teachers=3, records=7)
    with pytest.raises(side_by_side.SideBySideError, match="--steps must be"):
        side_by_side.SideBySideConfig(steps=0)


def test_missing_repository_is_a_clear_error(tmp_path):
    with pytest.raises(tf1_compat.AuthorsCodeError, match="--authors_repo"):
        tf1_compat.check_repo(tmp_path / "nowhere")
    with pytest.raises(tf1_compat.AuthorsCodeError, match="model.py"):
        tf1_compat.check_repo(tmp_path)


def test_balanced_subset_takes_the_first_records_of_each_class():
    labels = np.array([3, 1, 0, 1, 3, 0, 2, 2, 1, 0])
    np.testing.assert_array_equal(side_by_side.balanced_subset(labels, 8, num_classes=4),
                                  [0, 1, 2, 3, 4, 5, 6, 7])
    with pytest.raises(side_by_side.SideBySideError, match="class 2 has only 2"):
        side_by_side.balanced_subset(labels, 12, num_classes=4)


# ------------------------------------------------------------------ the compat layer
def _literal_batch_norm(x, gamma, beta, epsilon):
    axes = tuple(range(x.ndim - 1))
    mean = x.mean(axis=axes)
    variance = ((x - mean) ** 2).mean(axis=axes)
    return gamma * (x - mean) / np.sqrt(variance + epsilon) + beta


def test_contrib_batch_norm_stand_in_matches_the_formula_and_updates_statistics():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3, 3, 4)).astype(np.float32) * 3 + 1
    graph = tf.Graph()
    with graph.as_default():
        inputs = tf.compat.v1.placeholder(tf.float32, x.shape)
        out = tf1_compat.contrib_batch_norm(inputs, decay=0.9, updates_collections=None,
                                            epsilon=1e-5, scale=True, is_training=True,
                                            scope="bn")
        variables = {v.name: v for v in tf.compat.v1.global_variables()}
        trainable = sorted(v.name for v in tf.compat.v1.trainable_variables())
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            got = session.run(out, {inputs: x})
            moving = session.run(variables["bn/moving_mean:0"])
    names = sorted(variables)
    assert names == ["bn/beta:0", "bn/gamma:0", "bn/moving_mean:0", "bn/moving_variance:0"]
    assert trainable == ["bn/beta:0", "bn/gamma:0"]
    np.testing.assert_allclose(got, _literal_batch_norm(x, 1.0, 0.0, 1e-5), atol=1e-5)
    np.testing.assert_allclose(moving, 0.1 * x.mean(axis=(0, 1, 2)), rtol=1e-5)
    with pytest.raises(tf1_compat.AuthorsCodeError, match="is_training=True"):
        with tf.Graph().as_default():
            tf1_compat.contrib_batch_norm(tf.zeros((2, 3)), is_training=False)


def test_flag_recorder_keeps_definitions_and_defaults():
    flags = tf1_compat.FlagRecorder()
    flags.DEFINE_integer("topk", 50, "Number of top k gradients")
    flags.DEFINE_boolean("stochastic", False, "stochastic sign")
    flags.DEFINE_float("sigma", 2000, "noise")
    assert (flags.FLAGS.topk, flags.FLAGS.stochastic, flags.FLAGS.sigma) == (50, False, 2000.0)
    assert isinstance(flags.FLAGS.sigma, float)
    assert flags.help["topk"] == "Number of top k gradients"
    with pytest.raises(AttributeError):
        flags.DEFINE_enum


@needs_authors
def test_loading_their_code_leaves_no_trace():
    before = set(sys.modules)
    with tf1_compat.load_authors_code(AUTHORS) as code:
        assert code.flags.topk == 50 and code.flags.batch_size == 30   # their defaults
        assert np.float is float                                       # their np.float
        assert "model" in sys.modules or code.model.__name__ == "model"
    assert not hasattr(np, "float") or np.float is not float
    added = set(sys.modules) - before
    assert not added & {"model", "ops", "utils", "rdp_utils", "pate_core", "torch",
                        "authors_main"}, added
    assert sys.modules["tensorflow"] is tf


# ------------------------------------------------------------------ vote attribution
def test_vote_differences_are_explained_only_by_near_ties():
    their = np.zeros((1, 1, 6), np.float32)
    their[0, 0] = [5.0, 4.0, 3.0, 2.0000, 1.9999, 1.0]
    ours = their.copy()
    ours[0, 0, 4] = 2.0001                                  # swaps ranks 4 and 5
    our_votes = np.array([[1, 1, 1, 0, 1, 0]])
    their_votes = np.array([[1, 1, 1, 1, 0, 0]])
    result = compare.explain_vote_differences(ours, their, our_votes, their_votes, 4)
    assert result == {"pairs_with_different_topk": 1, "vote_sum_mismatches": 2,
                      "vote_sum_mismatches_unexplained": 0}
    # The same top-k sets but a different vote: nothing explains it.
    result = compare.explain_vote_differences(their, their, np.array([[-1, 1, 1, 1, 0, 0]]),
                                                   their_votes, 4)
    assert result == {"pairs_with_different_topk": 0, "vote_sum_mismatches": 1,
                      "vote_sum_mismatches_unexplained": 1}


def test_unthresholded_updates_are_held_to_float32_round_off_only():
    """The update without threshold (noisy vote sum / k) is compared with a tolerance
    relative to the step's largest |update|: float32 round-off of the float64 values
    passes, a change of 1e-4 of the largest value does not; the thresholded update must be
    equal."""
    rng = np.random.default_rng(0)
    theirs = rng.standard_normal((3, 50)) * 2.0          # float64, like their update
    ours = theirs.astype(np.float32)                     # dclens' float32
    assert not compare.update_mismatch(ours, theirs, threshold=False).any()
    changed = ours.astype(np.float64)
    changed[1, 7] += 1e-4 * np.max(np.abs(theirs))
    assert compare.update_mismatch(changed, theirs, threshold=False).sum() == 1
    signs = np.sign(theirs)
    assert not compare.update_mismatch(signs.astype(np.float32), signs, threshold=True).any()
    flipped = signs.copy()
    flipped[0, 0] = -flipped[0, 0]
    assert compare.update_mismatch(flipped, signs, threshold=True).sum() == 1


def test_the_configuration_maps_threshold_and_sign_to_the_aggregation():
    want = {(True, True): Aggregation.TOPK_STOCHASTIC_SIGN,
            (False, True): Aggregation.TOPK_SIGN,
            (True, False): Aggregation.NO_THRESHOLD,
            (False, False): Aggregation.NO_THRESHOLD_SIGN}
    for (stochastic, threshold), method in want.items():
        config = side_by_side.SideBySideConfig(stochastic=stochastic, threshold=threshold)
        assert config.method is method
        assert config.dclens_config().topagg.method is method
    with pytest.raises(side_by_side.SideBySideError, match="threshold must be True or False"):
        side_by_side.SideBySideConfig(threshold="no")
