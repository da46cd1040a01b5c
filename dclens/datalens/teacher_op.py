"""The teachers' fused discriminator step, a custom CPU op (``ops/teacher_step_op.cc``).

Two ops compute what :class:`dclens.datalens.fast_ensemble.FastTeacherEnsemble` computes with TF's
per-op kernels, one teacher per thread with every intermediate in cache:

* ``Dclens>TeacherTrain``: ``num_steps`` Adam steps of each teacher of a chunk on its
  merged batch (first half real, second half fake, batch-norm statistics per half):
  forward, backward (im2col + GEMM convolutions, label maps folded) and TF's ``ApplyAdam``
  formula in one pass over the teacher's weights.
* ``Dclens>TeacherImageGradients``: every teacher's descent direction -dL_G/dx on a
  shared fake batch (a TopAgg query).

The same kernel is also built without TF (``ops/_dclens_teacher_capi.so``) and called
through ctypes on numpy arrays (:func:`train_in_place`, :func:`image_gradients_numpy`):
the chunk's weights and Adam moments are updated where they lie (a RAM bank's rows or the
stream's staging buffers), with no copy into or out of TF tensors, and the GIL is released
while it runs.  Both entry points give the same bits.

Same math as the reference ensemble; the float32 rounding differs (other summation orders,
FMA), tested within stated tolerances (tests/test_teacher_op.py).  The library is built for
the machine's CPU (``-march=native``) by ``make -C ops`` (``scripts/setup.sh``) and loaded
at the first use, never at import.  ``DCLENS_TEACHER_OP_LIBRARY`` names another build.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from dclens.common.paths import OPS_DIR
from dclens.datalens import networks

ENV_LIBRARY = "DCLENS_TEACHER_OP_LIBRARY"
ENV_CAPI_LIBRARY = "DCLENS_TEACHER_CAPI_LIBRARY"
LIBRARY = OPS_DIR / "_dclens_teacher_ops.so"
CAPI_LIBRARY = LIBRARY.with_name("_dclens_teacher_capi.so")
ERROR_BYTES = 1024
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


def _network_attrs(shape: networks.ImageShape,
                   width: networks.DiscriminatorWidth) -> dict[str, object]:
    k = shape.num_classes
    return {"num_classes": k, "conv1_filters": width.filters + k,
            "dense_units": width.dense,
            "leaky_slope": networks.LEAKY_SLOPE, "bn_epsilon": networks.BN_EPSILON}


def train(weights: tf.Tensor, adam_m: tf.Tensor, adam_v: tf.Tensor, images: tf.Tensor,
          labels: tf.Tensor, first_step: int, *, shape: networks.ImageShape,
          width: networks.DiscriminatorWidth = networks.DiscriminatorWidth(), num_steps: int,
          learning_rate: float, beta1: float, beta2: float, epsilon: float
          ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """``num_steps`` Adam steps of T teachers (all at Adam step count ``first_step``).

    Args:
      weights, adam_m, adam_v: float32 [T, P] (dclens.datalens.teachers.ParamLayout order).
      images: float32 [T, 2B, H, W, C], each teacher's real batch then its fake batch.
      labels: int32 [T, 2B] class indices.
      width: the discriminator's df and dfc (the layout's ``width``; default the authors').
    Returns:
      (weights, adam_m, adam_v) after the steps, and each teacher's loss [T] of the last
      step before its update: mean softplus(-D(real)) + mean softplus(D(fake)).
    """
    return tuple(load().dclens_teacher_train(
        tf.convert_to_tensor(weights, tf.float32), tf.convert_to_tensor(adam_m, tf.float32),
        tf.convert_to_tensor(adam_v, tf.float32), tf.convert_to_tensor(images, tf.float32),
        tf.convert_to_tensor(labels, tf.int32), tf.constant(int(first_step), tf.int64),
        num_steps=int(num_steps), learning_rate=float(learning_rate), beta1=float(beta1),
        beta2=float(beta2), epsilon=float(epsilon), **_network_attrs(shape, width)))


def image_gradients(weights: tf.Tensor, images: tf.Tensor, labels: tf.Tensor, *,
                    shape: networks.ImageShape,
                    width: networks.DiscriminatorWidth = networks.DiscriminatorWidth()
                    ) -> tf.Tensor:
    """-dL_G/dx [T, B, H, W, C] of every teacher, L_G = mean softplus(-D(x)).

    ``weights`` [T, P]; ``images`` [B, H, W, C] and int32 ``labels`` [B], shared by all
    teachers (batch-norm statistics over the whole batch).
    """
    return load().dclens_teacher_image_gradients(
        tf.convert_to_tensor(weights, tf.float32), tf.convert_to_tensor(images, tf.float32),
        tf.convert_to_tensor(labels, tf.int32), **_network_attrs(shape, width))


# --------------------------------------------------------------------------- numpy, in place
#: The C entry points' signature version (ops/teacher_step_capi.cc): a library built from
#: other sources is refused, never called with the wrong arguments.
CAPI_VERSION = 2
_FLOAT_P = ctypes.POINTER(ctypes.c_float)
_INT_P = ctypes.POINTER(ctypes.c_int32)


@functools.lru_cache(maxsize=None)
def _load_capi(path: str) -> ctypes.CDLL:
    if not os.path.exists(path):
        raise TeacherOpUnavailable(f"{path} does not exist; {BUILD_HINT}")
    try:
        library = ctypes.CDLL(path)
    except OSError as exc:
        raise TeacherOpUnavailable(f"{path} failed to load ({exc}); {BUILD_HINT}") from exc
    version = getattr(library, "dclens_teacher_capi_version", None)
    if version is None or version() != CAPI_VERSION:
        raise TeacherOpUnavailable(f"{path} was built from older sources (its entry points "
                                   f"are not version {CAPI_VERSION}); {BUILD_HINT}")
    i64, i32, f32, buf = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_char_p
    library.dclens_teacher_train_in_place.argtypes = [
        _FLOAT_P, _FLOAT_P, _FLOAT_P, i64, i64, i64, _FLOAT_P, _INT_P, i32, i32, i32, i32, i32,
        i32, i32, f32, f32, i32, i64, f32, f32, f32, f32, _FLOAT_P, i32, buf, i32]
    library.dclens_teacher_image_gradients.argtypes = [
        _FLOAT_P, i64, i64, i64, _FLOAT_P, _INT_P, i32, i32, i32, i32, i32, i32, i32, f32, f32,
        _FLOAT_P, i32, buf, i32]
    for function in (library.dclens_teacher_train_in_place,
                     library.dclens_teacher_image_gradients):
        function.restype = ctypes.c_int
    return library


def load_capi() -> ctypes.CDLL:
    """The C library (``$DCLENS_TEACHER_CAPI_LIBRARY`` or ops/_dclens_teacher_capi.so)."""
    return _load_capi(os.environ.get(ENV_CAPI_LIBRARY) or str(CAPI_LIBRARY))


def capi_available() -> bool:
    """Whether :func:`train_in_place` can be used (never raises)."""
    try:
        load_capi()
        return True
    except TeacherOpUnavailable:
        return False


def threads() -> int:
    """Threads the C entry points use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:      # not Linux
        return max(1, os.cpu_count() or 1)


