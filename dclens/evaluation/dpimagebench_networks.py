"""The three classifiers of DPImageBench's evaluator, as Keras models.

DPImageBench (Gong et al., CCS 2025; code 2019ChenGong/DPImageBench at 565f8d7,
``evaluation/classifier/{resnet,wrn,resnext}.py``, facts in docs/evaluation.md) scores
28x28 samples with the mean test accuracy of three networks, built for such images as:

* **ResNet-110**: He et al.'s CIFAR ResNet (6n+2 layers of BasicBlocks, 16-32-64 channels,
  post-activation, a strided 1x1 convolution with batch normalisation on a shortcut that
  changes shape).
* **WRN-40-4**: Zagoruyko and Komodakis' wide ResNet ((depth-4)/6 pre-activation
  BasicBlocks per stage, 16k-32k-64k channels for widening factor k, dropout 0.3 between a
  block's two convolutions; where a block changes the width, its shortcut is a strided 1x1
  convolution of the *activated* input; a final batch norm and ReLU before the pooling).
* **ResNeXt-29 (8x64d)**: Xie et al.'s CIFAR ResNeXt ((depth-2)/9 bottlenecks per stage,
  64-256-512-1024 channels for widening factor 4; each bottleneck is a 1x1 reduction to
  ``cardinality * out / widen`` channels, a 3x3 convolution in ``cardinality`` groups and a
  1x1 expansion, each followed by batch normalisation; a 1x1 convolution with batch
  normalisation on a shortcut that changes the width; no dropout -- their constructor
  takes a dropout rate and ignores it).

Every network maps images in [-1, 1] (NHWC) to logits.  Initialisation is theirs: every
convolution (no bias) draws N(0, 2 / (k * k * out)) (He-normal over the fan-out, which for
a grouped kernel counts all its output channels), batch normalisation starts at gamma 1,
beta 0; the final dense layer is torch's default for the ResNet (weights and bias
U(+-1 / sqrt(fan_in))), U(+-1 / sqrt(fan_in)) weights with a zero bias for the WRN, and
N(0, 2 / fan_in) weights with a zero bias for the ResNeXt.  Padding is explicit (one pixel
each side of a 3x3 kernel, as torch's), so a stride-2 convolution samples the same
positions as theirs.  Every layer that draws (initialisers, dropout) has its own seed,
derived from the ``seed`` argument.  Batch normalisation uses torch's epsilon 1e-5 and
momentum 0.1 (Keras' 0.9); Keras keeps the biased batch variance in its moving average.

The final pooling is global: theirs averages over ``img_size // 4`` pixels, which for
28x28 inputs (7x7 after two stride-2 stages) is the whole map.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from dclens.evaluation.synthetic_input import EvaluationError

BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9          # torch's momentum 0.1
#: The ResNeXt's bottleneck width per group is 64 channels whatever its widening factor
#: (``cardinality * 64 * widen / widen``).
RESNEXT_GROUP_WIDTH = 64


def check_resnet_depth(depth: int) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
        raise EvaluationError(f"the ResNet's depth must be 6n+2 with n >= 1 (8, 20, 32, "
                              f"44, 56, 110, ...), got {depth!r}")


def check_wrn(depth: int, widen: int, dropout: float) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
        raise EvaluationError(f"the WRN's depth must be 6n+4 with n >= 1 (10, 16, 28, 40, "
                              f"...), got {depth!r}")
    if isinstance(widen, bool) or not isinstance(widen, int) or widen < 1:
        raise EvaluationError(f"the WRN's widening factor must be an integer >= 1, got "
                              f"{widen!r}")
    if isinstance(dropout, bool) or not (isinstance(dropout, (int, float))
                                         and 0 <= dropout < 1):
        raise EvaluationError(f"the WRN's dropout rate must be in [0, 1), got {dropout!r}")


def check_resnext(depth: int, cardinality: int, widen: int) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 11 or (depth - 2) % 9:
        raise EvaluationError(f"the ResNeXt's depth must be 9n+2 with n >= 1 (11, 20, 29, "
                              f"...), got {depth!r}")
    for name, value in (("cardinality", cardinality), ("widening factor", widen)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise EvaluationError(f"the ResNeXt's {name} must be an integer >= 1, got "
                                  f"{value!r}")


class _Layers:
    """Layer factories that give every drawing layer its own seed."""

    def __init__(self, seed: int, draws: int):
        import keras
        self.keras, self.layers = keras, keras.layers
        self._keys: Iterator[np.uint32] = iter(
            np.random.SeedSequence(int(seed)).generate_state(draws, np.uint32) >> 1)

    def key(self) -> int:
        try:
            return int(next(self._keys))
        except StopIteration:                 # a builder miscounted its draws
            raise AssertionError("more seeded layers than keys drawn") from None

    def conv(self, h, filters: int, kernel: int, stride: int, name: str, groups: int = 1):
        """A bias-free convolution, torch's padding, He-normal over the fan-out."""
        init = self.keras.initializers.RandomNormal(
            stddev=math.sqrt(2.0 / (kernel * kernel * filters)), seed=self.key())
        if kernel > 1:
            h = self.layers.ZeroPadding2D(kernel // 2, name=f"{name}_pad")(h)
        return self.layers.Conv2D(filters, kernel, strides=stride, groups=groups,
                                  use_bias=False, kernel_initializer=init, name=name)(h)

    def norm(self, h, name: str):
        return self.layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM,
                                              name=name)(h)

    def relu(self, h):
        return self.layers.ReLU()(h)

    def projection(self, h, filters: int, stride: int, name: str):
        """A shortcut that changes the shape: strided 1x1 convolution, batch norm."""
        return self.norm(self.conv(h, filters, 1, stride, name), f"{name}_bn")

    def residual_sum(self, shortcut, branch):
        """relu(shortcut + branch), the post-activation blocks' output."""
        return self.relu(self.layers.Add()([shortcut, branch]))

    def dense(self, h, units: int, name: str, weights: str, zero_bias: bool):
        """The final layer: ``weights`` "uniform" (torch's default, +-1/sqrt(fan_in)) or
        "he_normal" (N(0, 2 / fan_in)); the bias torch's default or zero."""
        fan_in = int(h.shape[-1])
        bound = 1.0 / math.sqrt(fan_in)
        if weights == "uniform":
            kernel = self.keras.initializers.RandomUniform(-bound, bound, seed=self.key())
        else:
            kernel = self.keras.initializers.RandomNormal(stddev=math.sqrt(2.0 / fan_in),
                                                          seed=self.key())
        bias = ("zeros" if zero_bias else
                self.keras.initializers.RandomUniform(-bound, bound, seed=self.key()))
        return self.layers.Dense(units, name=name, kernel_initializer=kernel,
                                 bias_initializer=bias)(h)


