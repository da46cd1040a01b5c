"""Fewer fake images voted on per round than the teachers' batch (``TrainConfig.query_batch``;
issue 39's lever 3, the queries per step at equal epsilon):

* exact: a round queries G(z_j, y_j) for the first Q of the step's B latents with Q fresh
  labels; the vote sum, the noise and the released update are [Q, D]; the student's
  update reads those Q images only; the teachers still train on batches of B;
* the ledger: each round spends Q queries (journal and step record say so), and a run's
  epsilon is the accountant's for Q queries per step, so the same budget allows about
  B / Q times the steps;
* privacy: the teachers are the paper's, so one teacher's records swapped adversarially
  still change that teacher alone and the vote sum moves by at most 2 sqrt(k);
* the default (None) is the whole batch, and a config written before the option loads
  with it; bad values are refused by name, before anything is written; the CLIs set it
  (``reproduce.py --query_batch`` as a named deviation).
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
from dclens.datalens import budget, config as cfg, resume, run
from dclens.datalens.train import DataLens, check_query_batch
from dclens.experiments import paper_rows
from dclens.privacy import accounting


class _Rounds:
    """Records what every round queried and released (the observer hook)."""

    def __init__(self):
        self.rounds = []

    def round_released(self, step, round_index, images, one_hot, vote_sum, result):
        self.rounds.append(dict(step=step, images=np.array(images), one_hot=np.array(one_hot),
                                vote_sum=np.array(vote_sum), update=np.array(result.update)))


def _lens(query_batch, **train):
    config = two_teacher_config(query_batch=query_batch, **train)
    return DataLens(config, synthetic_fashion_mnist(16), root_seed=5)


def test_a_round_renders_the_batch_and_votes_on_its_first_q():
    lens = _lens(3)
    assert (lens.batch, lens.query_batch) == (4, 3)
    seen = _Rounds()
    lens.observer = seen
    z = lens.latent(0)
    twin = _lens(3)                  # the generator before the step's update
    record = lens.train_step()
    (round0,) = seen.rounds
    assert round0["images"].shape == (3, 28, 28, 1)
    assert round0["vote_sum"].shape == (3, 784)
    assert round0["update"].shape == (3, 784)
    labels = tf.one_hot(lens.draws.query_labels(0, 0, 4, 10), 10)   # B labels drawn
    np.testing.assert_array_equal(round0["one_hot"], labels[:3].numpy())
    # all B rendered together (batch statistics over B), the first Q voted on
    rendered = twin.generate(z, labels).numpy()
    np.testing.assert_array_equal(round0["images"], rendered[:3])
    assert np.any(round0["images"] != twin.generate(z[:3], labels[:3]).numpy())
    assert record.queries == 3
    assert np.abs(round0["vote_sum"]).sum() > 0


def test_the_students_update_is_over_the_voted_images_only():
    """Against a reference written out here: one Adam step on
    sum((G(z, y)[:Q] - stop_gradient(x[:Q] + lr * update))^2), G over all B (z, y)."""
    lens, twin = _lens(2), _lens(2)
    seen = _Rounds()
    lens.observer = seen
    z = lens.latent(0)
    rendered, one_hot = lens.query(z, 0)
    votes = lens.vote(lens.voted(rendered), lens.voted(one_hot), 0)
    lens.student_round(z, 0, voted=(rendered, one_hot, votes))
    update = seen.rounds[0]["update"].reshape(2, 28, 28, 1)
    target = rendered.numpy()[:2] + lens.config.train.learning_rate * update
    with tf.GradientTape() as tape:
        current = twin.generator([z, one_hot], training=True)[:2]
        loss = tf.reduce_sum(tf.square(current - target))
    weights = twin.generator.trainable_weights
    twin.student_optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))
    moved = False
    for a, b, before in zip(lens.generator.trainable_weights, weights,
                            _lens(2).generator.trainable_weights):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-6, atol=1e-7)
        moved |= bool(np.any(np.array(a) != np.array(before)))
    assert moved
    assert lens.ledger.queries == 2


def test_the_teachers_keep_their_batch():
    """The teachers' training is the same with Q < B as with the whole batch (the same
    real and fake batches of B): bit-equal teacher weights after a step."""
    small, whole = _lens(2), _lens(None)
    small.train_step()
    whole.train_step()
    np.testing.assert_array_equal(np.array(small.bank.weights), np.array(whole.bank.weights))


def test_the_ledger_counts_q_queries_a_round():
    lens = _lens(2, g_step=2)
    spends = []
    lens.on_spend = lambda step, round_index, count: spends.append(count)
    for _ in range(3):
        lens.train_step()
    assert spends == [2] * 6
    assert lens.ledger.queries == 12
    topagg = lens.config.topagg
    expected = accounting.epsilon_for(
        steps=3, sigma=topagg.sigma, topk=topagg.topk, queries_per_step=2 * 2,
        delta=lens.config.budget.delta, conversion=lens.config.budget.conversion,
        orders=accounting.classic_orders(lens.config.budget.max_order)).epsilon
    assert lens.ledger.epsilon().epsilon == pytest.approx(expected, rel=1e-12)
    whole = _lens(None, g_step=2)
    whole.train_step()
    assert whole.ledger.queries == 8            # B = 4 per round, the paper's


def test_the_same_budget_allows_about_b_over_q_times_the_steps():
    config = two_teacher_config(query_batch=1)
    config = config.replace(topagg={"sigma": 40.0}, budget={"max_eps": 10.0})
    few = budget.steps_within_budget(config, 4, 784)
    many = budget.steps_within_budget(config, 1, 784)
    assert few >= 1 and 3.5 * few <= many <= 4 * few + 4
    lens = DataLens(config, synthetic_fashion_mnist(16), root_seed=5)
    assert budget.expected_steps(config, lens, 10_000) == many


def test_one_teachers_records_swapped_move_only_its_own_teacher():
    assert_a_swapped_teacher_moves_only_itself(two_teacher_config(query_batch=2))


def test_the_default_is_the_whole_batch_and_old_configs_load():
    assert cfg.TrainConfig().query_batch is None
    assert _lens(None).query_batch == 4
    assert _lens(4).query_batch == 4
    config = two_teacher_config(query_batch=3)
    assert cfg.DataLensConfig.from_dict(config.to_dict()).train.query_batch == 3
    old = config.to_dict()
    del old["train"]["query_batch"]              # a config.json from before the option
    assert cfg.DataLensConfig.from_dict(old).train.query_batch is None


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "3"])
def test_a_bad_query_batch_is_refused_by_name(bad):
    with pytest.raises(cfg.ConfigError, match=f"query_batch must be an integer >= 1 .*got "
                                              f"{bad!r}"):
        cfg.TrainConfig(query_batch=bad)
    with pytest.raises(ValueError, match=f"query_batch must be an integer >= 1, got {bad!r}"):
        check_query_batch(bad, 4)


def test_a_query_batch_larger_than_the_batch_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="query_batch=5 exceeds the step's batch of 4 .*use "
                                         "a value <= 4"):
        _lens(5)
    config = two_teacher_config(query_batch=40, dataset="fashion_mnist", max_records=40)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="query_batch=40 exceeds the step's batch of 4"):
        run.train_run(config, str(out), progress=False, log=lambda line: None)
    assert not out.exists()


def test_a_run_resumes_only_with_its_own_query_batch():
    saved = two_teacher_config(query_batch=3).to_dict()
    assert resume.resume_differences(saved, two_teacher_config(query_batch=3)) == []
    assert resume.resume_differences(saved, two_teacher_config(query_batch=2)) == [
        ("train.query_batch", 3, 2)]
    assert "train.query_batch" in resume.PRIVACY_RELEVANT    # named so in the refusal
    old = two_teacher_config().to_dict()
    del old["train"]["query_batch"]              # a run from before the option resumes
    assert resume.resume_differences(old, two_teacher_config()) == []


def test_reproduce_names_the_lever_and_keeps_the_budget():
    paper = cfg.paper_preset("fashion_mnist", 1)
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, query_batch=5)
    assert options.default_name() == "fashion_mnist-eps1-qb5"
    config, deviations = paper_rows.build_config(options)
    assert config.train.query_batch == 5
    assert dataclasses.replace(config.train, query_batch=None) == paper.train
    assert (config.topagg, config.budget) == (paper.topagg, paper.budget)
    assert deviations == ["beyond the paper: 5 fake images voted on per round instead of "
                          "the whole batch (the teachers keep their batch; each query is the "
                          "same Gaussian vote, so the same budget buys more steps)"]
    with pytest.raises(paper_rows.ReproduceError,
                       match="query_batch 16 exceeds the run's batch of 15"):
        paper_rows.ReproduceOptions("fashion_mnist", 1, query_batch=16)
    with pytest.raises(paper_rows.ReproduceError, match="query_batch must be an integer"):
        paper_rows.ReproduceOptions("fashion_mnist", 1, query_batch=0)


def test_the_clis_set_it():
    args = main_cli.build_parser().parse_args(["--dataset", "fashion_mnist",
                                               "--query_batch", "5"])
    assert main_cli.resolve(args)[1].train.query_batch == 5
    default = main_cli.resolve(main_cli.build_parser().parse_args(
        ["--dataset", "fashion_mnist"]))[1].train
    assert default.query_batch is None
    parsed = reproduce_cli.build_parser().parse_args(["fashion_mnist", "--eps", "1",
                                                      "--query_batch", "5"])
    assert parsed.query_batch == 5


def test_a_whole_run_spends_q_a_round_and_sharded_teachers_give_it_bit_for_bit(
        tiny_fmnist_dir, tmp_path):
    """Through the run directory (budget planning, journal, privacy.json, samples): the
    in-process run and the same run with its teachers in 2 in-process shard workers."""
    config = cfg.DataLensConfig(
        train=cfg.TrainConfig(dataset="fashion_mnist", data_dir=str(tiny_fmnist_dir),
                              num_teachers=4, batch_size=6, d_step=1, pretrain_teacher=1,
                              z_dim=8, teacher_chunk=2, epochs=2, num_samples=12, seed=3,
                              g_step=2, query_batch=2),
        topagg=cfg.TopAggConfig(topk=40, sigma=5.0, thresh=0.2, max_grad=10.0),
        budget=cfg.BudgetConfig(max_eps=1e6))
    outputs = []
    for name, kwargs in (("alone", {}), ("sharded", dict(shards=2,
                                                         shard_backend="inprocess"))):
        out = tmp_path / name
        summary = run.train_run(config, str(out), progress=False, log=lambda line: None,
                                **kwargs)
        with open(os.path.join(out, "privacy.json")) as stream:
            privacy = json.load(stream)
        samples = np.load(os.path.join(out, "samples.npz"))
        outputs.append((privacy, samples["x"]))
        assert privacy["queries_per_round"] == 2
        assert privacy["queries"] == 2 * 2 * privacy["steps"] > 0
        assert summary is not None
    (privacy_a, x_a), (privacy_b, x_b) = outputs
    np.testing.assert_array_equal(x_a, x_b)
    assert privacy_a["epsilon_per_step"] == privacy_b["epsilon_per_step"]
    assert privacy_a["ledger"] == privacy_b["ledger"]
