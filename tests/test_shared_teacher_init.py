"""Shared teacher initialisation (``TrainConfig.shared_teacher_init``; issue 39):

* exact: with the option every row of a fresh bank is one and the same draw, a shard's
  bank (teachers [3, 7) of 10) holds the whole bank's rows, and without it (the default,
  the paper's) the rows are independent draws, unchanged;
* a run with it starts every teacher from the same weights, and its teachers then train
  apart on their own partitions;
* privacy: the initialisation is data-independent, so one teacher's records swapped
  adversarially still change that teacher alone, and the vote sum moves by at most
  TopAgg's 2 sqrt(k);
* a value that is not a bool is refused by name; the CLIs set it.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import synthetic_fashion_mnist
from teacher_swap import assert_a_swapped_teacher_moves_only_itself, two_teacher_config
from dclens.cli import main as main_cli
from dclens.cli import reproduce as reproduce_cli
from dclens.datalens import networks, teacher_bank, teachers
from dclens.datalens.config import ConfigError, DataLensConfig, TrainConfig
from dclens.datalens.train import DataLens

LAYOUT = teachers.ParamLayout.for_shape(networks.ImageShape(28, 28, 1, 10))


def _config(shared: bool) -> DataLensConfig:
    return two_teacher_config(shared_teacher_init=shared)


def _weights(bank: teacher_bank.TeacherBank) -> np.ndarray:
    return np.array(bank.weights)


def test_a_shared_bank_holds_one_draw_in_every_row_and_shards_agree():
    shared = _weights(teacher_bank.TeacherBank.create(LAYOUT, 10, seed=3, init_chunk=4,
                                                      shared_init=True))
    for row in shared[1:]:
        np.testing.assert_array_equal(row, shared[0])
    # the draw is a DCGAN initialisation (kernels vary, batch-norm gamma 1), not zeros
    assert np.std(shared[0]) > 1e-3
    shard = _weights(teacher_bank.TeacherBank.create(
        LAYOUT, 4, seed=3, init_chunk=4, first_teacher=3, total_teachers=10,
        shared_init=True))
    np.testing.assert_array_equal(shard, shared[3:7])
    other_seed = _weights(teacher_bank.TeacherBank.create(LAYOUT, 2, seed=4, shared_init=True))
    assert np.any(other_seed[0] != shared[0])


def test_without_the_option_every_teacher_has_its_own_draw():
    independent = _weights(teacher_bank.TeacherBank.create(LAYOUT, 6, seed=3, init_chunk=4))
    explicit = _weights(teacher_bank.TeacherBank.create(LAYOUT, 6, seed=3, init_chunk=4,
                                                        shared_init=False))
    np.testing.assert_array_equal(independent, explicit)
    for i in range(6):
        for j in range(i + 1, 6):
            assert np.any(independent[i] != independent[j])
    assert TrainConfig().shared_teacher_init is False


def test_a_run_starts_its_teachers_equal_and_they_train_apart():
    data = synthetic_fashion_mnist(16)
    lens = DataLens(_config(True), data, root_seed=6)
    start = _weights(lens.bank)
    np.testing.assert_array_equal(start[0], start[1])
    lens.train_step()
    trained = _weights(lens.bank)
    assert np.any(trained[0] != trained[1])        # their own partitions, their own steps
    independent = _weights(DataLens(_config(False), data, root_seed=6).bank)
    assert np.any(independent[0] != independent[1])


@pytest.mark.parametrize("ensemble", ["fast", "reference"])
def test_one_teachers_records_swapped_move_only_its_own_teacher(ensemble):
    """Neighbouring data sets: every record of teacher 0 replaced (noise images, other
    labels). From the shared start, after a training step, teacher 1 (same chunk) has
    bit-equal weights and image gradients; the vote sum moves by at most 2 sqrt(k)."""
    assert_a_swapped_teacher_moves_only_itself(_config(True), ensemble=ensemble)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_a_value_that_is_not_a_bool_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match=f"shared_teacher_init must be True or False, "
                                          f"got {bad!r}"):
        _config(bad)


def test_the_clis_set_it():
    args = main_cli.build_parser().parse_args(["--dataset", "fashion_mnist",
                                               "--shared_teacher_init"])
    assert main_cli.resolve(args)[1].train.shared_teacher_init is True
    default = main_cli.build_parser().parse_args(["--dataset", "fashion_mnist"])
    assert main_cli.resolve(default)[1].train.shared_teacher_init is False
    parsed = reproduce_cli.build_parser().parse_args(["fashion_mnist", "--eps", "1",
                                                      "--shared_teacher_init"])
    assert parsed.shared_teacher_init is True
