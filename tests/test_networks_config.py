"""Tests for dclens.datalens.networks (Keras generator/discriminator) and dclens.datalens.config."""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest

from dclens.datalens import config as cfg
from dclens.datalens import networks, teachers
from dclens.privacy.accounting import Conversion
from dclens.datalens.config import (Aggregation, BudgetConfig, ConfigError, DataLensConfig,
                           TopAggConfig, TrainConfig)
from dclens.datalens.networks import ImageShape
from dclens.datalens.topagg import noise_multiplier

MNIST_SHAPE = ImageShape(28, 28, 1, 10)
CELEBA_SHAPE = ImageShape(64, 64, 3, 2)
Z_DIM = 6


def _inputs(shape: ImageShape, batch: int, *, seed: int = 0, labels=None):
    rng = np.random.default_rng(seed)
    z = rng.uniform(-1, 1, size=(batch, Z_DIM)).astype(np.float32)
    if labels is None:
        labels = np.arange(batch) % shape.num_classes
    y = np.eye(shape.num_classes, dtype=np.float32)[labels]
    return z, y


# ---------------------------------------------------------------------------- generator

@pytest.fixture(scope="module")
def mnist_generator():
    return networks.build_generator(MNIST_SHAPE, Z_DIM, seed=0)


@pytest.mark.parametrize("shape", [MNIST_SHAPE, CELEBA_SHAPE], ids=["28x28x1", "64x64x3"])
def test_generator_shape_and_range(shape, mnist_generator):
    generator = (mnist_generator if shape == MNIST_SHAPE
                 else networks.build_generator(shape, Z_DIM, seed=0))
    z, y = _inputs(shape, 4)
    for training in (False, True):
        images = np.asarray(generator([z, y], training=training))
        assert images.shape == (4, shape.height, shape.width, shape.channels)
        assert images.dtype == np.float32
        assert np.all(np.isfinite(images))
        assert images.min() >= 0.0 and images.max() <= 1.0


def test_generator_is_conditional_on_the_label(mnist_generator):
    z, _ = _inputs(MNIST_SHAPE, 1)
    z = np.repeat(z, 10, axis=0)                  # the same latent for every class
    y = np.eye(10, dtype=np.float32)
    images = np.asarray(mnist_generator([z, y], training=False))
    for a in range(10):
        for b in range(a + 1, 10):
            assert not np.allclose(images[a], images[b]), (a, b)


def test_generator_keras_round_trip(mnist_generator, tmp_path):
    path = tmp_path / "g.keras"
    mnist_generator.save(path)
    loaded = keras.models.load_model(path)
    z, y = _inputs(MNIST_SHAPE, 5, seed=3)
    want = np.asarray(mnist_generator([z, y], training=False))
    got = np.asarray(loaded([z, y], training=False))
    np.testing.assert_array_equal(got, want)
    assert [w.shape for w in loaded.weights] == [w.shape for w in mnist_generator.weights]


def test_generator_rejects_zero_latent_dim():
    with pytest.raises(ValueError, match="z_dim"):
        networks.build_generator(MNIST_SHAPE, 0)


# ------------------------------------------------------------------------ discriminator

@pytest.mark.parametrize("shape", [MNIST_SHAPE, CELEBA_SHAPE], ids=["28x28x1", "64x64x3"])
def test_discriminator_output_and_weight_contract(shape):
    model = networks.build_discriminator(shape, seed=0)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(3, shape.height, shape.width, shape.channels)).astype(np.float32)
    y = np.eye(shape.num_classes, dtype=np.float32)[np.arange(3) % shape.num_classes]
    logits = np.asarray(model([x, y], training=False))
    assert logits.shape == (3, 1)
    assert np.all(np.isfinite(logits))
    expected = networks.discriminator_weight_shapes(shape)
    got = [tuple(w.shape) for w in model.trainable_weights]
    assert got == [s for _, s in expected]
    layout = teachers.ParamLayout.for_shape(shape)
    trainable = sum(math.prod(w.shape) for w in model.trainable_weights)
    assert trainable == layout.size


def test_discriminator_parameter_count_28x28():
    model = networks.build_discriminator(MNIST_SHAPE, seed=0)
    assert teachers.ParamLayout.for_shape(MNIST_SHAPE).size == 555_655
    trainable = sum(math.prod(w.shape) for w in model.trainable_weights)
    assert trainable == 555_655
    # Plus the BN moving mean and variance (42 + 256 channels, two each).
    assert model.count_params() == 555_655 + 2 * (42 + 256)


@pytest.mark.parametrize("size", [(30, 28), (28, 30), (26, 26), (62, 64)])
def test_image_shape_rejects_sizes_not_divisible_by_4(size):
    with pytest.raises(ValueError, match="multiples of 4"):
        ImageShape(size[0], size[1], 1, 10)


def test_image_shape_dim():
    assert MNIST_SHAPE.dim == 784
    assert CELEBA_SHAPE.dim == 64 * 64 * 3


# ------------------------------------------------------------------------------ config

