"""The teachers' 5x5 stride-2 'SAME' convolutions, for many teachers at once.

Teacher t has its own kernel W_t [5, 5, Cin, Cout] and its own input.  Two ways to compute
all T convolutions, with the same math (results equal within float32 round-off,
tests/test_teacher_conv.py):

* :attr:`ConvPath.GROUPED` -- one grouped ``tf.nn.conv2d`` with T groups (input in the
  grouped layout [B, H, W, T*Cin]).  TensorFlow's CPU kernels differentiate a grouped
  convolution only when oneDNN is on; oneDNN is on by default on some CPUs (AVX-512-class)
  and off on others (e.g. AVX2-only EPYCs), or as ``TF_ENABLE_ONEDNN_OPTS`` says.  Without
  it the gradient raises ``InvalidArgumentError: Gradients for grouped convolutions are not
  supported on CPU``.
* :attr:`ConvPath.PER_TEACHER` -- T ordinary ``tf.nn.conv2d`` calls, one per teacher, on
  the channel slices of the same grouped layout, then concatenated.  Every CPU kernel of TF
  has these and their gradients, with or without oneDNN.

:func:`resolve_conv_path` picks the path: ``auto`` takes the per-teacher path unless the
grouped gradient works *and* is the measured-faster path on this build (see
:data:`AUTO_PREFERS_GROUPED`), and says once, on the ``dclens`` logger, which one it uses
and why.  No environment variable is read or changed here: oneDNN's state is whatever the
process started with.
"""

from __future__ import annotations

import functools
import logging
import os

import numpy as np
import tensorflow as tf

from dclens.common.machine import cpu_model_name, cpu_vector_extensions, onednn_enabled
from dclens.datalens import teacher_op
from dclens.datalens.config import ConvPath

KERNEL = 5
LOGGER = logging.getLogger("dclens")

#: With the grouped gradient available, is the grouped path the faster one?  Measured on
#: a 2-core AVX2 EPYC with oneDNN on (docs/performance.md): one chunk of 10 teachers, 2
#: training steps at B = 15, 115 ms per-teacher vs 182 ms grouped; scripts/bench.py
#: fmnist-200, 5.9 vs 7.9 s per step.  So ``auto`` takes the per-teacher path everywhere
#: and the grouped path stays available by name.
AUTO_PREFERS_GROUPED = False


CONV_PATH_CHOICES = tuple(path.value for path in ConvPath)


@functools.lru_cache(maxsize=None)
def grouped_gradient_supported() -> bool:
    """Whether TF can differentiate a grouped convolution on this machine and build.

    Runs a 2-group 4x4 convolution and its gradients once per process (a few ms).
    """
    x = tf.ones((1, 4, 4, 2))
    kernel = tf.ones((KERNEL, KERNEL, 1, 2))

    @tf.function
    def probe(x: tf.Tensor, kernel: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, kernel])
            out = tf.reduce_sum(tf.nn.conv2d(x, kernel, strides=2, padding="SAME"))
        return tape.gradient(out, [x, kernel])

    try:
        grads = probe(x, kernel)
        return all(bool(np.all(np.isfinite(g.numpy()))) for g in grads)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
        return False


def resolve_conv_path(requested: str | ConvPath = "auto") -> ConvPath:
    """The path to use for ``requested`` (a :class:`ConvPath` or its value); never AUTO.

    Raises ValueError for an unknown name, and for ``grouped`` where its gradient is not
    available (with what to do instead).
    """
    try:
        path = ConvPath(requested)
    except ValueError:
        raise ValueError(f"unknown teacher convolution path {requested!r}; use one of "
                         f"{', '.join(CONV_PATH_CHOICES)}") from None
    if path is ConvPath.GROUPED and not grouped_gradient_supported():
        raise ValueError(
            "conv path 'grouped' needs gradients of grouped convolutions, which this "
            f"TensorFlow build does not have on this CPU (oneDNN on: {onednn_enabled()}); "
            "use 'per_teacher' or 'auto', or start Python with TF_ENABLE_ONEDNN_OPTS=1")
    if path is ConvPath.FUSED and not teacher_op.available():
        try:
            teacher_op.load()
        except teacher_op.TeacherOpUnavailable as error:
            raise ValueError(f"conv path 'fused' needs the teacher-step op: {error}; or "
                             "use 'auto' or 'per_teacher'") from None
    if path is ConvPath.AUTO:
        if teacher_op.available():
            path = ConvPath.FUSED
        else:
            path = (ConvPath.GROUPED if AUTO_PREFERS_GROUPED and grouped_gradient_supported()
                    else ConvPath.PER_TEACHER)
    _announce(path, ConvPath(requested).value)
    return path


@functools.lru_cache(maxsize=None)
def _announce(path: ConvPath, requested: str) -> None:
    """Logs once per process and choice which path the teachers' convolutions take."""
    LOGGER.info("teacher convolutions: %s path (asked: %s; fused op available: %s; oneDNN "
                "on: %s; grouped gradient available: %s; CPU: %s)", path.value, requested,
                teacher_op.available(), onednn_enabled(), grouped_gradient_supported(),
                " ".join(cpu_vector_extensions()) or "unknown")


def describe(path: ConvPath) -> dict[str, object]:
    """What a benchmark or run record says about the convolution path and the machine."""
    return {"conv_path": path.value, "fused_op_available": teacher_op.available(),
            "onednn_enabled": onednn_enabled(),
            "tf_enable_onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
            "grouped_gradient_supported": grouped_gradient_supported(),
            "cpu_model": cpu_model_name(), "cpu_vector_extensions": cpu_vector_extensions()}


def grouped_kernel(kernel: tf.Tensor) -> tf.Tensor:
    """[T, 5, 5, Cin, Cout] -> [5, 5, Cin, T*Cout] (the filter of a T-group convolution)."""
    return tf.reshape(tf.transpose(kernel, [1, 2, 3, 0, 4]),
                      (KERNEL, KERNEL, kernel.shape[-2], -1))


def conv5x5_stride2(x: tf.Tensor, kernel: tf.Tensor, path: ConvPath) -> tf.Tensor:
    """All teachers' convolutions in grouped layout: x [B, H, W, T*Cin] -> [B, Ho, Wo, T*Cout].

    ``kernel`` [T, 5, 5, Cin, Cout]; teacher t reads channels [t*Cin, (t+1)*Cin) and writes
    [t*Cout, (t+1)*Cout); 'SAME' zero padding, stride 2, no bias.  The per-teacher path
    needs a static T (one trace per chunk size).
    """
    if path is ConvPath.GROUPED:
        return tf.nn.conv2d(x, grouped_kernel(kernel), strides=2, padding="SAME")
    if kernel.shape[3] == 1:
        # One input channel per teacher: exactly a depthwise convolution with channel
        # multiplier Cout (output channel t*Cout + o), whose kernels exist on every CPU.
        depthwise = tf.transpose(kernel[:, :, :, 0, :], [1, 2, 0, 3])     # [5, 5, T, Cout]
        return tf.nn.depthwise_conv2d(x, depthwise, strides=[1, 2, 2, 1], padding="SAME")
    num_teachers = kernel.shape[0]
    if num_teachers is None:
        raise ValueError("the per-teacher convolution path needs the number of teachers "
                         "in the chunk to be known when the graph is traced")
    inputs = tf.split(x, num_teachers, axis=3)
    kernels = tf.unstack(kernel, axis=0)
    return tf.concat([tf.nn.conv2d(inputs[t], kernels[t], strides=2, padding="SAME")
                      for t in range(num_teachers)], axis=3)
