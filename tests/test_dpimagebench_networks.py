"""DPImageBench's WRN and ResNeXt (dclens.evaluation.dpimagebench_networks) and the protocol
running all three classifiers.

The Keras networks are checked against a plain numpy forward pass written from the
torch modules' ``forward`` (inference mode, with random batch-norm statistics so that
every normalisation matters), their sizes against the published parameter counts, and
their initialisation against the stated distributions."""

import dataclasses

import numpy as np
import pytest
from conftest import band_images
from numpy.lib.stride_tricks import sliding_window_view

from dclens.evaluation import dpimagebench
from dclens.evaluation import dpimagebench_networks as networks
from dclens.evaluation.synthetic_input import EvaluationError

# ------------------------------------------------------------------ numpy reference

def _conv(x, kernel, stride, pad, groups=1):
    """Cross-correlation of NHWC ``x`` with an HWIO ``kernel`` (I = in / groups), torch's
    zero padding and stride, in float64, by explicit windows."""
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    k = kernel.shape[0]
    windows = sliding_window_view(x, (k, k), axis=(1, 2))[:, ::stride, ::stride]
    cin, cout = kernel.shape[2], kernel.shape[3] // groups
    out = [np.tensordot(windows[..., g * cin:(g + 1) * cin, :, :],
                        kernel[..., g * cout:(g + 1) * cout].transpose(2, 0, 1, 3),
                        axes=([3, 4, 5], [0, 1, 2]))             # sum over c, i, j
           for g in range(groups)]
    return np.concatenate(out, axis=-1)


class _Reference:
    """Reads a Keras model's weights by layer name; ops in float64."""

    def __init__(self, model):
        self.model = model

    def weights(self, name):
        return [w.astype(np.float64) for w in self.model.get_layer(name).get_weights()]

    def conv(self, x, name, stride, groups=1):
        kernel, = self.weights(name)
        return _conv(x, kernel, stride, kernel.shape[0] // 2, groups)

    def bn(self, x, name):
        gamma, beta, mean, var = self.weights(name)
        return gamma * (x - mean) / np.sqrt(var + networks.BN_EPSILON) + beta

    def fc(self, x):
        kernel, bias = self.weights("fc")
        return x.mean(axis=(1, 2)) @ kernel + bias


def _relu(x):
    return np.maximum(x, 0)


def _wrn_reference(model, x, depth, widen):
    """torch's WideResNet.forward / BasicBlock.forward (dropout: inference)."""
    ref, blocks = _Reference(model), (depth - 4) // 6
    out = ref.conv(x, "conv1", 1)
    in_planes = 16
    for stage, (planes, stride) in enumerate(((16 * widen, 1), (32 * widen, 2),
                                              (64 * widen, 2)), start=1):
        for i in range(blocks):
            name, s = f"block{stage}_{i}", stride if i == 0 else 1
            equal = in_planes == planes
            if not equal:
                out = _relu(ref.bn(out, f"{name}_bn1"))
                h = out
            else:
                h = _relu(ref.bn(out, f"{name}_bn1"))
            h = _relu(ref.bn(ref.conv(h, f"{name}_conv1", s), f"{name}_bn2"))
            h = ref.conv(h, f"{name}_conv2", 1)
            out = (out if equal else ref.conv(out, f"{name}_shortcut", s)) + h
            in_planes = planes
    return ref.fc(_relu(ref.bn(out, "bn_final")))


def _resnext_reference(model, x, depth, cardinality, widen):
    """torch's ResNeXt.forward / ResNeXtBottleneck.forward."""
    ref, blocks = _Reference(model), (depth - 2) // 9
    out = _relu(ref.bn(ref.conv(x, "conv1", 1), "bn1"))
    in_channels = 64
    for stage, (channels, stride) in enumerate(((64 * widen, 1), (128 * widen, 2),
                                                (256 * widen, 2)), start=1):
        for i in range(blocks):
            name, s = f"stage{stage}_{i}", stride if i == 0 else 1
            h = _relu(ref.bn(ref.conv(out, f"{name}_reduce", 1), f"{name}_reduce_bn"))
            h = _relu(ref.bn(ref.conv(h, f"{name}_grouped", s, cardinality),
                             f"{name}_grouped_bn"))
            h = ref.bn(ref.conv(h, f"{name}_expand", 1), f"{name}_expand_bn")
            residual = out
            if in_channels != channels:
                residual = ref.bn(ref.conv(out, f"{name}_shortcut", s), f"{name}_shortcut_bn")
            out = _relu(residual + h)
            in_channels = channels
    return ref.fc(out)


def _randomise_batch_norms(model, seed):
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if layer.__class__.__name__ == "BatchNormalization":
            n = layer.get_weights()[0].shape[0]
            layer.set_weights([rng.uniform(0.5, 1.5, n), rng.normal(0, 0.1, n),
                               rng.normal(0, 0.1, n), rng.uniform(0.5, 2.0, n)])


def _images(n, seed):
    return np.random.default_rng(seed).uniform(-1, 1, (n, 28, 28, 1)).astype(np.float32)


def _agree(model, reference):
    x = _images(2, 0)
    got = model(x, training=False).numpy()
    want = reference(x.astype(np.float64))
    assert np.max(np.abs(want)) > 0.1                # not a degenerate comparison
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.max(np.abs(want)))


