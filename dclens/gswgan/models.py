"""GS-WGAN's networks for 28x28x1 images, in Keras 3 (the released code's source/models.py).

* :class:`Generator` ("GeneratorResNet"): concat(z, onehot(y)) -> SN-dense to 4x4x(4m)
  -> ReLU -> pixel norm -> three up-sampling residual blocks (4 -> 8 -> 16 -> 32) ->
  SN-conv3x3 (VALID) to 30x30x1 -> sigmoid -> crop to 28x28.  Values in [0, 1], the
  range of dclens' real images.
* :class:`Discriminator` ("DiscriminatorDCGAN", a projection critic): three SN-conv5x5
  stride-2 layers with 2-pixel zero padding (28 -> 14 -> 7 -> 4; m, 2m, 4m channels,
  ReLU), flattened h; output ``dense(h) + <embed(y), h>``.  No batch norm (WGAN-GP).

m is ``model_dim`` (the paper's 64).  Every weight matrix is spectrally normalised with
one power iteration per training call (Miyato et al. 2018): W_sn = W / sigma_hat(W),
sigma_hat = u^T W v from a persistent u.  The u vectors are non-trainable weights, so
``get_weights()`` / ``set_weights()`` move a network's whole state.

Every layer draws its initial weights from its own seed (explicit randomness: one key
per draw), from the ``seeds`` mapping the caller derives from the run's seed tree.
"""

from __future__ import annotations

from typing import Mapping

import keras
import tensorflow as tf
from keras import layers

IMAGE_SHAPE = (28, 28, 1)
_EPS = 1e-12


def pixel_norm(x: tf.Tensor) -> tf.Tensor:
    """x / sqrt(mean over channels of x^2 + 1e-8) (ProGAN's pixel-wise feature norm)."""
    return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + 1e-8)


def _l2_normalize(x: tf.Tensor) -> tf.Tensor:
    return x / (tf.norm(x) + _EPS)


class _SpectralNorm:
    """Mixin: divides a [..., out] weight by its largest singular value, estimated by one
    power iteration per training call from a persistent (non-trainable) u of size out."""

    def _build_u(self, out: int, seed: int) -> None:
        self.u = self.add_weight(
            name="sn_u", shape=(out,), trainable=False,
            initializer=keras.initializers.RandomNormal(seed=seed))

    def normalized(self, weight: tf.Tensor, training: bool) -> tf.Tensor:
        matrix = tf.reshape(weight, (-1, weight.shape[-1]))          # [in, out]
        u = tf.convert_to_tensor(self.u)
        if training:
            v = tf.stop_gradient(_l2_normalize(tf.linalg.matvec(matrix, u)))
            u = tf.stop_gradient(_l2_normalize(tf.linalg.matvec(matrix, v, transpose_a=True)))
            self.u.assign(u)
        else:
            v = tf.stop_gradient(_l2_normalize(tf.linalg.matvec(matrix, u)))
        sigma = tf.tensordot(u, tf.linalg.matvec(matrix, v, transpose_a=True), 1)
        return weight / sigma