PAPER_NUMBERS = {
    # name: (dataset, teachers, k, sigma, thresh, z_dim, eps)
    "mnist-eps1": ("mnist", 4000, 200, 5000.0, 0.7, 50, 1.0),
    "mnist-eps10": ("mnist", 4000, 300, 800.0, 0.2, 50, 10.0),
    "fashion_mnist-eps1": ("fashion_mnist", 4000, 200, 5000.0, 0.9, 50, 1.0),
    "fashion_mnist-eps10": ("fashion_mnist", 4000, 350, 1000.0, 0.27, 64, 10.0),
    "celebA-gender-eps1": ("celebA-gender-train", 6000, 700, 9000.0, 0.85, 100, 1.0),
    "celebA-gender-eps10": ("celebA-gender-train", 6000, 500, 700.0, 0.12, 100, 10.0),
}


def test_every_paper_preset_is_listed():
    assert set(cfg.PAPER_PRESET_NAMES) == set(PAPER_NUMBERS)
    assert set(cfg.PRESETS) == set(PAPER_NUMBERS) | {"demo"}


@pytest.mark.parametrize("name", sorted(PAPER_NUMBERS))
def test_paper_preset_numbers(name):
    dataset, num_teachers, topk, sigma, thresh, z_dim, eps = PAPER_NUMBERS[name]
    config = cfg.preset(name)
    assert config.train.dataset == dataset
    assert config.train.num_teachers == num_teachers
    assert config.topagg.topk == topk
    assert config.topagg.sigma == sigma
    assert config.topagg.thresh == thresh
    assert config.train.z_dim == z_dim
    assert config.budget.max_eps == eps
    assert config.budget.delta == 1e-5
    # Common to all paper runs: d_step 2, c = 1e-5, stochastic sign, batch 30.
    assert config.train.d_step == 2
    assert config.topagg.max_grad == 1e-5
    assert config.topagg.method is Aggregation.TOPK_STOCHASTIC_SIGN
    assert config.train.batch_size == 30
    assert config.train.non_private is False
    assert noise_multiplier(config.topagg, 784) == pytest.approx(
        sigma / (2 * math.sqrt(topk)), rel=1e-15)


def test_noise_multiplier_formula():
    assert noise_multiplier(TopAggConfig(topk=100, sigma=40.0), 784) == 2.0
    assert noise_multiplier(TopAggConfig(topk=1, sigma=3.0), 784) == 1.5
    # Variants without top-k: the sensitivity grows with the image dimension D.
    assert noise_multiplier(TopAggConfig(sigma=56.0, method=Aggregation.NO_TOPK), 784) == 1.0
    assert noise_multiplier(TopAggConfig(sigma=84.0, method=Aggregation.KLEVEL,
                        klevel=4), 784) == 1.0
    assert noise_multiplier(TopAggConfig(topk=100, sigma=40.0,
                        method=Aggregation.NO_THRESHOLD), 784) == 2.0


@pytest.mark.parametrize("name", ["demo", *cfg.PAPER_PRESET_NAMES])
def test_to_dict_from_dict_round_trip_through_json(name):
    config = cfg.preset(name)
    text = json.dumps(config.to_dict())
    back = DataLensConfig.from_dict(json.loads(text))
    assert back == config
    assert json.loads(config.to_json()) == config.to_dict()


def test_round_trip_keeps_non_default_enums_and_optionals():
    config = DataLensConfig(
        train=TrainConfig(seed=7, max_records=50, data_dir="/x", non_private=True,
                          balanced_partition=False),
        topagg=TopAggConfig(sigma=0.0, method=Aggregation.TOPK_SIGN),
        budget=BudgetConfig(conversion=Conversion.DP_ACCOUNTING, max_order=64))
    data = json.loads(json.dumps(config.to_dict()))
    assert data["topagg"]["method"] == "topk_sign"
    assert data["budget"]["conversion"] == "dp_accounting"
    assert DataLensConfig.from_dict(data) == config


@pytest.mark.parametrize("mutate,word", [
    (lambda d: d.update(extra={}), "sections"),
    (lambda d: d["train"].update(epochz=3), "epochz"),
    (lambda d: d["topagg"].update(k=3), "'k'"),
    (lambda d: d["budget"].update(eps=1.0), "'eps'"),
])
def test_from_dict_rejects_unknown_keys(mutate, word):
    data = cfg.demo_preset().to_dict()
    mutate(data)
    with pytest.raises(ConfigError, match="unknown") as excinfo:
        DataLensConfig.from_dict(data)
    assert word in str(excinfo.value)


