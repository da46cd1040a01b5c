"""All N teacher discriminators as stacked weights, trained and queried in chunks.

Every teacher has its own weights and its own Adam state (never shared: sharing Adam's
moments between teachers would make one teacher's update depend on another teacher's data
and break the one-teacher sensitivity of TopAgg).  They live in a :class:`TeacherBank`:
three float32 arrays [N, P] (weights, Adam's first and second moments; P parameters per
teacher) and the per-teacher Adam step counts.  The bank keeps them in RAM or in
memory-mapped ``.npy`` files, so only one chunk of teachers is ever materialised as
TensorFlow tensors.

:class:`TeacherEnsemble` is the math: the teacher discriminator of
:mod:`dclens.networks` evaluated for a chunk of T teachers at once, with a leading teacher
axis on weights and data.  Convolutions are im2col + batched matmul over the teacher axis;
batch normalisation always uses the statistics of the batch it is given, per teacher (as
in the authors' code, for training and for gradient queries).  Its results equal a plain
Keras discriminator with the same weights (tests/test_teachers.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Iterator, NamedTuple

import numpy as np
import tensorflow as tf

from dclens import networks

ADAM_BETA2 = 0.999
ADAM_EPSILON = 1e-8   # TF1's default, as in the authors' code


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """Where each named weight of one teacher sits in its flat parameter vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def for_shape(cls, shape: networks.ImageShape) -> "ParamLayout":
        entries = networks.discriminator_weight_shapes(shape)
        return cls(tuple(n for n, _ in entries), tuple(s for _, s in entries))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def split(self, flat: tf.Tensor) -> dict[str, tf.Tensor]:
        """[T, P] -> {name: [T, *shape]}."""
        parts = tf.split(flat, self.sizes, axis=1)
        return {name: tf.reshape(part, (-1, *shape))
                for name, shape, part in zip(self.names, self.shapes, parts)}

    def join(self, params: dict[str, tf.Tensor]) -> tf.Tensor:
        """{name: [T, *shape]} -> [T, P]."""
        return tf.concat([tf.reshape(params[name], (tf.shape(params[name])[0], -1))
                          for name in self.names], axis=1)


def initial_teacher_weights(layout: ParamLayout, num_teachers: int,
                            rng: np.random.Generator) -> np.ndarray:
    """[num_teachers, P] float32: DCGAN initialisation, independent for every teacher.

    Convolution kernels ~ N(0, 0.02) truncated at two standard deviations, dense kernels
    ~ N(0, 0.02), biases 0, batch-norm gamma 1 and beta 0.
    """
    columns = []
    for name, size in zip(layout.names, layout.sizes):
        if name.endswith("/kernel"):
            values = rng.standard_normal((num_teachers, size), dtype=np.float32)
            if name.startswith("conv"):
                outside = np.abs(values) > 2.0
                while outside.any():
                    values[outside] = rng.standard_normal(int(outside.sum()), dtype=np.float32)
                    outside = np.abs(values) > 2.0
            columns.append(values * np.float32(networks.INIT_STDDEV))
        elif name.endswith("/gamma"):
            columns.append(np.ones((num_teachers, size), np.float32))
        else:
            columns.append(np.zeros((num_teachers, size), np.float32))
    return np.concatenate(columns, axis=1)