class SNDense(_SpectralNorm, layers.Layer):
    """Dense layer with a spectrally normalised kernel."""

    def __init__(self, units: int, *, seed: int, use_bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.units, self.seed, self.use_bias = units, seed, use_bias

    def build(self, input_shape) -> None:
        self.kernel = self.add_weight(
            name="kernel", shape=(int(input_shape[-1]), self.units),
            initializer=keras.initializers.GlorotUniform(seed=self.seed))
        self.bias = (self.add_weight(name="bias", shape=(self.units,), initializer="zeros")
                     if self.use_bias else None)
        self._build_u(self.units, self.seed + 1)

    def call(self, x, training=False):
        y = tf.matmul(x, self.normalized(self.kernel, training))
        return y + self.bias if self.bias is not None else y


class SNConv2D(_SpectralNorm, layers.Layer):
    """Conv2D (stride s, explicit symmetric zero padding p, then VALID), SN kernel:
    the output size is floor((H + 2p - k) / s) + 1, as PyTorch's Conv2d(padding=p)."""

    def __init__(self, filters: int, kernel: int, *, seed: int, stride: int = 1,
                 padding: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.filters, self.kernel_size, self.seed = filters, kernel, seed
        self.stride, self.padding = stride, padding

    def build(self, input_shape) -> None:
        k = self.kernel_size
        self.kernel = self.add_weight(
            name="kernel", shape=(k, k, int(input_shape[-1]), self.filters),
            initializer=keras.initializers.GlorotUniform(seed=self.seed))
        self.bias = self.add_weight(name="bias", shape=(self.filters,), initializer="zeros")
        self._build_u(self.filters, self.seed + 1)

    def call(self, x, training=False):
        if self.padding:
            p = self.padding
            x = tf.pad(x, [[0, 0], [p, p], [p, p], [0, 0]])
        y = tf.nn.conv2d(x, self.normalized(self.kernel, training), self.stride, "VALID")
        return y + self.bias


class SNEmbedding(_SpectralNorm, layers.Layer):
    """Class embedding [classes, dim] with the table spectrally normalised (as GS-WGAN's
    ``SpectralNorm(nn.Embedding)``: the power iteration runs on the [classes, dim] table)."""

    def __init__(self, classes: int, dim: int, *, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.classes, self.dim, self.seed = classes, dim, seed

    def build(self, input_shape) -> None:
        del input_shape
        self.table = self.add_weight(
            name="table", shape=(self.dim, self.classes),
            initializer=keras.initializers.RandomNormal(seed=self.seed))
        self._build_u(self.classes, self.seed + 1)

    def call(self, labels, training=False):
        table = self.normalized(self.table, training)                 # [dim, classes]
        return tf.gather(tf.transpose(table), tf.cast(labels, tf.int32))


def _upsample(x: tf.Tensor) -> tf.Tensor:
    return tf.repeat(tf.repeat(x, 2, axis=1), 2, axis=2)             # nearest, x2


class UpBlock(layers.Layer):
    """pixel_norm -> up x2 -> SN-conv3x3 -> ReLU(pixel_norm) -> SN-conv3x3, plus an
    SN-conv1x1 shortcut of the up-sampled input."""

    def __init__(self, channels: int, seeds: Mapping[str, int], prefix: str, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = SNConv2D(channels, 3, padding=1, seed=seeds[f"{prefix}_conv1"])
        self.conv2 = SNConv2D(channels, 3, padding=1, seed=seeds[f"{prefix}_conv2"])
        self.shortcut = SNConv2D(channels, 1, seed=seeds[f"{prefix}_shortcut"])

    def call(self, x, training=False):
        h = self.conv1(_upsample(pixel_norm(x)), training=training)
        h = self.conv2(tf.nn.relu(pixel_norm(h)), training=training)
        return h + self.shortcut(_upsample(x), training=training)


GENERATOR_LAYERS = ("fc", "block1_conv1", "block1_conv2", "block1_shortcut",
                    "block2_conv1", "block2_conv2", "block2_shortcut",
                    "block3_conv1", "block3_conv2", "block3_shortcut", "output")
DISCRIMINATOR_LAYERS = ("conv1", "conv2", "conv3", "linear", "embedding")


class Generator(keras.Model):
    """G(z, y) -> [B, 28, 28, 1] in [0, 1] (module docstring)."""

    def __init__(self, *, model_dim: int, z_dim: int, num_classes: int,
                 seeds: Mapping[str, int], **kwargs):
        super().__init__(**kwargs)
        self.model_dim, self.z_dim, self.num_classes = model_dim, z_dim, num_classes
        width = 4 * model_dim
        self.fc = SNDense(4 * 4 * width, seed=seeds["fc"])
        self.blocks = [UpBlock(width, seeds, f"block{i}", name=f"block{i}") for i in (1, 2, 3)]
        self.out = SNConv2D(1, 3, seed=seeds["output"])
        self.build_all()

    def build_all(self) -> None:
        self(tf.zeros((1, self.z_dim)), tf.zeros((1,), tf.int64))

    def call(self, z, labels, training=False):
        y = tf.one_hot(tf.cast(labels, tf.int32), self.num_classes, dtype=z.dtype)
        h = self.fc(tf.concat([z, y], axis=1), training=training)
        h = pixel_norm(tf.nn.relu(tf.reshape(h, (-1, 4, 4, 4 * self.model_dim))))
        for block in self.blocks:
            h = block(h, training=training)
        image = tf.sigmoid(self.out(h, training=training))              # [B, 30, 30, 1]
        return image[:, :28, :28, :]


class Discriminator(keras.Model):
    """D(x, y) -> [B] critic values (module docstring)."""

    def __init__(self, *, model_dim: int, num_classes: int, seeds: Mapping[str, int],
                 **kwargs):
        super().__init__(**kwargs)
        self.convs = [SNConv2D(model_dim * m, 5, stride=2, padding=2, seed=seeds[name])
                      for m, name in ((1, "conv1"), (2, "conv2"), (4, "conv3"))]
        self.linear = SNDense(1, seed=seeds["linear"])
        self.embedding = SNEmbedding(num_classes, 4 * 4 * 4 * model_dim,
                                     seed=seeds["embedding"])
        self(tf.zeros((1, *IMAGE_SHAPE)), tf.zeros((1,), tf.int64))

    def call(self, images, labels, training=False):
        h = images
        for conv in self.convs:
            h = tf.nn.relu(conv(h, training=training))
        h = tf.reshape(h, (tf.shape(h)[0], -1))
        projection = tf.reduce_sum(self.embedding(labels, training=training) * h, axis=1)
        return self.linear(h, training=training)[:, 0] + projection


def generator_macs(model_dim: int, z_dim: int = 10, num_classes: int = 10) -> int:
    """Multiply-accumulates of one generator forward pass for one image (convolutions and
    dense layers; element-wise work and the power iterations left out)."""
    width = 4 * model_dim
    macs = (z_dim + num_classes) * 16 * width
    for size in (8, 16, 32):
        macs += size * size * width * width * (2 * 9 + 1)      # two 3x3 convs + 1x1 shortcut
    return macs + 30 * 30 * 9 * width


def discriminator_macs(model_dim: int) -> int:
    """Multiply-accumulates of one discriminator forward pass for one image."""
    m = model_dim
    return (14 * 14 * 25 * m + 7 * 7 * 25 * m * 2 * m + 4 * 4 * 25 * 2 * m * 4 * m
            + 2 * 16 * 4 * m)


def warm_iteration_flops(model_dim: int, batch: int, critic_iters: int) -> float:
    """A stated model of one warm-start iteration's FLOPs (2 per MAC; a backward pass
    costs twice its forward): each critic step is a generator forward (fakes) plus the
    critic's forward and backward on real and fake batches and, for the gradient penalty,
    a forward, an input gradient and its double backward (~5 forwards); the generator
    step is a generator forward and backward plus the critic's forward and input
    gradient.  So 8 G + 58 D forwards per image at critic_iters = 5."""
    g, d = generator_macs(model_dim), discriminator_macs(model_dim)
    critic = g + (2 * 3 + 5) * d
    generator = 3 * g + 3 * d
    return 2.0 * batch * (critic_iters * critic + generator)