def build_resnet(image_shape: tuple[int, int, int], num_classes: int, *, depth: int,
                 seed: int):
    """DPImageBench's ResNet (``depth`` = 6n+2; theirs 110)."""
    import keras

    check_resnet_depth(depth)
    blocks = (depth - 2) // 6
    make = _Layers(seed, 6 * blocks + 8)
    image = keras.Input(tuple(image_shape), name="image")
    h = make.relu(make.norm(make.conv(image, 16, 3, 1, "conv1"), "bn1"))
    channels = 16
    for stage, filters in enumerate((16, 32, 64), start=1):
        for block in range(blocks):
            stride = 2 if stage > 1 and block == 0 else 1
            name = f"layer{stage}_{block}"
            out = make.relu(make.norm(make.conv(h, filters, 3, stride, f"{name}_conv1"),
                                      f"{name}_bn1"))
            out = make.norm(make.conv(out, filters, 3, 1, f"{name}_conv2"), f"{name}_bn2")
            if stride != 1 or channels != filters:
                h = make.projection(h, filters, stride, f"{name}_down")
            h = make.residual_sum(out, h)
            channels = filters
    h = keras.layers.GlobalAveragePooling2D()(h)
    logits = make.dense(h, num_classes, "fc", "uniform", zero_bias=False)
    return keras.Model(image, logits, name=f"resnet{depth}")


