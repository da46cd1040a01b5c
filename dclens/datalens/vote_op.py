"""The TopAgg voting step as a custom TensorFlow op (``ops/``), loaded lazily.

``Dclens>TopkSignVote`` computes what :func:`dclens.datalens.topagg.summed_votes` computes with
pure TF ops (top-k, clip, L-inf normalisation, (stochastic) sign, sum over teachers), in
one multithreaded C++ kernel (and a CUDA kernel when built with ``make -C ops cuda``).
The results are bit-identical: same tie rule as ``tf.math.top_k`` (lower index first),
same float32 arithmetic.

Loading happens at the first use, never at import: importing ``dclens`` or
``dclens.datalens.topagg`` does not touch the library.  Build it with ``make -C ops`` (which
``scripts/setup.sh`` runs).

Environment:

* ``DCLENS_VOTE_OP`` chooses what the ``"auto"`` backend of
  :func:`dclens.datalens.topagg.summed_votes` (and so :meth:`dclens.datalens.topagg.TopAgg.vote_sum`) uses:
  unset, ``""`` or ``"auto"``: the op when it loads, else the pure-TF reference (with one
  warning); ``"reference"``: always the pure-TF reference (the library is not loaded);
  ``"custom"``: always the op (an error if it cannot be loaded).  An explicit ``backend=``
  argument other than ``"auto"`` is not affected.
* ``DCLENS_VOTE_OP_LIBRARY``: the path of the shared library to load instead of the
  default: ``ops/_dclens_ops_cuda.so`` when it exists and TF sees a GPU, else (or if it
  fails to load) ``ops/_dclens_ops.so``.

The op has no gradient (it is registered as not differentiable) and no XLA kernel: do not
call it inside ``tf.function(jit_compile=True)``; ``summed_votes`` never jit-compiles.
"""

from __future__ import annotations

import enum
import os
import threading
import warnings
from pathlib import Path

import tensorflow as tf

from dclens.common.paths import OPS_DIR

ENV_BACKEND = "DCLENS_VOTE_OP"
ENV_LIBRARY = "DCLENS_VOTE_OP_LIBRARY"
OP_NAME = "Dclens>TopkSignVote"
CPU_LIBRARY = OPS_DIR / "_dclens_ops.so"
CUDA_LIBRARY = OPS_DIR / "_dclens_ops_cuda.so"
BUILD_HINT = "build it with `make -C ops` (scripts/setup.sh does)"


class Backend(str, enum.Enum):
    """Which implementation computes the summed votes."""

    #: The op when it can be loaded, else the pure-TF reference (``DCLENS_VOTE_OP`` can
    #: force either).
    AUTO = "auto"
    #: The pure-TF reference in dclens/datalens/topagg.py.
    REFERENCE = "reference"
    #: The custom op; an error if it cannot be loaded.
    CUSTOM = "custom"


class VoteOpUnavailable(RuntimeError):
    """The custom op library could not be loaded."""


_lock = threading.Lock()
_module = None          # The loaded op module, once loaded.
_path: Path | None = None   # Its library.
_error: str | None = None   # Why loading failed, once it failed.
_warned = False
_gradient_registered = False


def library_candidates() -> list[Path]:
    """The libraries tried in order: $DCLENS_VOTE_OP_LIBRARY alone, or else the CUDA build
    (only if it exists and TF sees a GPU) then the CPU build."""
    override = os.environ.get(ENV_LIBRARY)
    if override:
        return [Path(override)]
    if CUDA_LIBRARY.exists() and tf.config.list_physical_devices("GPU"):
        return [CUDA_LIBRARY, CPU_LIBRARY]
    return [CPU_LIBRARY]


def reset() -> None:
    """Forgets a loaded library or a failed attempt (and the warning); for tests.

    TensorFlow cannot unload a library: a later :func:`load` of the same path returns the
    same op module.
    """
    global _module, _path, _error, _warned
    with _lock:
        _module, _path, _error, _warned = None, None, None, False