class TeacherBank:
    """Weights and Adam state of N teachers, stored as [N, P] float32 arrays.

    ``directory=None`` keeps them in RAM; otherwise they are memory-mapped ``.npy`` files
    in ``directory`` (weights.npy, adam_m.npy, adam_v.npy, steps.npy), so a bank larger
    than memory is paged in one chunk at a time.
    """

    FILES = ("weights", "adam_m", "adam_v", "steps")

    def __init__(self, weights: np.ndarray, adam_m: np.ndarray, adam_v: np.ndarray,
                 steps: np.ndarray, layout: ParamLayout):
        n, p = weights.shape
        if p != layout.size or adam_m.shape != (n, p) or adam_v.shape != (n, p) \
                or steps.shape != (n,):
            raise ValueError(f"inconsistent teacher bank: weights {weights.shape}, adam_m "
                             f"{adam_m.shape}, adam_v {adam_v.shape}, steps {steps.shape}, "
                             f"layout size {layout.size}")
        self.weights, self.adam_m, self.adam_v, self.steps = weights, adam_m, adam_v, steps
        self.layout = layout

    @property
    def num_teachers(self) -> int:
        return self.weights.shape[0]

    @classmethod
    def create(cls, layout: ParamLayout, num_teachers: int, *, seed: int,
               directory: str | os.PathLike | None = None,
               init_chunk: int = 256) -> "TeacherBank":
        """A freshly initialised bank (teacher i's initial weights depend on (seed, i))."""
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be >= 1, got {num_teachers!r}")
        shape = (num_teachers, layout.size)
        arrays = {}
        for name in cls.FILES:
            dims = (num_teachers,) if name == "steps" else shape
            dtype = np.int64 if name == "steps" else np.float32
            if directory is None:
                arrays[name] = np.zeros(dims, dtype)
            else:
                os.makedirs(directory, exist_ok=True)
                arrays[name] = np.lib.format.open_memmap(
                    os.path.join(directory, f"{name}.npy"), mode="w+", dtype=dtype, shape=dims)
        seeds = np.random.SeedSequence(seed).spawn(math.ceil(num_teachers / init_chunk))
        for index, start in enumerate(range(0, num_teachers, init_chunk)):
            stop = min(start + init_chunk, num_teachers)
            arrays["weights"][start:stop] = initial_teacher_weights(
                layout, stop - start, np.random.default_rng(seeds[index]))
        return cls(arrays["weights"], arrays["adam_m"], arrays["adam_v"], arrays["steps"],
                   layout)

    def chunks(self, chunk_size: int) -> Iterator[tuple[int, int]]:
        """(start, stop) teacher ranges of at most chunk_size teachers."""
        if chunk_size < 1:
            raise ValueError(f"chunk size must be >= 1, got {chunk_size!r}")
        for start in range(0, self.num_teachers, chunk_size):
            yield start, min(start + chunk_size, self.num_teachers)

    def read(self, start: int, stop: int) -> "TeacherState":
        return TeacherState(tf.constant(self.weights[start:stop]),
                            tf.constant(self.adam_m[start:stop]),
                            tf.constant(self.adam_v[start:stop]),
                            tf.constant(self.steps[start:stop]))

    def write(self, start: int, stop: int, state: "TeacherState") -> None:
        self.weights[start:stop] = state.weights.numpy()
        self.adam_m[start:stop] = state.adam_m.numpy()
        self.adam_v[start:stop] = state.adam_v.numpy()
        self.steps[start:stop] = state.steps.numpy()

    def flush(self) -> None:
        for array in (self.weights, self.adam_m, self.adam_v, self.steps):
            if isinstance(array, np.memmap):
                array.flush()


class TeacherState(NamedTuple):
    """Weights and Adam state of a chunk of T teachers (tensors or arrays)."""

    weights: tf.Tensor   # [T, P]
    adam_m: tf.Tensor    # [T, P]
    adam_v: tf.Tensor    # [T, P]
    steps: tf.Tensor     # [T] int64, Adam steps taken