# ------------------------------------------------------------------ the networks

def test_the_wide_resnet_computes_the_torch_modules_forward_pass():
    """WRN-16-2: the first block of stage 1 widens (shortcut from the activated input),
    the second keeps the width (identity shortcut from the raw input)."""
    model = networks.build_wide_resnet((28, 28, 1), 10, depth=16, widen=2, seed=4)
    _randomise_batch_norms(model, 1)
    _agree(model, lambda x: _wrn_reference(model, x, 16, 2))


def test_the_resnext_computes_the_torch_modules_forward_pass():
    """ResNeXt-20 (4 x 64d, widening 2): grouped 3x3 convolutions, strided shortcuts."""
    model = networks.build_resnext((28, 28, 1), 10, depth=20, cardinality=4, widen=2, seed=5)
    _randomise_batch_norms(model, 2)
    _agree(model, lambda x: _resnext_reference(model, x, 20, 4, 2))


def test_a_wrong_topology_would_fail_the_reference_check():
    """The check can fail: the reference with the shortcut taken from the raw input where
    the width changes (a post-activation WRN) disagrees with the model."""
    model = networks.build_wide_resnet((28, 28, 1), 10, depth=10, widen=2, seed=6)
    _randomise_batch_norms(model, 3)
    ref = _Reference(model)

    def wrong(x):
        out = ref.conv(x, "conv1", 1)
        for stage, (planes, stride) in enumerate(((32, 1), (64, 2), (128, 2)), start=1):
            name = f"block{stage}_0"
            h = _relu(ref.bn(out, f"{name}_bn1"))
            h = _relu(ref.bn(ref.conv(h, f"{name}_conv1", stride), f"{name}_bn2"))
            out = ref.conv(out, f"{name}_shortcut", stride) + ref.conv(h, f"{name}_conv2", 1)
        return ref.fc(_relu(ref.bn(out, "bn_final")))
    with pytest.raises(AssertionError):
        _agree(model, wrong)
    _agree(model, lambda x: _wrn_reference(model, x, 10, 2))


def test_the_sizes_are_the_published_ones():
    """WRN-40-4 has 8.9M parameters (Zagoruyko and Komodakis, 2016, Table 4) and
    ResNeXt-29 (8x64d) 34.4M (Xie et al., 2017, Table 7), both for CIFAR's 32x32x3;
    on 28x28x1 the forward pass is 2 x the multiply-adds counted here."""
    wrn = networks.build_wide_resnet((32, 32, 3), 10, seed=0)
    resnext = networks.build_resnext((32, 32, 3), 10, seed=0)
    def count(model):
        return sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert count(wrn) == pytest.approx(8.9e6, rel=0.01)
    assert count(resnext) == pytest.approx(34.4e6, rel=0.01)
    assert wrn.name == "wrn40-4" and resnext.name == "resnext29-8x64d"
    small = networks.build_wide_resnet((28, 28, 1), 10, depth=10, widen=1, seed=0)
    macs = (28 * 28 * 9 * 16 + 28 * 28 * 9 * 16 * 16 * 2             # stem, stage 1
            + 14 * 14 * 9 * (16 * 32 + 32 * 32) + 14 * 14 * 16 * 32   # stage 2 + shortcut
            + 7 * 7 * 9 * (32 * 64 + 64 * 64) + 7 * 7 * 32 * 64       # stage 3 + shortcut
            + 64 * 10)
    assert networks.forward_gflop(small) == pytest.approx(2 * macs / 1e9, rel=1e-12)