def row_stride(array: np.ndarray) -> int | None:
    """Floats between consecutive rows of a [T, P] float32 array whose rows are each
    contiguous (C-contiguous, or rows of a wider buffer such as a disk bank's padded
    staging rows); None if the rows are not contiguous or not float32-aligned."""
    if not (isinstance(array, np.ndarray) and array.dtype == np.float32 and array.ndim == 2):
        return None
    rows, columns = array.shape
    if columns > 1 and array.strides[1] != 4:
        return None
    if rows <= 1:
        return columns
    stride = array.strides[0]
    return stride // 4 if stride % 4 == 0 and stride // 4 >= columns else None


def in_place_ready(*arrays: np.ndarray) -> bool:
    """Whether every array is a writable float32 [T, P] numpy array with contiguous rows,
    all with the same row stride (:func:`row_stride`)."""
    strides = {row_stride(a) for a in arrays}
    return (len(strides) == 1 and None not in strides
            and all(a.flags.writeable for a in arrays))


def _floats(array: np.ndarray):
    return array.ctypes.data_as(_FLOAT_P)


def _check(status: int, error: ctypes.Array) -> None:
    if status != 0:
        raise ValueError(error.value.decode("utf-8", "replace"))


def train_in_place(weights: np.ndarray, adam_m: np.ndarray, adam_v: np.ndarray,
                   images: np.ndarray, labels: np.ndarray, first_step: int, *,
                   shape: networks.ImageShape,
                   width: networks.DiscriminatorWidth = networks.DiscriminatorWidth(),
                   num_steps: int, learning_rate: float, beta1: float, beta2: float,
                   epsilon: float) -> np.ndarray:
    """:func:`train` on numpy state, updated in place; returns the losses [T].

    ``weights``, ``adam_m``, ``adam_v``: writable float32 [T, P] with contiguous rows and
    one row stride (:func:`in_place_ready`; overwritten with the state after the steps,
    the padding between rows untouched); ``images`` float32 [T, 2B, H, W, C]; ``labels`` int
    [T, 2B].  Raises ValueError (with the reason) for shapes or labels the network cannot
    take; nothing is written then.
    """
    if not in_place_ready(weights, adam_m, adam_v):
        raise ValueError("train_in_place needs writable float32 [T, P] arrays with "
                         "contiguous rows and one row stride")
    if not (weights.shape == adam_m.shape == adam_v.shape and weights.ndim == 2):
        raise ValueError(f"weights and moments must be the same [T, P] shape, got "
                         f"{weights.shape}, {adam_m.shape}, {adam_v.shape}")
    images = np.ascontiguousarray(images, np.float32)
    labels = np.ascontiguousarray(labels, np.int32)
    t, n = weights.shape[0], images.shape[1] if images.ndim == 5 else -1
    if images.ndim != 5 or images.shape[0] != t or labels.shape != (t, n):
        raise ValueError(f"images must be [{t}, 2B, H, W, C] and labels [{t}, 2B], got "
                         f"{images.shape} and {labels.shape}")
    losses = np.empty(t, np.float32)
    error = ctypes.create_string_buffer(ERROR_BYTES)
    attrs = _network_attrs(shape, width)
    _check(load_capi().dclens_teacher_train_in_place(
        _floats(weights), _floats(adam_m), _floats(adam_v), t, weights.shape[1],
        row_stride(weights), _floats(images), labels.ctypes.data_as(_INT_P), n, *images.shape[2:],
        attrs["num_classes"], attrs["conv1_filters"], attrs["dense_units"],
        attrs["leaky_slope"], attrs["bn_epsilon"], int(num_steps), int(first_step),
        float(learning_rate), float(beta1), float(beta2), float(epsilon), _floats(losses),
        threads(), error, ERROR_BYTES), error)
    return losses