def _concat_label_maps(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """[T, B, H, W, C] ++ one-hot [T, B, K] broadcast to [T, B, H, W, K]."""
    shape = tf.shape(features)
    maps = tf.broadcast_to(labels[:, :, None, None, :],
                           tf.concat([shape[:4], tf.shape(labels)[2:]], axis=0))
    return tf.concat([features, maps], axis=-1)


def _conv5x5_stride2_same(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """Per-teacher 5x5 stride-2 'SAME' convolution as one grouped convolution.

    x [T, B, H, W, Cin], kernel [T, 5, 5, Cin, Cout], bias [T, Cout] -> [T, B, Ho, Wo, Cout]
    with Ho = ceil(H/2).  The teachers become T groups of channels: input channels
    [t*Cin, (t+1)*Cin) meet only output channels [t*Cout, (t+1)*Cout), so teacher t's
    output depends on teacher t's kernel alone.  (15x faster on CPU than im2col + batched
    matmul, measured on 50 teachers x 30 images of 28x28.)
    """
    _, _, h, w, c_in = x.shape          # static; the teacher and batch axes may be dynamic
    t, b = tf.shape(x)[0], tf.shape(x)[1]
    c_out = kernel.shape[-1]
    grouped_input = tf.reshape(tf.transpose(x, [1, 2, 3, 0, 4]), tf.stack([b, h, w, t * c_in]))
    grouped_kernel = tf.reshape(tf.transpose(kernel, [1, 2, 3, 0, 4]),
                                tf.stack([5, 5, c_in, t * c_out]))
    out = tf.nn.conv2d(grouped_input, grouped_kernel, strides=2, padding="SAME")
    ho, wo = -(-h // 2), -(-w // 2)
    out = tf.transpose(tf.reshape(out, tf.stack([b, ho, wo, t, c_out])), [3, 0, 1, 2, 4])
    return out + bias[:, None, None, None, :]


def _batch_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor) -> tf.Tensor:
    """Per-teacher batch normalisation with the batch's own statistics (axis 0 = teacher)."""
    axes = list(range(1, len(x.shape) - 1))
    mean, variance = tf.nn.moments(x, axes=axes, keepdims=True)
    expand = [slice(None)] + [None] * len(axes) + [slice(None)]
    return ((x - mean) * tf.math.rsqrt(variance + networks.BN_EPSILON) * gamma[tuple(expand)]
            + beta[tuple(expand)])


def _leaky_relu(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.leaky_relu(x, alpha=networks.LEAKY_SLOPE)


class TeacherEnsemble:
    """The teacher discriminator for a chunk of teachers at once (leading teacher axis).

    All methods are pure functions of their arguments: weights come in as a [T, P] tensor
    (a chunk read from a :class:`TeacherBank`) and new state goes out.

    Args:
      shape: image shape and number of classes.
      learning_rate, beta1: the teachers' Adam hyper-parameters (paper: 1e-3, 0.5).
    """

    def __init__(self, shape: networks.ImageShape, *, learning_rate: float, beta1: float):
        self.shape = shape
        self.layout = ParamLayout.for_shape(shape)
        self.learning_rate = float(learning_rate)
        self.beta1 = float(beta1)
        self._train = tf.function(self._train_steps, reduce_retracing=True)
        self._image_gradients = tf.function(self._image_gradients_impl, reduce_retracing=True)

    # ----------------------------------------------------------------- forward pass
    def logits(self, weights: tf.Tensor, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Discriminator logits [T, B] for images [T, B, H, W, C], one-hot labels [T, B, K]."""
        p = self.layout.split(weights)
        labels = tf.cast(labels, images.dtype)
        h = _concat_label_maps(images, labels)
        h = _leaky_relu(_conv5x5_stride2_same(h, p["conv0/kernel"], p["conv0/bias"]))
        h = _concat_label_maps(h, labels)
        h = _conv5x5_stride2_same(h, p["conv1/kernel"], p["conv1/bias"])
        h = _leaky_relu(_batch_norm(h, p["bn1/gamma"], p["bn1/beta"]))
        t, b = tf.shape(h)[0], tf.shape(h)[1]
        h = tf.concat([tf.reshape(h, (t, b, -1)), labels], axis=-1)
        h = tf.linalg.matmul(h, p["dense2/kernel"]) + p["dense2/bias"][:, None, :]
        h = _leaky_relu(_batch_norm(h, p["bn2/gamma"], p["bn2/beta"]))
        h = tf.concat([h, labels], axis=-1)
        logit = tf.linalg.matmul(h, p["dense3/kernel"]) + p["dense3/bias"][:, None, :]
        return logit[..., 0]

    def discriminator_loss(self, weights: tf.Tensor, real: tf.Tensor, real_labels: tf.Tensor,
                           fake: tf.Tensor, fake_labels: tf.Tensor) -> tf.Tensor:
        """Per-teacher GAN loss [T]: mean BCE(D(real), 1) + mean BCE(D(fake), 0).

        Real and fake batches go through the discriminator separately (each with its own
        batch-norm statistics), as in the authors' code.
        """
        real_logits = self.logits(weights, real, real_labels)
        fake_logits = self.logits(weights, fake, fake_labels)
        return (tf.reduce_mean(tf.nn.softplus(-real_logits), axis=1)
                + tf.reduce_mean(tf.nn.softplus(fake_logits), axis=1))

    # ----------------------------------------------------------------- training
    def _adam(self, state: TeacherState, grads: tf.Tensor) -> TeacherState:
        """One Adam step per teacher (Keras/TF formula, bias correction in the step size)."""
        steps = state.steps + 1
        t = tf.cast(steps, tf.float32)[:, None]
        alpha = self.learning_rate * tf.sqrt(1.0 - ADAM_BETA2 ** t) / (1.0 - self.beta1 ** t)
        m = state.adam_m + (grads - state.adam_m) * (1.0 - self.beta1)
        v = state.adam_v + (tf.square(grads) - state.adam_v) * (1.0 - ADAM_BETA2)
        weights = state.weights - alpha * m / (tf.sqrt(v) + ADAM_EPSILON)
        return TeacherState(weights, m, v, steps)

    def _train_steps(self, state: TeacherState, real: tf.Tensor, real_labels: tf.Tensor,
                     fake: tf.Tensor, fake_labels: tf.Tensor, num_steps: int):
        losses = tf.zeros([tf.shape(state.weights)[0]])
        for _ in range(num_steps):
            with tf.GradientTape() as tape:
                tape.watch(state.weights)
                losses = self.discriminator_loss(state.weights, real, real_labels,
                                                 fake, fake_labels)
                total = tf.reduce_sum(losses)
            grads = tape.gradient(total, state.weights)
            state = self._adam(state, grads)
        return state, losses

    def train(self, state: TeacherState, real: tf.Tensor, real_labels: tf.Tensor,
              fake: tf.Tensor, fake_labels: tf.Tensor, *, num_steps: int
              ) -> tuple[TeacherState, tf.Tensor]:
        """``num_steps`` Adam steps of every teacher on the same real and fake batches.

        Args:
          state: the chunk's weights and Adam state.
          real, fake: [T, B, H, W, C] images; real_labels, fake_labels: [T, B, K] one-hot.
        Returns:
          (new state, per-teacher loss [T] of the last step, before its update).
        Summing the teachers' losses before differentiating gives each teacher the gradient
        of its own loss: no parameter is shared between teachers.
        """
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps!r}")
        return self._train(TeacherState(*state), real, real_labels, fake, fake_labels,
                           num_steps)

    # ----------------------------------------------------------------- queries
    def _image_gradients_impl(self, weights: tf.Tensor, images: tf.Tensor,
                              labels: tf.Tensor) -> tf.Tensor:
        t = tf.shape(weights)[0]
        tiled = tf.tile(images[None], tf.stack([t, 1, 1, 1, 1]))
        tiled_labels = tf.tile(tf.cast(labels, images.dtype)[None], tf.stack([t, 1, 1]))
        with tf.GradientTape() as tape:
            tape.watch(tiled)
            logits = self.logits(weights, tiled, tiled_labels)
            generator_loss = tf.reduce_sum(tf.reduce_mean(tf.nn.softplus(-logits), axis=1))
        return -tape.gradient(generator_loss, tiled)

    def image_gradients(self, weights: tf.Tensor, images: tf.Tensor,
                        labels: tf.Tensor) -> tf.Tensor:
        """Every teacher's descent direction for the fake images: [T, B, H, W, C].

        g_i = -d/dx mean_b(-log D_i(x_b)), i.e. minus the gradient of the generator loss
        (BCE of D(x) against "real", averaged over the batch, as the authors do) with
        respect to each image, for the same fake batch ``images`` [B, H, W, C] with one-hot
        ``labels`` [B, K] shown to every teacher of the chunk.
        """
        return self._image_gradients(weights, images, labels)
