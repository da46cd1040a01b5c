"""All N teacher discriminators as stacked weights, trained and queried in chunks.

Every teacher has its own weights and its own Adam state, laid out by :class:`ParamLayout`
and kept in the bank (:class:`dclens.datalens.teacher_bank.TeacherBank`, in RAM or on
disk), one chunk of teachers at a time materialised as a :class:`TeacherState`.

:class:`TeacherEnsemble` is the math: the teacher discriminator of
:mod:`dclens.datalens.networks` evaluated for a chunk of T teachers at once, with a leading teacher
axis on weights and data.  Convolutions are im2col + batched matmul over the teacher axis;
batch normalisation always uses the statistics of the batch it is given, per teacher (as
in the authors' code, for training and for gradient queries).  Its results equal a plain
Keras discriminator with the same weights (tests/test_teachers.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from dclens.datalens import networks
from dclens.datalens.config import GuidanceForm

ADAM_BETA2 = 0.999
ADAM_EPSILON = 1e-8   # TF1's default, as in the authors' code


def check_class_guidance(value: float) -> float:
    """``value`` as a float if it is a finite number >= 0, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        raise ValueError(f"class_guidance must be a finite number >= 0 (0: the paper's "
                         f"teachers; e.g. 1.0), got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """Where each named weight of one teacher sits in its flat parameter vector, for the
    discriminator of ``width``."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    width: networks.DiscriminatorWidth = networks.DiscriminatorWidth()

    @classmethod
    def for_shape(cls, shape: networks.ImageShape,
                  width: networks.DiscriminatorWidth = networks.DiscriminatorWidth()
                  ) -> "ParamLayout":
        entries = networks.discriminator_weight_shapes(shape, width)
        return cls(tuple(n for n, _ in entries), tuple(s for _, s in entries), width)

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
    """Per-teacher 5x5 stride-2 'SAME' convolution, literally one teacher at a time.

    x [T, B, H, W, Cin], kernel [T, 5, 5, Cin, Cout], bias [T, Cout] -> [T, B, Ho, Wo, Cout]
    with Ho = ceil(H/2).  ``tf.map_fn`` runs one ordinary ``tf.nn.conv2d`` per teacher, so
    teacher t's output depends on teacher t's kernel alone; the kernels it needs (and their
    gradients) exist on every CPU, with or without oneDNN.  This is the plain reference;
    the fast ensemble's convolutions are in :mod:`dclens.datalens.teacher_conv`.
    """
    out = tf.map_fn(lambda pair: tf.nn.conv2d(pair[0], pair[1], strides=2, padding="SAME"),
                    (x, kernel), fn_output_signature=x.dtype)
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


def class_guidance_loss(shifted_logits: tf.Tensor,
                        form: GuidanceForm = GuidanceForm.CROSS_ENTROPY) -> tf.Tensor:
    """The teachers' class term, per teacher [T], from logits [T, B, K] of D(x_b, (y_b + c)
    mod K) for every shift c (c = 0: the image's own label y_b).

    ``margin``: mean_b [mean_c D_i(x_b, c) - D_i(x_b, y_b)], linear in the logits, so the
    teachers' terms add up to the ensemble's: the sum over teachers of their gradients is
    exactly the gradient of the summed logits' margin, the classifier that is right on
    most records where single teachers are weak (:mod:`dclens.datalens.class_signal`).
    ``cross_entropy`` (below) weights each teacher's labels by its own softmax instead.

    A teacher's logits over the K labels of the same image, softmax-normalised, are a
    classifier: p_i(c | x) = exp D_i(x, c) / sum_c' exp D_i(x, c').  The term is its mean
    cross-entropy at the generator's label, mean_b [logsumexp_c D_i(x_b, c) - D_i(x_b, y_b)]:
    descending it moves the image towards what teacher i scores higher *with its label than
    with any other*, the class evidence the realism term -log D_i(x_b, y_b) barely carries
    (:class:`TeacherEnsemble`, ``class_guidance``).
    """
    pooled = (tf.reduce_mean(shifted_logits, axis=-1) if GuidanceForm(form) is
              GuidanceForm.MARGIN else tf.reduce_logsumexp(shifted_logits, axis=-1))
    return tf.reduce_mean(pooled - shifted_logits[..., 0], axis=1)


def guided_term(logits_under, logits: tf.Tensor, labels: tf.Tensor, num_classes: int,
                weight: float, form: GuidanceForm = GuidanceForm.CROSS_ENTROPY
                ) -> tf.Tensor:
    """weight * sum over teachers of :func:`class_guidance_loss` of ``form``, the logits
    under every label shift from ``logits_under(shifted labels)`` (``logits``: shift 0,
    already had)."""
    shifted = [logits] + [logits_under(shifted_labels(labels, c))
                          for c in range(1, num_classes)]
    return weight * tf.reduce_sum(class_guidance_loss(tf.stack(shifted, axis=-1), form))


def shifted_labels(labels: tf.Tensor, shift: int) -> tf.Tensor:
    """One-hot labels [..., K] of (y + shift) mod K: the same batch's label histogram
    moved round the classes, so each shift's batch-norm statistics see as many labels."""
    return tf.roll(labels, shift=shift, axis=-1)


class TeacherEnsemble:
    """The teacher discriminator for a chunk of teachers at once (leading teacher axis).

    All methods are pure functions of their arguments: weights come in as a [T, P] tensor
    (a chunk read from a :class:`TeacherBank`) and new state goes out.

    Args:
      shape: image shape and number of classes.
      learning_rate, beta1: the teachers' Adam hyper-parameters (paper: 1e-3, 0.5).
      class_guidance: lambda >= 0, the weight of :func:`class_guidance_loss` in the loss
        whose image gradient each teacher submits (0, the paper's: none; beyond the paper).
      class_guidance_form: which class term (:class:`GuidanceForm`).
      width: the discriminator's width (default the authors'; beyond the paper otherwise).
    """

    def __init__(self, shape: networks.ImageShape, *, learning_rate: float, beta1: float,
                 class_guidance: float = 0.0,
                 class_guidance_form: GuidanceForm | str = GuidanceForm.CROSS_ENTROPY,
                 width: networks.DiscriminatorWidth = networks.DiscriminatorWidth()):
        self.shape = shape
        self.layout = ParamLayout.for_shape(shape, width)
        self.learning_rate = float(learning_rate)
        self.beta1 = float(beta1)
        self.class_guidance = check_class_guidance(class_guidance)
        self.class_guidance_form = GuidanceForm(class_guidance_form)
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
            if self.class_guidance:
                generator_loss += guided_term(
                    lambda labels: self.logits(weights, tiled, labels), logits,
                    tiled_labels, self.shape.num_classes, self.class_guidance,
                    self.class_guidance_form)
        return -tape.gradient(generator_loss, tiled)

    def image_gradients(self, weights: tf.Tensor, images: tf.Tensor,
                        labels: tf.Tensor) -> tf.Tensor:
        """Every teacher's descent direction for the fake images: [T, B, H, W, C].

        g_i = -d/dx mean_b(-log D_i(x_b)), i.e. minus the gradient of the generator loss
        (BCE of D(x) against "real", averaged over the batch, as the authors do) with
        respect to each image, for the same fake batch ``images`` [B, H, W, C] with one-hot
        ``labels`` [B, K] shown to every teacher of the chunk.  With ``class_guidance``
        lambda > 0 the loss gains lambda * :func:`class_guidance_loss` (K forward passes,
        one per label shift).  Either way g_i is a function of teacher i's weights and
        the public fake batch only: TopAgg's bound on each teacher's vote holds as is.
        """
        return self._image_gradients(weights, images, labels)
