"""The teachers' fused discriminator step, a custom CPU op (``ops/teacher_step_op.cc``).

Two ops compute what :class:`dclens.fast_ensemble.FastTeacherEnsemble` computes with TF's
per-op kernels, one teacher per thread with every intermediate in cache:

* ``Dclens>TeacherTrain``: ``num_steps`` Adam steps of each teacher of a chunk on its
  merged batch (first half real, second half fake, batch-norm statistics per half):
  forward, backward (im2col + GEMM convolutions, label maps folded) and TF's ``ApplyAdam``
  formula in one pass over the teacher's weights.
* ``Dclens>TeacherImageGradients``: every teacher's descent direction -dL_G/dx on a
  shared fake batch (a TopAgg query).

Same math as the reference ensemble; the float32 rounding differs (other summation orders,
FMA), tested within stated tolerances (tests/test_teacher_op.py).  The library is built for
the machine's CPU (``-march=native``) by ``make -C ops`` (``scripts/setup.sh``) and loaded
at the first use, never at import.  ``DCLENS_TEACHER_OP_LIBRARY`` names another build.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import tensorflow as tf

from dclens import networks

ENV_LIBRARY = "DCLENS_TEACHER_OP_LIBRARY"
LIBRARY = Path(__file__).resolve().parent.parent / "ops" / "_dclens_teacher_ops.so"
BUILD_HINT = "build it with `make -C ops` (scripts/setup.sh does)"


class TeacherOpUnavailable(RuntimeError):
    """The fused teacher-step library could not be loaded."""


def library_path() -> Path:
    """$DCLENS_TEACHER_OP_LIBRARY if set, else ops/_dclens_teacher_ops.so."""
    override = os.environ.get(ENV_LIBRARY)
    return Path(override) if override else LIBRARY


@functools.lru_cache(maxsize=None)
def _load(path: str):
    if not os.path.exists(path):
        raise TeacherOpUnavailable(f"{path} does not exist; {BUILD_HINT}")
    try:
        module = tf.load_op_library(path)
    except Exception as exc:  # tf.errors.NotFoundError, OSError, ...
        raise TeacherOpUnavailable(f"{path} failed to load ({exc}); {BUILD_HINT}") from exc
    if not hasattr(module, "dclens_teacher_train"):
        raise TeacherOpUnavailable(f"{path} does not define Dclens>TeacherTrain; {BUILD_HINT}")
    for name in ("Dclens>TeacherTrain", "Dclens>TeacherImageGradients"):
        try:
            tf.no_gradient(name)
        except KeyError:      # registered by an earlier load of another path
            pass
    return module


def load():
    """The op module; :class:`TeacherOpUnavailable` (with how to build it) if it cannot load."""
    return _load(str(library_path()))


def available() -> bool:
    """Whether the ops can be used (loads the library at the first call; never raises)."""
    try:
        load()
        return True
    except TeacherOpUnavailable:
        return False


def _network_attrs(shape: networks.ImageShape) -> dict[str, object]:
    k = shape.num_classes
    return {"num_classes": k, "conv1_filters": networks.DISCRIMINATOR_FILTERS + k,
            "dense_units": networks.DISCRIMINATOR_DENSE,
            "leaky_slope": networks.LEAKY_SLOPE, "bn_epsilon": networks.BN_EPSILON}


def train(weights: tf.Tensor, adam_m: tf.Tensor, adam_v: tf.Tensor, images: tf.Tensor,
          labels: tf.Tensor, first_step: int, *, shape: networks.ImageShape, num_steps: int,
          learning_rate: float, beta1: float, beta2: float, epsilon: float
          ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """``num_steps`` Adam steps of T teachers (all at Adam step count ``first_step``).

    Args:
      weights, adam_m, adam_v: float32 [T, P] (dclens.teachers.ParamLayout order).
      images: float32 [T, 2B, H, W, C], each teacher's real batch then its fake batch.
      labels: int32 [T, 2B] class indices.
    Returns:
      (weights, adam_m, adam_v) after the steps, and each teacher's loss [T] of the last
      step before its update: mean softplus(-D(real)) + mean softplus(D(fake)).
    """
    return tuple(load().dclens_teacher_train(
        tf.convert_to_tensor(weights, tf.float32), tf.convert_to_tensor(adam_m, tf.float32),
        tf.convert_to_tensor(adam_v, tf.float32), tf.convert_to_tensor(images, tf.float32),
        tf.convert_to_tensor(labels, tf.int32), tf.constant(int(first_step), tf.int64),
        num_steps=int(num_steps), learning_rate=float(learning_rate), beta1=float(beta1),
        beta2=float(beta2), epsilon=float(epsilon), **_network_attrs(shape)))


def image_gradients(weights: tf.Tensor, images: tf.Tensor, labels: tf.Tensor, *,
                    shape: networks.ImageShape) -> tf.Tensor:
    """-dL_G/dx [T, B, H, W, C] of every teacher, L_G = mean softplus(-D(x)).

    ``weights`` [T, P]; ``images`` [B, H, W, C] and int32 ``labels`` [B], shared by all
    teachers (batch-norm statistics over the whole batch).
    """
    return load().dclens_teacher_image_gradients(
        tf.convert_to_tensor(weights, tf.float32), tf.convert_to_tensor(images, tf.float32),
        tf.convert_to_tensor(labels, tf.int32), **_network_attrs(shape))