def test_initialisation_is_theirs_with_one_key_per_layer():
    wrn = networks.build_wide_resnet((28, 28, 1), 10, depth=16, widen=4, seed=7)
    resnext = networks.build_resnext((28, 28, 1), 10, depth=11, cardinality=8, widen=4,
                                     seed=7)
    # He-normal over the fan-out: a 3x3 kernel of `out` filters has sd sqrt(2 / (9 out));
    # a grouped kernel counts all its output channels. Each has >= 147,000 draws, so the
    # sample sd is within 2% of it.
    for kernel, out in ((wrn.get_layer("block3_1_conv1").kernel, 256),
                        (resnext.get_layer("stage1_0_grouped").kernel, 512)):
        assert abs(np.std(kernel.numpy()) / np.sqrt(2 / (9 * out)) - 1) < 0.02
    assert resnext.get_layer("stage1_0_grouped").kernel.shape == (3, 3, 64, 512)
    # Final layers: the WRN's U(+-1/sqrt(256)) with a zero bias; the ResNeXt's
    # N(0, 2/1024) with a zero bias (10,240 draws: sd within 5%).
    kernel, bias = (w.numpy() for w in wrn.get_layer("fc").weights)
    assert np.abs(kernel).max() <= 1 / 16 and np.abs(kernel).max() > 0.9 / 16
    assert not bias.any()
    kernel, bias = (w.numpy() for w in resnext.get_layer("fc").weights)
    assert abs(kernel.std() / np.sqrt(2 / 1024) - 1) < 0.05 and not bias.any()
    for model in (wrn, resnext):
        for layer in model.layers:
            if layer.__class__.__name__ == "BatchNormalization":
                assert (layer.gamma.numpy() == 1).all() and not layer.beta.numpy().any()
    # One key per layer: same-shaped layers differ; the same seed rebuilds the same net.
    assert not np.allclose(wrn.get_layer("block3_1_conv1").kernel.numpy(),
                           wrn.get_layer("block3_1_conv2").kernel.numpy())
    again = networks.build_wide_resnet((28, 28, 1), 10, depth=16, widen=4, seed=7)
    for x, y in zip(wrn.weights, again.weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    other = networks.build_wide_resnet((28, 28, 1), 10, depth=16, widen=4, seed=8)
    assert not np.allclose(wrn.get_layer("conv1").kernel.numpy(),
                           other.get_layer("conv1").kernel.numpy())


def test_the_wrn_drops_out_in_training_only_with_its_own_seeds():
    model = networks.build_wide_resnet((28, 28, 1), 10, depth=16, widen=1, seed=3)
    drops = [layer for layer in model.layers if layer.__class__.__name__ == "Dropout"]
    assert len(drops) == 6 and all(layer.rate == 0.3 for layer in drops)
    assert len({layer.seed for layer in drops}) == 6
    x = _images(4, 1)
    np.testing.assert_array_equal(model(x, training=False).numpy(),
                                  model(x, training=False).numpy())
    assert not np.allclose(model(x, training=True).numpy(), model(x, training=True).numpy())
    plain = networks.build_wide_resnet((28, 28, 1), 10, depth=16, widen=1, dropout=0.0,
                                       seed=3)
    assert not any(layer.__class__.__name__ == "Dropout" for layer in plain.layers)


def test_the_wrn_drops_out_between_its_blocks_two_convolutions():
    """Dropout sits after relu(bn2(conv1(.))) and before conv2, in every block (torch's
    BasicBlock.forward), which the inference-mode reference cannot see."""
    model = networks.build_wide_resnet((28, 28, 1), 10, depth=16, widen=1, seed=3)
    for stage in (1, 2, 3):
        for block in (0, 1):
            name = f"block{stage}_{block}"
            drop = model.get_layer(f"{name}_drop")
            relu = drop.input._keras_history.operation
            assert relu.__class__.__name__ == "ReLU"
            assert relu.input._keras_history.operation is model.get_layer(f"{name}_bn2")
            assert model.get_layer(f"{name}_bn2").input._keras_history.operation is \
                model.get_layer(f"{name}_conv1")
            assert model.get_layer(f"{name}_conv2_pad").input is drop.output


@pytest.mark.parametrize("call, message", [
    (lambda: networks.build_wide_resnet((28, 28, 1), 10, depth=41, seed=0), "6n\\+4.*41"),
    (lambda: networks.build_wide_resnet((28, 28, 1), 10, widen=0, seed=0), "widening.*0"),
    (lambda: networks.build_wide_resnet((28, 28, 1), 10, dropout=1.0, seed=0), "dropout.*1.0"),
    (lambda: networks.build_wide_resnet((28, 28, 1), 10, dropout=True, seed=0),
     "dropout.*True"),
    (lambda: networks.build_resnext((28, 28, 1), 10, depth=28, seed=0), "9n\\+2.*28"),
    (lambda: networks.build_resnext((28, 28, 1), 10, cardinality=0, seed=0),
     "cardinality.*0"),
    (lambda: networks.build_resnet((28, 28, 1), 10, depth=2, seed=0), "6n\\+2.*2"),
])
def test_bad_architectures_are_refused_by_value(call, message):
    with pytest.raises(EvaluationError, match=message):
        call()


# ------------------------------------------------------------------ the protocol

ALL_THREE = dpimagebench.DPImageBenchProtocol(
    classifiers=("resnet", "wrn", "resnext"), resnet_depth=8, wrn_depth=10, wrn_widen=1,
    resnext_depth=11, resnext_cardinality=2, resnext_widen=1, generated_samples=100,
    train_samples=80, epochs=1, batch_size=40)


def test_the_protocol_reports_the_mean_of_all_three_classifiers(tmp_path):
    """Run first with the ResNet alone, then with all three: the ResNet's saved state
    serves the second call (its resume key is its own settings, not the list's)."""
    synthetic, validation, test = band_images(100, 0), band_images(20, 1), band_images(20, 2)
    prefix = str(tmp_path / "run")
    alone = dpimagebench.run_dpimagebench(
        synthetic, test, dataclasses.replace(ALL_THREE, classifiers=("resnet",)), seed=0,
        validation=validation, state_prefix=prefix, log=lambda _: None)
    lines = []
    record = dpimagebench.run_dpimagebench(synthetic, test, ALL_THREE, seed=0,
                                           validation=validation, state_prefix=prefix,
                                           log=lines.append)
    assert "dpimagebench resnet8: resumed after epoch 1" in lines
    assert record["classifiers"]["resnet8"] == alone["classifiers"]["resnet8"]
    names = ["resnet8", "wrn10-1", "resnext11-2x64d-widen1"]
    assert list(record["classifiers"]) == names
    accuracies = [record["classifiers"][n]["accuracy"] for n in names]
    assert record["accuracy"] == pytest.approx(np.mean(accuracies), abs=1e-12)
    # Three different networks ran (their loss curves differ).
    assert len({tuple(record["classifiers"][n]["curves"]["loss"]) for n in names}) == 3
    for name in names:
        assert (tmp_path / f"run-{name}.npz").exists()
    assert not record["all_dpimagebench_classifiers"]     # tiny architectures
    settings = record["settings"]
    assert settings["wrn_depth"] == 10 and settings["resnext_cardinality"] == 2
    for name in names:
        assert name in record["description"]


def test_each_classifier_has_its_own_keys_and_the_resnet_keeps_its_old_ones():
    old = np.random.SeedSequence(11).generate_state(2, np.uint32) >> 1  # before WRN/ResNeXt
    np.testing.assert_array_equal(dpimagebench.classifier_seeds("resnet", 11), old)
    keys = {c: tuple(dpimagebench.classifier_seeds(c, 11)) for c in dpimagebench.CLASSIFIERS}
    assert len({k for pair in keys.values() for k in pair}) == 6
    theirs = dpimagebench.DPImageBenchProtocol(classifiers=("resnet", "wrn", "resnext"))
    assert theirs.classifier_settings("resnet") == dpimagebench.DPImageBenchProtocol().to_dict()
    assert theirs.classifier_settings("wrn") == dataclasses.replace(
        theirs, classifiers=("wrn",), resnet_depth=20).to_dict()


def test_the_protocol_names_and_checks_its_classifiers():
    theirs = dpimagebench.DPImageBenchProtocol(classifiers=("resnet", "wrn", "resnext"))
    assert theirs.runs_all_dpimagebench_classifiers and theirs.follows_dpimagebench
    assert [dpimagebench.classifier_name(theirs, c) for c in dpimagebench.CLASSIFIERS] == [
        "resnet110", "wrn40-4", "resnext29-8x64d"]
    assert dpimagebench.classifier_name(dataclasses.replace(
        theirs, wrn_dropout=0.0), "wrn") == "wrn40-4-drop0"
    assert dpimagebench.classifier_name(dataclasses.replace(
        theirs, resnext_widen=2), "resnext") == "resnext29-8x64d-widen2"
    assert not dataclasses.replace(theirs, wrn_widen=2).runs_all_dpimagebench_classifiers
    assert dataclasses.replace(theirs, wrn_widen=2).follows_dpimagebench  # named, not hidden
    assert not dataclasses.replace(theirs, epochs=10).follows_dpimagebench
    assert not dataclasses.replace(theirs, classifiers=("wrn", "resnext")
                                   ).runs_all_dpimagebench_classifiers
    keys = set(dpimagebench.DPImageBenchProtocol(classifiers=("wrn",)).to_dict())
    assert {"wrn_depth", "wrn_widen", "wrn_dropout"} <= keys
    assert not keys & {"resnet_depth", "resnext_depth", "resnext_cardinality"}
    with pytest.raises(EvaluationError, match="distinct.*'wrn', 'wrn'"):
        dpimagebench.DPImageBenchProtocol(classifiers=("wrn", "wrn"))
    with pytest.raises(EvaluationError, match="vgg"):
        dpimagebench.DPImageBenchProtocol(classifiers=("vgg",))
    with pytest.raises(EvaluationError, match="9n\\+2.*30"):
        dpimagebench.DPImageBenchProtocol(resnext_depth=30)


def test_the_cli_chooses_the_classifiers():
    from dclens.cli import evaluate as cli

    parser = cli.build_parser()
    args = parser.parse_args(["x", "--protocol", "dpimagebench",
                              "--dpimagebench_classifiers", "wrn", "resnext"])
    assert cli.settings_from_args(args, "fashion_mnist", "private").dpimagebench \
        .classifiers == ("wrn", "resnext")
    default = parser.parse_args(["x", "--protocol", "dpimagebench"])
    assert cli.settings_from_args(default, "fashion_mnist", "private").dpimagebench \
        .classifiers == ("resnet",)
    for depth in ("20", "110"):
        pointless = parser.parse_args(["x", "--protocol", "dpimagebench",
                                       "--dpimagebench_depth", depth,
                                       "--dpimagebench_classifiers", "wrn"])
        with pytest.raises(ValueError, match=f"--dpimagebench_depth {depth} .* no ResNet"):
            cli.settings_from_args(pointless, "fashion_mnist", "private")
    alone = parser.parse_args(["x", "--dpimagebench_classifiers", "wrn"])
    with pytest.raises(ValueError, match="need --protocol dpimagebench"):
        cli.settings_from_args(alone, "fashion_mnist")
    with pytest.raises(SystemExit):
        parser.parse_args(["x", "--protocol", "dpimagebench",
                           "--dpimagebench_classifiers", "vgg"])
