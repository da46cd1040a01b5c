"""The student generator's upsampling (``TrainConfig.generator_upsampling``; issue 39's
lever 4, the generator's architecture):

* exact: ``transpose`` (the default) builds the authors' two stride-2 transposed
  convolutions, bit for bit the generator it always built; ``resize`` builds a
  nearest-neighbour 2x resize then a stride-1 5x5 convolution in their place;
* the reason for it, exactly: on a constant feature map a stride-2 transposed 5x5
  convolution prints a checkerboard (its output positions see 9, 6 or 4 kernel taps),
  a resize-convolution none (every interior position sees all 25), nor a stride-2 4x4
  transposed convolution (``transpose4``: every interior position sees 4);
* a run with resize-convolutions trains and keeps its choice in ``config.json``; a config
  written before the option existed loads with the authors' transposed convolutions;
* privacy: the architecture is data-independent and the generator reads only the votes,
  so one teacher's records swapped adversarially still change that teacher alone and the
  vote sum moves by at most TopAgg's 2 sqrt(k);
* bad values are refused by name; the CLIs and the levers table set it.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest

from conftest import synthetic_fashion_mnist
from teacher_swap import assert_a_swapped_teacher_moves_only_itself, two_teacher_config
from dclens.cli import main as main_cli
from dclens.cli import reproduce as reproduce_cli
from dclens.datalens import config as cfg
from dclens.datalens import networks
from dclens.datalens.train import DataLens
from dclens.experiments import paper_rows, tables

SHAPE = networks.ImageShape(28, 28, 1, 10)
Z_DIM = 8
RESIZE = cfg.GeneratorUpsampling.RESIZE


def _layer_kinds(generator) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {layer.name: (type(layer).__name__, tuple(layer.kernel.shape))
            for layer in generator.layers if getattr(layer, "kernel", None) is not None}


def test_resize_replaces_the_transposed_convolutions():
    k, gf = SHAPE.num_classes, 8
    generator = networks.build_generator(SHAPE, Z_DIM, seed=1, filters=gf, dense=32,
                                         upsampling="resize")
    assert _layer_kinds(generator) == {
        "g_h0_lin": ("Dense", (Z_DIM + k, 32)),
        "g_h1_lin": ("Dense", (32 + k, 2 * gf * 7 * 7)),
        "g_h2_conv": ("Conv2D", (5, 5, 2 * gf + k, 2 * gf)),     # [h, w, in, out]
        "g_h3_conv": ("Conv2D", (5, 5, 2 * gf + k, SHAPE.channels))}
    resizes = [layer for layer in generator.layers
               if isinstance(layer, keras.layers.UpSampling2D)]
    assert [(r.name, r.interpolation) for r in resizes] == [
        ("g_h2_conv_resize", "nearest"), ("g_h3_conv_resize", "nearest")]
    assert networks.generator_layers("resize") == tuple(_layer_kinds(generator))
    images = generator([np.zeros((3, Z_DIM), np.float32), np.eye(10, dtype=np.float32)[:3]])
    assert tuple(images.shape) == (3, 28, 28, 1)
    assert np.all((np.asarray(images) > 0) & (np.asarray(images) < 1))


def test_transpose4_has_4x4_transposed_convolutions():
    k, gf = SHAPE.num_classes, 8
    generator = networks.build_generator(SHAPE, Z_DIM, seed=1, filters=gf, dense=32,
                                         upsampling="transpose4")
    assert _layer_kinds(generator) == {
        "g_h0_lin": ("Dense", (Z_DIM + k, 32)),
        "g_h1_lin": ("Dense", (32 + k, 2 * gf * 7 * 7)),
        "g_h2_deconv": ("Conv2DTranspose", (4, 4, 2 * gf, 2 * gf + k)),   # [h, w, out, in]
        "g_h3_deconv": ("Conv2DTranspose", (4, 4, SHAPE.channels, 2 * gf + k))}
    assert networks.generator_layers("transpose4") == networks.GENERATOR_LAYERS
    images = generator([np.zeros((3, Z_DIM), np.float32), np.eye(10, dtype=np.float32)[:3]])
    assert tuple(images.shape) == (3, 28, 28, 1)


def test_the_default_is_the_authors_generator_bit_for_bit():
    assert cfg.TrainConfig().generator_upsampling is cfg.GeneratorUpsampling.TRANSPOSE
    assert {u.value for u in cfg.GeneratorUpsampling} == set(networks.UPSAMPLINGS)
    default = networks.build_generator(SHAPE, Z_DIM, seed=1)
    kinds = _layer_kinds(default)
    assert tuple(kinds) == networks.GENERATOR_LAYERS == networks.generator_layers()
    assert kinds["g_h2_deconv"][0] == kinds["g_h3_deconv"][0] == "Conv2DTranspose"
    assert not any(isinstance(layer, keras.layers.UpSampling2D) for layer in default.layers)
    explicit = networks.build_generator(SHAPE, Z_DIM, seed=1, upsampling="transpose")
    for a, b in zip(default.get_weights(), explicit.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def _upsampled_constant(upsampling: str) -> np.ndarray:
    """A constant 8x8 map of ones through the upsampling layers with an all-ones kernel
    and zero bias: each output is the number of kernel taps that reach it."""
    h = keras.ops.ones((1, 8, 8, 1))
    for layer in networks.upsampling_layers(upsampling, 1, keras.initializers.Ones(),
                                            "up"):
        h = layer(h)
    return np.asarray(h)[0, :, :, 0]


def test_resize_convolutions_print_no_checkerboard():
    resized = _upsampled_constant("resize")
    transposed = _upsampled_constant("transpose")
    assert resized.shape == transposed.shape == (16, 16)
    # away from the zero padding (2 pixels) every position sees all 25 taps
    np.testing.assert_array_equal(resized[2:-2, 2:-2], np.full((12, 12), 25.0))
    # the authors' layer: 3 x 3, 3 x 2 or 2 x 2 taps by the parity of the position
    interior = transposed[2:-2, 2:-2]
    assert sorted(np.unique(interior).tolist()) == [4.0, 6.0, 9.0]
    assert np.array_equal(interior[::2, ::2], np.full((6, 6), interior[0, 0]))
    assert interior[0, 0] != interior[1, 1]
    # 4x4 kernel, stride 2: an even overlap, 2 x 2 taps everywhere inside
    even = _upsampled_constant("transpose4")
    np.testing.assert_array_equal(even[1:-1, 1:-1], np.full((14, 14), 4.0))


@pytest.mark.parametrize("bad", ["bilinear", "", None, 2, "Resize"])
def test_a_bad_upsampling_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=f"generator upsampling must be one of "
                                         f"\\['transpose', 'resize', 'transpose4'\\].*got "
                                         f"{bad!r}"):
        networks.build_generator(SHAPE, Z_DIM, upsampling=bad)
    with pytest.raises(cfg.ConfigError, match="generator_upsampling must be one of"):
        cfg.TrainConfig(generator_upsampling=bad)
    if bad is not None:               # None is the paper's for ReproduceOptions
        with pytest.raises(paper_rows.ReproduceError,
                           match=f"unknown generator_upsampling {bad!r}"):
            paper_rows.ReproduceOptions(generator_upsampling=bad)


def test_a_run_with_resize_convolutions_trains_and_keeps_them():
    config = two_teacher_config(generator_filters=8, generator_dense=32,
                                generator_upsampling=RESIZE)
    lens = DataLens(config, synthetic_fashion_mnist(16), root_seed=5)
    assert tuple(_layer_kinds(lens.generator)) == networks.generator_layers("resize")
    before = [np.array(w) for w in lens.generator.trainable_weights]
    lens.train_step()
    after = [np.array(w) for w in lens.generator.trainable_weights]
    assert any(np.any(a != b) for a, b in zip(before, after))    # the votes moved it
    saved = config.to_dict()
    assert saved["train"]["generator_upsampling"] == "resize"
    assert cfg.DataLensConfig.from_dict(saved).train.generator_upsampling is RESIZE
    del saved["train"]["generator_upsampling"]      # a config.json from before the option
    assert (cfg.DataLensConfig.from_dict(saved).train.generator_upsampling
            is cfg.GeneratorUpsampling.TRANSPOSE)


@pytest.mark.parametrize("upsampling", [RESIZE, cfg.GeneratorUpsampling.TRANSPOSE4])
def test_one_teachers_records_swapped_move_only_its_own_teacher(upsampling):
    assert_a_swapped_teacher_moves_only_itself(
        two_teacher_config(generator_filters=8, generator_dense=32,
                           generator_upsampling=upsampling))


def test_reproduce_names_the_lever_and_keeps_the_accounting():
    paper = cfg.paper_preset("fashion_mnist", 1)
    options = paper_rows.ReproduceOptions("fashion_mnist", 1, generator_upsampling="resize")
    assert options.default_name() == "fashion_mnist-eps1-resize"
    config, deviations = paper_rows.build_config(options)
    assert config.train.generator_upsampling is RESIZE
    assert dataclasses.replace(config.train, generator_upsampling=cfg.GeneratorUpsampling.
                               TRANSPOSE) == paper.train
    assert (config.topagg, config.budget) == (paper.topagg, paper.budget)
    assert len(deviations) == 1 and "resize-convolutions" in deviations[0]
    assert "the same sensitivity" in deviations[0]
    even = paper_rows.ReproduceOptions("fashion_mnist", 1, generator_upsampling="transpose4")
    assert even.default_name() == "fashion_mnist-eps1-transpose4"
    config, deviations = paper_rows.build_config(even)
    assert config.train.generator_upsampling is cfg.GeneratorUpsampling.TRANSPOSE4
    assert len(deviations) == 1 and "4x4 transposed convolutions" in deviations[0]
    same = paper_rows.ReproduceOptions("fashion_mnist", 1, generator_upsampling="transpose")
    assert same.default_name() == "fashion_mnist-eps1"
    assert paper_rows.build_config(same) == (paper, [])


def test_the_clis_and_the_levers_table_set_it():
    args = main_cli.build_parser().parse_args(["--dataset", "fashion_mnist",
                                               "--generator_upsampling", "resize"])
    assert main_cli.resolve(args)[1].train.generator_upsampling is RESIZE
    default = main_cli.resolve(main_cli.build_parser().parse_args(
        ["--dataset", "fashion_mnist"]))[1].train
    assert default.generator_upsampling is cfg.GeneratorUpsampling.TRANSPOSE
    with pytest.raises(SystemExit):
        main_cli.build_parser().parse_args(["--generator_upsampling", "bilinear"])
    parsed = reproduce_cli.build_parser().parse_args(["fashion_mnist", "--eps", "1",
                                                      "--generator_upsampling", "resize"])
    assert parsed.generator_upsampling == "resize"
    _, rows = tables.TABLES["levers"]
    by_upsampling = {row.changes["generator_upsampling"]: row.label for row in rows
                     if "generator_upsampling" in row.changes}
    assert set(by_upsampling) == {"resize", "transpose4"}
    assert "resize-convolutions" in by_upsampling["resize"]
    assert "4x4 transposed convolutions" in by_upsampling["transpose4"]
