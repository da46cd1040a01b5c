"""The teacher ensemble's fast path: same math as :class:`dclens.datalens.teachers.TeacherEnsemble`.

Four exact rewrites (no approximation; results equal the reference within float32
round-off, tests/test_fast_paths.py):

1. **Label maps folded out of the convolutions.**  The discriminator concatenates K
   constant one-hot maps to the input of each 5x5/2 convolution.  Splitting the kernel into
   its image part W_x and label part W_y,

       conv(concat(x, y-maps), W) = conv(x, W_x) + sum_k y_k * M_k,
       M_k[p, o] = sum_{taps (dy, dx) of output p inside the image} W_y[dy, dx, k, o],

   i.e. M = V @ W_y with V [Ho*Wo, 25] the 0/1 mask of the taps that fall inside the image
   ("SAME" zero padding).  M is computed once per teacher, not per image; the convolutions
   shrink from C+K to C input channels (28x28x1: 11 -> 1 and 21 -> 11), about half of all
   multiply-adds of the teacher.
2. **Grouped layout.**  Activations stay in the layout [B, H, W, T*C] (teacher t owns
   channels [t*C, (t+1)*C)), so the convolutions need no transposes; only the flatten
   before the first dense layer changes layout.  The convolutions themselves run on the
   path :mod:`dclens.datalens.teacher_conv` picks for this CPU (one grouped convolution, whose
   gradient TF has only with oneDNN, or one ordinary convolution per teacher).
3. **Real and fake batches in one pass.**  Both batches go through every layer together
   (2B images); batch normalisation still takes its statistics over each batch separately
   (``groups=2``), so every output equals the two separate passes of the reference.
4. **Fused Adam.**  The teachers' weights and moments live in three [T, P] variables and
   are updated in place by TF's fused ``ResourceApplyAdam`` kernel (one pass over memory
   instead of about ten), which computes the reference formula
   alpha_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t), m += (g - m)(1 - beta1),
   v += (g^2 - v)(1 - beta2), w -= alpha_t * m / (sqrt(v) + eps).  It needs one step count
   for the whole chunk (always true in a run); mixed counts fall back to the tensor formula.

Measured effects (scripts/bench.py, docs/performance.md) decide what is kept here.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from dclens.datalens import networks, teacher_conv, teacher_op
from dclens.datalens.config import ConvPath
from dclens.datalens.teachers import (ADAM_BETA2, ADAM_EPSILON, ParamLayout, TeacherState,
                                      GuidanceForm, check_class_guidance, guided_term)

KERNEL = teacher_conv.KERNEL
TAPS = KERNEL * KERNEL


def same_padding_taps(height: int, width: int) -> np.ndarray:
    """V [Ho*Wo, 25]: 1 where tap (dy, dx) of output p reads inside the image, else 0.

    For a 5x5 stride-2 'SAME' convolution of an H x W input (TF's padding rule); computed
    by convolving an all-ones image with the 25 one-hot kernels, so it follows TF exactly.
    """
    ones = tf.ones((1, height, width, 1), tf.float32)
    eye = tf.reshape(tf.eye(TAPS, dtype=tf.float32), (KERNEL, KERNEL, 1, TAPS))
    taps = tf.nn.conv2d(ones, eye, strides=2, padding="SAME")
    return tf.reshape(taps, (-1, TAPS)).numpy()


def _label_term(taps: tf.Tensor, kernel_y: tf.Tensor, labels: tf.Tensor,
                out_hw: tuple[int, int]) -> tf.Tensor:
    """sum_k y_k M_k in grouped layout [B, Ho, Wo, T*Cout].

    taps V [P, 25]; kernel_y [T, 5, 5, K, Cout]; labels [T, B, K] (one batch per teacher)
    or [B, K] (the same batch for every teacher).
    """
    t, k, c_out = tf.shape(kernel_y)[0], kernel_y.shape[3], kernel_y.shape[4]
    positions = taps.shape[0]
    # M[t, p, k, o] = sum_q V[p, q] W_y[t, q, k, o]  (one matmul, V broadcast over t)
    folded = tf.linalg.matmul(taps, tf.reshape(kernel_y, (-1, TAPS, k * c_out)))
    folded = tf.transpose(tf.reshape(folded, (-1, positions, k, c_out)), [0, 2, 1, 3])
    if labels.shape.rank == 2:
        # [B, K] @ [K, P*T*Cout]
        flat = tf.reshape(tf.transpose(folded, [1, 2, 0, 3]), (k, -1))
        out = tf.linalg.matmul(labels, flat)
    else:
        # per teacher [B, K] @ [K, P*Cout], then teacher axis into the channels
        out = tf.linalg.matmul(labels, tf.reshape(folded, (t, k, positions * c_out)))
        b = tf.shape(labels)[1]
        out = tf.transpose(tf.reshape(out, (t, b, positions, c_out)), [1, 2, 0, 3])
    return tf.reshape(out, (-1, out_hw[0], out_hw[1], t * c_out))


def _grouped_batch_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor,
                        groups: int) -> tf.Tensor:
    """Batch norm of x [B, ..., T*C] with statistics over each of ``groups`` equal slices
    of the batch axis (and all spatial axes), per channel; gamma, beta [T, C]."""
    shape = tf.shape(x)
    split = tf.reshape(x, tf.concat([[groups, -1], shape[1:]], axis=0))
    axes = list(range(1, x.shape.rank))
    mean, variance = tf.nn.moments(split, axes=axes, keepdims=True)
    scale = tf.reshape(gamma, [-1]) * tf.math.rsqrt(variance + networks.BN_EPSILON)
    out = (split - mean) * scale + tf.reshape(beta, [-1])
    return tf.reshape(out, shape)


def _batch_norm_teacher_axis(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor,
                             groups: int) -> tf.Tensor:
    """Batch norm of x [T, B, F] over each of ``groups`` slices of B; gamma, beta [T, F]."""
    shape = tf.shape(x)
    split = tf.reshape(x, tf.concat([shape[:1], [groups, -1], shape[2:]], axis=0))
    mean, variance = tf.nn.moments(split, axes=[2], keepdims=True)
    out = ((split - mean) * tf.math.rsqrt(variance + networks.BN_EPSILON)
           * gamma[:, None, None, :] + beta[:, None, None, :])
    return tf.reshape(out, shape)


def _leaky_relu(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.leaky_relu(x, alpha=networks.LEAKY_SLOPE)


def _merged_batch(real, real_labels, fake, fake_labels) -> tuple[np.ndarray, np.ndarray]:
    """The fused step's input: images [T, 2B, H, W, C] (real then fake) and class indices
    int32 [T, 2B] from one-hot labels."""
    images = np.concatenate([np.asarray(real, np.float32), np.asarray(fake, np.float32)],
                            axis=1)
    labels = np.concatenate([np.argmax(np.asarray(real_labels), axis=-1),
                             np.argmax(np.asarray(fake_labels), axis=-1)], axis=1)
    return images, labels.astype(np.int32)


class _ChunkVariables:
    """Weights and Adam moments of a chunk of T teachers as three [T, P] variables."""

    def __init__(self, num_teachers: int, size: int):
        zeros = tf.zeros((num_teachers, size), tf.float32)
        self.weights = tf.Variable(zeros, trainable=False)
        self.adam_m = tf.Variable(zeros, trainable=False)
        self.adam_v = tf.Variable(zeros, trainable=False)


class FastTeacherEnsemble:
    """Drop-in for :class:`dclens.datalens.teachers.TeacherEnsemble` (same results, faster on CPU).

    Args:
      shape: image shape and number of classes.
      learning_rate, beta1: the teachers' Adam hyper-parameters (paper: 1e-3, 0.5).
      conv_path: how the convolutions run (:mod:`dclens.datalens.teacher_conv`): ``"auto"`` (the
        fastest path that works on this CPU), ``"grouped"`` or ``"per_teacher"``.
      class_guidance: as the reference's (its image gradients then run on the TF graph
        path even where the fused op trains the teachers: the op has no class term).
      width: the discriminator's width, as the reference's (the fused op takes any).
    """

    def __init__(self, shape: networks.ImageShape, *, learning_rate: float, beta1: float,
                 conv_path: str | ConvPath = "auto", class_guidance: float = 0.0,
                 class_guidance_form: GuidanceForm | str = GuidanceForm.CROSS_ENTROPY,
                 width: networks.DiscriminatorWidth = networks.DiscriminatorWidth()):
        self.shape = shape
        self.class_guidance = check_class_guidance(class_guidance)
        self.class_guidance_form = GuidanceForm(class_guidance_form)
        self.conv_path = teacher_conv.resolve_conv_path(conv_path)
        # The TF-graph pieces (logits; the formula path of mixed step counts) of the fused
        # path run on the per-teacher convolutions.
        self._graph_conv_path = (ConvPath.PER_TEACHER if self.conv_path is ConvPath.FUSED
                                 else self.conv_path)
        self.layout = ParamLayout.for_shape(shape, width)
        self.learning_rate = float(learning_rate)
        self.beta1 = float(beta1)
        h1, w1 = -(-shape.height // 2), -(-shape.width // 2)
        self._hw = ((h1, w1), (-(-h1 // 2), -(-w1 // 2)))
        self._taps = (tf.constant(same_padding_taps(shape.height, shape.width)),
                      tf.constant(same_padding_taps(h1, w1)))
        self._variables: dict[int, _ChunkVariables] = {}
        # One trace per chunk size (the per-teacher path unrolls over the teachers).
        self._train_fused = tf.function(self._train_fused_impl)
        self._train_formula = tf.function(self._train_formula_impl)
        self._image_gradients = tf.function(self._image_gradients_impl)

    # ----------------------------------------------------------------- forward pass
    def grouped_logits(self, weights: tf.Tensor, images: tf.Tensor, labels: tf.Tensor,
                       groups: int) -> tf.Tensor:
        """Logits [T, B] of images in grouped layout [B, H, W, T*C].

        ``labels``: [T, B, K] one-hot per teacher, or [B, K] shared by all teachers.
        ``groups``: the batch is ``groups`` equal slices, each normalised with its own
        statistics (the reference's separate discriminator calls).
        """
        p = self.layout.split(weights)
        c, k = self.shape.channels, self.shape.num_classes
        labels = tf.cast(labels, tf.float32)
        (hw0, hw1), (taps0, taps1) = self._hw, self._taps
        # tf.split, not slicing: the gradient of a strided slice is slow on CPU
        kernel0_x, kernel0_y = tf.split(p["conv0/kernel"], [c, k], axis=3)
        c0 = kernel0_x.shape[-1]
        h = teacher_conv.conv5x5_stride2(images, kernel0_x, self._graph_conv_path)
        h = h + _label_term(taps0, kernel0_y, labels, hw0)
        h = _leaky_relu(h + tf.reshape(p["conv0/bias"], [-1]))
        kernel1_x, kernel1_y = tf.split(p["conv1/kernel"], [c0, k], axis=3)
        c1 = kernel1_x.shape[-1]
        h = teacher_conv.conv5x5_stride2(h, kernel1_x, self._graph_conv_path)
        h = h + _label_term(taps1, kernel1_y, labels, hw1)
        h = h + tf.reshape(p["conv1/bias"], [-1])
        h = _leaky_relu(_grouped_batch_norm(h, p["bn1/gamma"], p["bn1/beta"], groups))
        t, b = tf.shape(weights)[0], tf.shape(h)[0]
        # [B, Ho, Wo, T, C1] -> [T, B, Ho*Wo*C1] (the reference's flatten order)
        h = tf.reshape(h, (b, hw1[0], hw1[1], t, c1))
        h = tf.reshape(tf.transpose(h, [3, 0, 1, 2, 4]), (t, b, hw1[0] * hw1[1] * c1))
        if labels.shape.rank == 2:
            labels = tf.broadcast_to(labels[None], (t, b, k))
        h = tf.concat([h, labels], axis=-1)
        h = tf.linalg.matmul(h, p["dense2/kernel"]) + p["dense2/bias"][:, None, :]
        h = _leaky_relu(_batch_norm_teacher_axis(h, p["bn2/gamma"], p["bn2/beta"], groups))
        h = tf.concat([h, labels], axis=-1)
        logit = tf.linalg.matmul(h, p["dense3/kernel"]) + p["dense3/bias"][:, None, :]
        return logit[..., 0]

    @staticmethod
    def to_grouped(images: tf.Tensor) -> tf.Tensor:
        """[T, B, H, W, C] -> [B, H, W, T*C]."""
        shape = tf.shape(images)
        moved = tf.transpose(images, [1, 2, 3, 0, 4])
        return tf.reshape(moved, tf.stack([shape[1], shape[2], shape[3],
                                           shape[0] * shape[4]]))

    def logits(self, weights: tf.Tensor, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Same as the reference: images [T, B, H, W, C], labels [T, B, K] -> [T, B]."""
        return self.grouped_logits(weights, self.to_grouped(images), labels, groups=1)

    def _losses(self, weights: tf.Tensor, both: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Per-teacher loss [T] of a merged batch: first half real, second half fake."""
        logits = self.grouped_logits(weights, both, labels, groups=2)
        real, fake = tf.split(logits, 2, axis=1)
        return (tf.reduce_mean(tf.nn.softplus(-real), axis=1)
                + tf.reduce_mean(tf.nn.softplus(fake), axis=1))

    def _merge(self, real, real_labels, fake, fake_labels) -> tuple[tf.Tensor, tf.Tensor]:
        both = tf.concat([tf.convert_to_tensor(real, tf.float32),
                          tf.convert_to_tensor(fake, tf.float32)], axis=1)
        labels = tf.concat([tf.cast(real_labels, tf.float32),
                            tf.cast(fake_labels, tf.float32)], axis=1)
        return self.to_grouped(both), labels

    # ----------------------------------------------------------------- training
    def _grad(self, weights: tf.Tensor, both: tf.Tensor, labels: tf.Tensor
              ) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(weights)
            losses = self._losses(weights, both, labels)
            total = tf.reduce_sum(losses)
        return losses, tape.gradient(total, weights)

    def _train_fused_impl(self, variables: _ChunkVariables, both: tf.Tensor,
                          labels: tf.Tensor, first_step: tf.Tensor, num_steps: int
                          ) -> tf.Tensor:
        losses = tf.zeros([0])
        for i in range(num_steps):
            losses, grads = self._grad(variables.weights.read_value(), both, labels)
            t = tf.cast(first_step + i + 1, tf.float32)
            tf.raw_ops.ResourceApplyAdam(
                var=variables.weights.handle, m=variables.adam_m.handle,
                v=variables.adam_v.handle,
                beta1_power=tf.pow(tf.constant(self.beta1), t),
                beta2_power=tf.pow(tf.constant(ADAM_BETA2), t),
                lr=tf.constant(self.learning_rate), beta1=tf.constant(self.beta1),
                beta2=tf.constant(ADAM_BETA2), epsilon=tf.constant(ADAM_EPSILON),
                grad=grads)
        return losses

    def _train_formula_impl(self, state: TeacherState, both: tf.Tensor, labels: tf.Tensor,
                            num_steps: int) -> tuple[TeacherState, tf.Tensor]:
        losses = tf.zeros([0])
        for _ in range(num_steps):
            losses, grads = self._grad(state.weights, both, labels)
            steps = state.steps + 1
            t = tf.cast(steps, tf.float32)[:, None]
            alpha = self.learning_rate * tf.sqrt(1.0 - ADAM_BETA2 ** t) / (1.0 - self.beta1 ** t)
            m = state.adam_m + (grads - state.adam_m) * (1.0 - self.beta1)
            v = state.adam_v + (tf.square(grads) - state.adam_v) * (1.0 - ADAM_BETA2)
            state = TeacherState(state.weights - alpha * m / (tf.sqrt(v) + ADAM_EPSILON),
                                 m, v, steps)
        return state, losses

    def chunk_variables(self, num_teachers: int) -> _ChunkVariables:
        """The [T, P] variables used for chunks of ``num_teachers`` (created once)."""
        if num_teachers not in self._variables:
            self._variables[num_teachers] = _ChunkVariables(num_teachers, self.layout.size)
        return self._variables[num_teachers]

    def train(self, state: TeacherState, real, real_labels, fake, fake_labels, *,
              num_steps: int) -> tuple[TeacherState, tf.Tensor]:
        """``num_steps`` Adam steps per teacher, as :meth:`TeacherEnsemble.train`.

        Returns (new state, per-teacher loss [T] of the last step, before its update).  The
        returned weights/moments are snapshots (later calls do not change them).
        """
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps!r}")
        steps = np.asarray(state.steps, np.int64)
        same_count = bool(steps.size and np.all(steps == steps[0]))
        if same_count and self.conv_path is ConvPath.FUSED:
            images, labels = _merged_batch(real, real_labels, fake, fake_labels)
            weights, adam_m, adam_v, losses = teacher_op.train(
                state.weights, state.adam_m, state.adam_v, images, labels, int(steps[0]),
                shape=self.shape, width=self.layout.width, num_steps=num_steps,
                learning_rate=self.learning_rate, beta1=self.beta1, beta2=ADAM_BETA2,
                epsilon=ADAM_EPSILON)
            return TeacherState(weights, adam_m, adam_v, tf.constant(steps + num_steps)), losses
        both, labels = self._merge(real, real_labels, fake, fake_labels)
        if same_count:
            variables = self.chunk_variables(int(steps.size))
            variables.weights.assign(state.weights)
            variables.adam_m.assign(state.adam_m)
            variables.adam_v.assign(state.adam_v)
            losses = self._train_fused(variables, both, labels,
                                       tf.constant(int(steps[0]), tf.int64), num_steps)
            return TeacherState(variables.weights.read_value(), variables.adam_m.read_value(),
                                variables.adam_v.read_value(),
                                tf.constant(steps + num_steps)), losses
        state = TeacherState(*(tf.convert_to_tensor(x) for x in state))
        return self._train_formula(state, both, labels, num_steps)

    def can_train_in_place(self, state: TeacherState) -> bool:
        """Whether :meth:`train_in_place` takes this state: the fused path with its C
        library, numpy float32 arrays it may overwrite, and one Adam step count."""
        if self.conv_path is not ConvPath.FUSED or not teacher_op.capi_available():
            return False
        steps = np.asarray(state.steps)
        return (teacher_op.in_place_ready(state.weights, state.adam_m, state.adam_v)
                and steps.size > 0 and bool(np.all(steps == steps.flat[0])))

    def train_in_place(self, state: TeacherState, real, real_labels, fake, fake_labels, *,
                       num_steps: int) -> np.ndarray:
        """:meth:`train` that overwrites ``state``'s weights and moments with the result
        (no copy of the chunk's state; see :meth:`can_train_in_place`) and returns the
        per-teacher losses [T].  ``state.steps`` is left to the caller."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps!r}")
        if not self.can_train_in_place(state):
            raise ValueError("this state cannot be trained in place (fused path, writable "
                             "float32 numpy arrays and one step count needed)")
        images, labels = _merged_batch(real, real_labels, fake, fake_labels)
        return teacher_op.train_in_place(
            state.weights, state.adam_m, state.adam_v, images, labels,
            int(np.asarray(state.steps).flat[0]), shape=self.shape, width=self.layout.width,
            num_steps=num_steps, learning_rate=self.learning_rate, beta1=self.beta1,
            beta2=ADAM_BETA2, epsilon=ADAM_EPSILON)

    # ----------------------------------------------------------------- queries
    def _image_gradients_impl(self, weights: tf.Tensor, images: tf.Tensor,
                              labels: tf.Tensor) -> tf.Tensor:
        t = tf.shape(weights)[0]
        shape = tf.shape(images)
        tiled = tf.tile(images, tf.stack([1, 1, 1, t]))          # [B, H, W, T*C]
        with tf.GradientTape() as tape:
            tape.watch(tiled)
            logits = self.grouped_logits(weights, tiled, labels, groups=1)
            generator_loss = tf.reduce_sum(tf.reduce_mean(tf.nn.softplus(-logits), axis=1))
            if self.class_guidance:
                generator_loss += guided_term(
                    lambda shifted: self.grouped_logits(weights, tiled, shifted, groups=1),
                    logits, labels, self.shape.num_classes, self.class_guidance,
                    self.class_guidance_form)
        grads = tf.reshape(-tape.gradient(generator_loss, tiled),
                           tf.stack([shape[0], shape[1], shape[2], t, shape[3]]))
        return tf.transpose(grads, [3, 0, 1, 2, 4])

    def image_gradients(self, weights: tf.Tensor, images: tf.Tensor,
                        labels: tf.Tensor) -> tf.Tensor:
        """Every teacher's descent direction [T, B, H, W, C], as the reference's."""
        if self.conv_path is ConvPath.FUSED and not self.class_guidance:
            if isinstance(weights, np.ndarray) and teacher_op.capi_available():
                # numpy weights (a bank's rows): no copy into a tensor
                return tf.convert_to_tensor(teacher_op.image_gradients_numpy(
                    weights, np.asarray(images), np.argmax(np.asarray(labels), axis=-1),
                    shape=self.shape, width=self.layout.width))
            return teacher_op.image_gradients(
                weights, images, tf.argmax(labels, axis=-1, output_type=tf.int32),
                shape=self.shape, width=self.layout.width)
        return self._image_gradients(tf.convert_to_tensor(weights),
                                     tf.convert_to_tensor(images, tf.float32),
                                     tf.cast(labels, tf.float32))