INVALID = [
    (TopAggConfig, "topk", 0),
    (TopAggConfig, "topk", 1.5),
    (TopAggConfig, "topk", True),
    (TopAggConfig, "sigma", float("nan")),
    (TopAggConfig, "sigma", -1.0),
    (TopAggConfig, "thresh", 1.0),
    (TopAggConfig, "thresh", -0.1),
    (TopAggConfig, "max_grad", 0.0),
    (TopAggConfig, "max_grad", float("inf")),
    (TopAggConfig, "method", "topk_sign"),
    (BudgetConfig, "max_eps", -1.0),
    (BudgetConfig, "max_eps", float("inf")),
    (BudgetConfig, "delta", 1),
    (BudgetConfig, "delta", 0.0),
    (BudgetConfig, "max_order", 2),
    (BudgetConfig, "conversion", "classic"),
    (TrainConfig, "num_teachers", 0),
    (TrainConfig, "z_dim", 0),
    (TrainConfig, "batch_size", 2.0),
    (TrainConfig, "learning_rate", 0.0),
    (TrainConfig, "beta1", 1.0),
    (TrainConfig, "seed", -1),
    (TrainConfig, "pretrain_teacher", -1),
    (TrainConfig, "partition_seed", -1),
    (TrainConfig, "max_records", 0),
    (TrainConfig, "dataset", ""),
]


@pytest.mark.parametrize("kind,field,value", INVALID,
                         ids=[f"{k.__name__}.{f}={v!r}" for k, f, v in INVALID])
def test_invalid_field_raises_config_error_quoting_the_value(kind, field, value):
    with pytest.raises(ConfigError) as excinfo:
        kind(**{field: value})
    message = str(excinfo.value)
    assert f"got {value!r}" in message, message
    # The field is named (BudgetConfig.max_order is the authors' --orders).
    assert (field if field != "max_order" else "orders") in message


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_configs_are_frozen():
    config = cfg.demo_preset()
    with pytest.raises(Exception):
        config.topagg.sigma = 1.0           # type: ignore[misc]
    with pytest.raises(Exception):
        config.train = TrainConfig()        # type: ignore[misc]


def test_private_run_needs_noise():
    with pytest.raises(ConfigError, match="--non_private") as excinfo:
        DataLensConfig(topagg=TopAggConfig(sigma=0.0))
    assert "got 0.0" in str(excinfo.value)
    with pytest.raises(ConfigError, match="--non_private"):
        cfg.demo_preset().replace(topagg={"sigma": 0.0})
    config = DataLensConfig(train=TrainConfig(non_private=True), topagg=TopAggConfig(sigma=0.0))
    assert config.train.non_private and config.topagg.sigma == 0.0


def test_replace_validates_and_keeps_the_rest():
    base = cfg.preset("mnist-eps1")
    changed = base.replace(train={"epochs": 3}, budget={"max_eps": 2.0})
    assert changed.train.epochs == 3 and changed.budget.max_eps == 2.0
    assert changed.topagg == base.topagg
    assert base.train.epochs == 1000                       # the original is unchanged
    with pytest.raises(ConfigError, match="got 0"):
        base.replace(train={"epochs": 0})


def test_unknown_preset_lists_the_available_ones():
    with pytest.raises(ConfigError) as excinfo:
        cfg.preset("nope")
    message = str(excinfo.value)
    assert "'nope'" in message
    for name in ("demo", *cfg.PAPER_PRESET_NAMES):
        assert name in message


def test_paper_preset_unknown_pair():
    with pytest.raises(ConfigError, match="available"):
        cfg.paper_preset("mnist", 5)


# ------------------------------------------------------------ independent layer seeds

def _leading_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of a's values equal to b's leading values (the shared-seed symptom)."""
    a, b = np.ravel(a), np.ravel(b)
    n = min(a.size, b.size)
    return float(np.mean(a[:n] == b[:n]))


def test_generator_layers_are_initialised_independently(mnist_generator):
    kernels = {layer: mnist_generator.get_layer(layer).kernel.numpy()
               for layer in networks.GENERATOR_LAYERS}
    # One shared seeded initializer made g_h0_lin's kernel the start of g_h1_lin's.
    assert _leading_overlap(kernels["g_h0_lin"], kernels["g_h1_lin"]) < 0.01
    assert _leading_overlap(kernels["g_h3_deconv"], kernels["g_h2_deconv"]) < 0.01
    # Still reproducible from the seed.
    again = networks.build_generator(MNIST_SHAPE, Z_DIM, seed=0)
    np.testing.assert_array_equal(again.get_layer("g_h1_lin").kernel.numpy(),
                                  kernels["g_h1_lin"])


def test_discriminator_layers_are_initialised_independently():
    model = networks.build_discriminator(MNIST_SHAPE, seed=0)
    conv0, conv1 = (model.get_layer(n).kernel.numpy() for n in ("d_h0_conv", "d_h1_conv"))
    dense2, dense3 = (model.get_layer(n).kernel.numpy() for n in ("d_h2_lin", "d_h3_lin"))
    assert _leading_overlap(conv0, conv1) < 0.01
    assert _leading_overlap(dense3, dense2) < 0.01


def test_layer_seeds_are_distinct_and_none_stays_none():
    seeds = networks.layer_seeds(0, networks.GENERATOR_LAYERS)
    assert len(set(seeds.values())) == len(networks.GENERATOR_LAYERS)
    assert all(0 <= s < 2 ** 31 for s in seeds.values())
    assert networks.layer_seeds(None, ("a", "b")) == {"a": None, "b": None}