def image_gradients_numpy(weights: np.ndarray, images: np.ndarray, labels: np.ndarray, *,
                          shape: networks.ImageShape,
                          width: networks.DiscriminatorWidth = networks.DiscriminatorWidth()
                          ) -> np.ndarray:
    """:func:`image_gradients` on numpy inputs (no copy of weights whose rows are
    contiguous, :func:`row_stride`): [T, B, H, W, C]."""
    if row_stride(weights) is None:
        weights = np.ascontiguousarray(weights, np.float32)
    images = np.ascontiguousarray(images, np.float32)
    labels = np.ascontiguousarray(labels, np.int32)
    if weights.ndim != 2 or images.ndim != 4 or labels.shape != (images.shape[0],):
        raise ValueError(f"weights must be [T, P], images [B, H, W, C] and labels [B], got "
                         f"{weights.shape}, {images.shape}, {labels.shape}")
    out = np.empty((weights.shape[0],) + images.shape, np.float32)
    error = ctypes.create_string_buffer(ERROR_BYTES)
    attrs = _network_attrs(shape, width)
    _check(load_capi().dclens_teacher_image_gradients(
        _floats(weights), weights.shape[0], weights.shape[1], row_stride(weights),
        _floats(images), labels.ctypes.data_as(_INT_P), *images.shape, attrs["num_classes"],
        attrs["conv1_filters"], attrs["dense_units"], attrs["leaky_slope"],
        attrs["bn_epsilon"], _floats(out), threads(), error, ERROR_BYTES), error)
    return out
