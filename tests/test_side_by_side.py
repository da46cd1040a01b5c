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
from dclens.cli import side_by_side as side_by_side_cli
from dclens.datalens.config import Aggregation
from dclens.parity import authors_side, compare, seed_sweep, side_by_side, tf1_compat
from dclens.parity.our_side import OurStep

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


def test_the_authors_numpy_draws_are_seeded_and_the_global_state_restored():
    """Their loop draws from numpy's global RNG: seeded inside the block (so a report is a
    function of its configuration; unseeded, each run compared different draws and a rare
    one crossed a tolerance by chance), and the caller's stream continues afterwards as
    if the block had never run."""
    np.random.seed(123)
    expected_after = np.random.uniform(size=4)
    np.random.seed(123)
    with authors_side.seeded_global_numpy(7):
        first = np.random.uniform(-1, 1, size=(3, 2))
    with authors_side.seeded_global_numpy(7):
        again = np.random.uniform(-1, 1, size=(3, 2))
        np.random.rand(5)
    np.testing.assert_array_equal(np.random.uniform(size=4), expected_after)
    np.testing.assert_array_equal(first, again)
    with authors_side.seeded_global_numpy(8):
        other = np.random.uniform(-1, 1, size=(3, 2))
    assert not np.array_equal(first, other)
    with pytest.raises(RuntimeError), authors_side.seeded_global_numpy(7):
        np.random.seed(99)
        raise RuntimeError("their loop failed")
    np.random.seed(123)
    np.random.uniform(size=4)
    state = np.random.get_state()[1].copy()
    with pytest.raises(RuntimeError), authors_side.seeded_global_numpy(7):
        raise RuntimeError("their loop failed")
    np.testing.assert_array_equal(np.random.get_state()[1], state)   # restored on error


def _agreeing_steps(config, loss=(1.40, 1.39)):
    """A hand-made step on which both sides agree exactly: 2 teachers, 1 image of 4
    coordinates (enough for :func:`compare.compare_step`)."""
    teachers = config.teachers
    weights = {name: np.full((teachers, 3), 0.1, np.float32)
               for name in authors_side.TEACHER_NAMES}
    grads = np.arange(teachers * 4, dtype=np.float32).reshape(teachers, 1, 4) - 3.0
    votes = np.array([[1, 0, -1, 2]])
    update = np.array([[1.0, 0.0, -1.0, 1.0]], np.float32)
    generator = {"g_h0_lin/kernel": np.ones((2, 2), np.float32)}
    theirs = authors_side.TheirStep(
        image_gradients=[grads[:, 0]], vote_sums=[votes[0].astype(np.float64)],
        updates=[update[0] * config.learning_rate], teacher_weights=weights,
        teacher_loss=np.array(loss, np.float32), generator_weights=generator, epsilon=2.0)
    ours = OurStep(
        teacher_weights=weights, teacher_loss=np.array(loss, np.float32),
        image_gradients=grads, vote_sum=votes, noisy_update=update,
        generator_weights=generator, epsilon=2.0,
        teacher_loss_their_weights=np.array(loss, np.float32),
        image_gradients_their_weights=grads, vote_sum_their_gradients=votes,
        noisy_update_their_votes=update)
    return ours, theirs


def test_the_teacher_loss_is_held_on_the_same_weights_and_the_runs_loss_reported():
    """The loss check compares dclens' loss on the authors' trained weights with theirs
    (round-off only); the run's own loss, after training that Adam's zero-state first
    steps make chaotic in round-off-level coordinates, is reported beside it."""
    config = side_by_side.SideBySideConfig(**{**TINY, "topk": 2})
    ours, theirs = _agreeing_steps(config)
    row = compare.compare_step(1, ours, theirs, config)
    assert row["agree"], row["checks"]
    assert row["same_inputs"]["teacher_loss"]["max_rel"] == 0.0
    # The run's loss 2e-4 apart (as the pretrain step can be): reported, not a failure.
    ours.teacher_loss = ours.teacher_loss * np.float32(1 + 2e-4)
    row = compare.compare_step(1, ours, theirs, config)
    assert row["agree"], row["checks"]
    assert row["teacher_loss"]["max_rel"] == pytest.approx(2e-4, rel=0.01)
    assert "(run: 2.0e-04)" in compare.format_row(row)
    # dclens' loss on the same weights 2e-4 apart: a wrong loss, flagged.
    ours.teacher_loss_their_weights = ours.teacher_loss_their_weights * np.float32(1 + 2e-4)
    row = compare.compare_step(1, ours, theirs, config)
    assert not row["checks"]["teacher_loss"] and not row["agree"]
    assert "DISAGREE (teacher_loss)" in compare.format_row(row)


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


# ------------------------------------------------------------------ over many seeds
def _fake_report(seed: int, loss: float, agree: bool = True) -> dict:
    row = {"step": 0, "agree": agree, "checks": {"teacher_loss": agree, "votes": True},
           "same_inputs": {"teacher_loss": {"max_rel": loss / 100},
                           "image_gradients": {"max_rel": 1e-6}},
           "teacher_loss": {"max_rel": loss}, "image_gradients": {"max_rel": 0.1},
           "teacher_movement": {"max": 0.01 * seed, "outlier_fraction": 0.0},
           "votes": {"vote_sum_mismatches_unexplained": 0}, "epsilon": {"rel": 0.0}}
    return {"agree": agree, "steps": [row]}


def test_the_seed_sweep_runs_each_seed_and_summarises_every_check(monkeypatch):
    """Seeds seed ... seed + N - 1, each its own configuration; per quantity the median,
    the maximum and its seed, beside the tolerance (None: reported only)."""
    losses = {5: 1e-7, 6: 2e-4, 7: 3e-7}
    seen = []

    def fake(config, repo, log):
        seen.append(config.seed)
        return _fake_report(config.seed, losses[config.seed], agree=config.seed != 7)

    monkeypatch.setattr(seed_sweep, "run_side_by_side", fake)
    config = side_by_side.SideBySideConfig(**{**TINY, "seed": 5})
    lines = []
    sweep = seed_sweep.run_seeds(config, AUTHORS, 3, log=lines.append)
    assert seen == [5, 6, 7]
    assert sweep["disagreeing_seeds"] == [7]
    assert sweep["per_seed"][2]["failed"] == {0: ["teacher_loss"]}
    run_loss = sweep["summary"]["step 0"]["teacher_loss_run"]
    assert run_loss == {"median": 3e-7, "max": 2e-4, "seed_of_max": 6, "tolerance": None}
    held = sweep["summary"]["step 0"]["teacher_loss_same_weights"]
    assert held["max"] == pytest.approx(2e-6) and held["seed_of_max"] == 6
    assert held["tolerance"] == compare.TOLERANCES["teacher_loss"]
    movement = sweep["summary"]["step 0"]["teacher_movement_max_reach"]
    assert movement["seed_of_max"] == 7 and movement["median"] == pytest.approx(0.06)
    assert len(lines) == 3 and "DISAGREE" in lines[2]
    with pytest.raises(side_by_side.SideBySideError, match="--seeds must be an integer >= 1"):
        seed_sweep.run_seeds(config, AUTHORS, 0)


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0"], "--seeds must be an integer >= 1, got 0"),
    (["--seeds", "3", "--free_running"], "--seeds repeats the judged lockstep comparison"),
    (["--seeds", "3", "--whole_runs", "2"], "--seeds repeats the judged lockstep comparison"),
])
def test_the_seed_sweep_refuses_what_it_cannot_judge(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        side_by_side_cli.main(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
