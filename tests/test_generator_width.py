"""The student generator's width (``TrainConfig.generator_filters`` / ``generator_dense``;
issue 39's lever 4, the generator's architecture):

* exact: the layers have the widths asked for (gf filters, gfc dense units), and the
  defaults are the authors' ``gf_dim`` 64 and ``gfc_dim`` 1024, so a default run builds the
  generator it always built;
* a run with a narrow generator trains, samples and keeps its width in ``config.json``;
  a config written before the option existed loads with the authors' widths;
* privacy: the architecture is data-independent and the generator reads only the votes,
  so one teacher's records swapped adversarially still change that teacher alone and the
  vote sum moves by at most TopAgg's 2 sqrt(k);
* bad values are refused by name; the CLIs set it (``reproduce.py --generator_width``
  as a named deviation with the paper's accounting).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import synthetic_fashion_mnist
from teacher_swap import assert_a_swapped_teacher_moves_only_itself, two_teacher_config
from dclens.cli import main as main_cli
from dclens.cli import reproduce as reproduce_cli
from dclens.datalens import config as cfg
from dclens.datalens import networks
from dclens.datalens.train import DataLens
from dclens.experiments import paper_rows

SHAPE = networks.ImageShape(28, 28, 1, 10)
Z_DIM = 8


def _kernel_shapes(generator) -> dict[str, tuple[int, ...]]:
    return {layer: tuple(generator.get_layer(layer).kernel.shape)
            for layer in networks.GENERATOR_LAYERS}


def _expected_kernel_shapes(filters: int, dense: int) -> dict[str, tuple[int, ...]]:
    k = SHAPE.num_classes
    return {"g_h0_lin": (Z_DIM + k, dense),
            "g_h1_lin": (dense + k, 2 * filters * 7 * 7),
            # Conv2DTranspose kernels are [h, w, out, in]
            "g_h2_deconv": (5, 5, 2 * filters, 2 * filters + k),
            "g_h3_deconv": (5, 5, SHAPE.channels, 2 * filters + k)}


@pytest.mark.parametrize("filters,dense", [(8, 32), (96, 1536)])
def test_the_generator_has_the_widths_asked_for(filters, dense):
    generator = networks.build_generator(SHAPE, Z_DIM, seed=1, filters=filters, dense=dense)
    assert _kernel_shapes(generator) == _expected_kernel_shapes(filters, dense)
    images = generator([np.zeros((3, Z_DIM), np.float32), np.eye(10, dtype=np.float32)[:3]])
    assert tuple(images.shape) == (3, 28, 28, 1)


def test_the_defaults_are_the_authors_widths():
    assert (networks.GENERATOR_FILTERS, networks.GENERATOR_DENSE) == (64, 1024)
    default = networks.build_generator(SHAPE, Z_DIM, seed=1)
    assert _kernel_shapes(default) == _expected_kernel_shapes(64, 1024)
    train = cfg.TrainConfig()
    assert (train.generator_filters, train.generator_dense) == (64, 1024)
    explicit = networks.build_generator(SHAPE, Z_DIM, seed=1, filters=64, dense=1024)
    for a, b in zip(default.get_weights(), explicit.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", [0, -4, 2.0, True, "64"])
def test_a_bad_width_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=f"generator filters must be an integer >= 1 .*got "
                                         f"{bad!r}"):
        networks.build_generator(SHAPE, Z_DIM, filters=bad)
    with pytest.raises(ValueError, match=f"generator dense must be an integer >= 1 .*got "
                                         f"{bad!r}"):
        networks.build_generator(SHAPE, Z_DIM, dense=bad)
    for field in ("generator_filters", "generator_dense"):
        with pytest.raises(cfg.ConfigError,
                           match=f"{field} must be an integer >= 1, got {bad!r}"):
            cfg.TrainConfig(**{field: bad})


def test_a_run_with_a_narrow_generator_trains_and_keeps_its_width():
    config = two_teacher_config(generator_filters=8, generator_dense=32)
    lens = DataLens(config, synthetic_fashion_mnist(16), root_seed=5)
    assert _kernel_shapes(lens.generator) == _expected_kernel_shapes(8, 32)
    before = [np.array(w) for w in lens.generator.trainable_weights]
    lens.train_step()
    after = [np.array(w) for w in lens.generator.trainable_weights]
    assert any(np.any(a != b) for a, b in zip(before, after))    # the votes moved it
    loaded = cfg.DataLensConfig.from_dict(config.to_dict())
    assert (loaded.train.generator_filters, loaded.train.generator_dense) == (8, 32)
    old = config.to_dict()                   # a config.json from before the option
    del old["train"]["generator_filters"], old["train"]["generator_dense"]
    assert cfg.DataLensConfig.from_dict(old).train.generator_filters == 64
    assert cfg.DataLensConfig.from_dict(old).train.generator_dense == 1024


def test_one_teachers_records_swapped_move_only_its_own_teacher():
    assert_a_swapped_teacher_moves_only_itself(
        two_teacher_config(generator_filters=8, generator_dense=32))


def test_reproduce_names_the_lever_and_keeps_the_accounting():
    paper = cfg.paper_preset("fashion_mnist", 1)
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, generator_width=0.5)
    assert options.default_name() == "fashion_mnist-eps1-gw0.5"
    config, deviations = paper_rows.build_config(options)
    assert (config.train.generator_filters, config.train.generator_dense) == (32, 512)
    assert dataclasses.replace(config.train, generator_filters=64,
                               generator_dense=1024) == paper.train
    assert (config.topagg, config.budget) == (paper.topagg, paper.budget)
    assert deviations == ["beyond the paper: a generator 0.5 x as wide (32 filters and 512 "
                          "dense units instead of 64 and 1024; data-independent, the same "
                          "sensitivity)"]
    wide, _ = paper_rows.build_config(paper_rows.ReproduceOptions(generator_width=1.5))
    assert (wide.train.generator_filters, wide.train.generator_dense) == (96, 1536)
    same = paper_rows.ReproduceOptions("fashion_mnist", 1, generator_width=1)
    assert same.default_name() == "fashion_mnist-eps1"
    assert paper_rows.build_config(same) == (paper, [])
    for bad in (0, -1, 0.3, float("nan"), True, "2"):
        with pytest.raises(paper_rows.ReproduceError,
                           match=f"generator_width must be a number > 0 .*got {bad!r}"):
            paper_rows.ReproduceOptions(generator_width=bad)


def test_the_clis_set_it():
    args = main_cli.build_parser().parse_args(["--dataset", "fashion_mnist", "--gf_dim", "32",
                                               "--gfc_dim", "512"])
    train = main_cli.resolve(args)[1].train
    assert (train.generator_filters, train.generator_dense) == (32, 512)
    default = main_cli.resolve(main_cli.build_parser().parse_args(
        ["--dataset", "fashion_mnist"]))[1].train
    assert (default.generator_filters, default.generator_dense) == (64, 1024)
    parsed = reproduce_cli.build_parser().parse_args(["fashion_mnist", "--eps", "1",
                                                      "--generator_width", "2"])
    assert parsed.generator_width == 2.0