def load():
    """The op module (loading the library at the first call); VoteOpUnavailable if not."""
    global _module, _path, _error, _gradient_registered
    with _lock:
        if _module is not None:
            return _module
        if _error is not None:
            raise VoteOpUnavailable(_error)
        reasons = []
        for path in library_candidates():
            if not path.exists():
                reasons.append(f"{path} does not exist")
                continue
            try:
                module = tf.load_op_library(str(path))
            except Exception as exc:  # tf.errors.NotFoundError, OSError, ...
                reasons.append(f"{path} failed to load: {exc}")
                continue
            if not hasattr(module, "dclens_topk_sign_vote"):
                reasons.append(f"{path} does not define the op {OP_NAME}")
                continue
            if not _gradient_registered:
                tf.no_gradient(OP_NAME)
                _gradient_registered = True
            _module, _path = module, path
            return module
        _error = "; ".join(reasons) + f"; {BUILD_HINT}"
        raise VoteOpUnavailable(_error)


def available() -> bool:
    """Whether the op can be used (loads it at the first call; never raises)."""
    try:
        load()
        return True
    except VoteOpUnavailable:
        return False


def loaded_library() -> Path | None:
    """The path of the loaded library, or None if none is loaded (yet)."""
    return _path


def kernel_devices() -> set[str]:
    """The device types the loaded op has kernels for, e.g. {"CPU"} or {"CPU", "GPU"}."""
    load()
    from tensorflow.python.framework import kernels  # pylint: disable=import-outside-toplevel
    return {k.device_type for k in kernels.get_registered_kernels_for_op(OP_NAME).kernel}


def _warn_fallback(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"dclens: the TopAgg custom op is not available ({reason}); using "
                      f"the pure-TensorFlow reference, which is slower", RuntimeWarning,
                      stacklevel=3)


def env_backend() -> Backend:
    """The backend that ``"auto"`` means, from $DCLENS_VOTE_OP."""
    value = os.environ.get(ENV_BACKEND, "").strip().lower()
    try:
        return Backend(value or "auto")
    except ValueError:
        raise ValueError(f"{ENV_BACKEND}={os.environ[ENV_BACKEND]!r} is not one of "
                         f"'auto', 'reference', 'custom' (or unset)") from None


def resolve(backend: Backend | str = Backend.AUTO) -> Backend:
    """REFERENCE or CUSTOM for a requested backend (see :class:`Backend`)."""
    try:
        backend = Backend(backend)
    except ValueError:
        raise ValueError(f"backend must be one of 'auto', 'reference', 'custom', got "
                         f"{backend!r}") from None
    if backend is Backend.AUTO:
        backend = env_backend()
        if backend is Backend.AUTO:
            try:
                load()
                return Backend.CUSTOM
            except VoteOpUnavailable as exc:
                _warn_fallback(str(exc))
                return Backend.REFERENCE
    if backend is Backend.CUSTOM:
        load()  # Raises VoteOpUnavailable with the reason and how to build it.
    return backend


def topk_sign_vote(grads: tf.Tensor, uniforms: tf.Tensor | None, *, topk: int,
                   max_grad: float, stochastic: bool = True) -> tf.Tensor:
    """Summed votes int32 [images, dim] of grads [teachers, images, dim] by the op.

    Args:
      grads: float32 [T, B, D].
      uniforms: float32 [T, B, topk] U[0, 1) draws in top-k order; required for the
        stochastic sign, ignored (may be None) for the deterministic sign.
      topk: k, 1 <= k <= D.
      max_grad: the clip bound c > 0.
      stochastic: the stochastic sign (True) or the deterministic sign (False).
    """
    module = load()
    grads = tf.convert_to_tensor(grads, tf.float32)
    if uniforms is None:
        if stochastic:
            raise ValueError("the stochastic sign needs uniform draws")
        uniforms = tf.zeros([0], tf.float32)  # Allowed: ignored by the deterministic sign.
    uniforms = tf.convert_to_tensor(uniforms, tf.float32)
    return module.dclens_topk_sign_vote(grads, uniforms, k=int(topk),
                                        max_grad=float(max_grad),
                                        stochastic=bool(stochastic))