def build_wide_resnet(image_shape: tuple[int, int, int], num_classes: int, *,
                      depth: int = 40, widen: int = 4, dropout: float = 0.3, seed: int):
    """DPImageBench's WRN-``depth``-``widen`` (theirs for 28x28 images: 40, 4, dropout
    0.3)."""
    import keras

    check_wrn(depth, widen, dropout)
    blocks = (depth - 4) // 6
    make = _Layers(seed, 1 + 3 * (3 * blocks + 1) + 2)
    image = keras.Input(tuple(image_shape), name="image")
    h = make.conv(image, 16, 3, 1, "conv1")
    channels = 16
    for stage, (filters, stride) in enumerate(((16 * widen, 1), (32 * widen, 2),
                                               (64 * widen, 2)), start=1):
        for block in range(blocks):
            name = f"block{stage}_{block}"
            step = stride if block == 0 else 1
            activated = make.relu(make.norm(h, f"{name}_bn1"))
            out = make.conv(activated, filters, 3, step, f"{name}_conv1")
            out = make.relu(make.norm(out, f"{name}_bn2"))
            if dropout > 0:
                out = keras.layers.Dropout(dropout, seed=make.key(), name=f"{name}_drop")(out)
            out = make.conv(out, filters, 3, 1, f"{name}_conv2")
            if channels == filters:
                shortcut = h
            else:
                shortcut = make.conv(activated, filters, 1, step, f"{name}_shortcut")
            h = keras.layers.Add()([shortcut, out])
            channels = filters
    h = make.relu(make.norm(h, "bn_final"))
    h = keras.layers.GlobalAveragePooling2D()(h)
    logits = make.dense(h, num_classes, "fc", "uniform", zero_bias=True)
    return keras.Model(image, logits, name=f"wrn{depth}-{widen}")


def build_resnext(image_shape: tuple[int, int, int], num_classes: int, *,
                  depth: int = 29, cardinality: int = 8, widen: int = 4, seed: int):
    """DPImageBench's ResNeXt-``depth`` (``cardinality`` x 64d; theirs 29, 8, widening
    factor 4)."""
    import keras

    check_resnext(depth, cardinality, widen)
    blocks = (depth - 2) // 9
    make = _Layers(seed, 1 + 3 * (3 * blocks + 1) + 1)
    image = keras.Input(tuple(image_shape), name="image")
    h = make.relu(make.norm(make.conv(image, 64, 3, 1, "conv1"), "bn1"))
    channels = 64
    for stage, (filters, stride) in enumerate(((64 * widen, 1), (128 * widen, 2),
                                               (256 * widen, 2)), start=1):
        width = cardinality * filters // widen
        for block in range(blocks):
            name = f"stage{stage}_{block}"
            step = stride if block == 0 else 1
            out = make.relu(make.norm(make.conv(h, width, 1, 1, f"{name}_reduce"),
                                      f"{name}_reduce_bn"))
            out = make.relu(make.norm(make.conv(out, width, 3, step, f"{name}_grouped",
                                                groups=cardinality), f"{name}_grouped_bn"))
            out = make.norm(make.conv(out, filters, 1, 1, f"{name}_expand"),
                            f"{name}_expand_bn")
            if channels != filters:
                h = make.projection(h, filters, step, f"{name}_shortcut")
            h = make.residual_sum(h, out)
            channels = filters
    h = keras.layers.GlobalAveragePooling2D()(h)
    logits = make.dense(h, num_classes, "fc", "he_normal", zero_bias=True)
    return keras.Model(image, logits,
                       name=f"resnext{depth}-{cardinality}x{RESNEXT_GROUP_WIDTH}d")


def forward_gflop(model) -> float:
    """GFLOP of one image's forward pass through ``model``'s convolutions and dense
    layers (2 x multiply-adds; a grouped kernel's shape already counts its groups)."""
    total = 0
    for layer in model.layers:
        if layer.__class__.__name__ == "Conv2D":
            height, width = layer.output.shape[1:3]
            total += height * width * int(np.prod(layer.kernel.shape))
        elif layer.__class__.__name__ == "Dense":
            total += int(np.prod(layer.kernel.shape))
    return 2 * total / 1e9
