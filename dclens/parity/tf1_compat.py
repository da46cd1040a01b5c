"""Loads the authors' TF1 DataLens code (``model.py`` and its imports) on TensorFlow 2.

The authors' repository (commit 72d0f2f) targets TF 1.14, Keras 2.3 and torch 1.4 with a
CUDA GPU.  Its files are loaded unchanged, from a path the user gives, with this module's
stand-ins in place of what TF 2 no longer has and of what the side-by-side path never uses:

* ``tensorflow`` as seen by their modules: ``tf.compat.v1`` (graph mode), plus
  ``tf.contrib.layers.batch_norm`` (:func:`contrib_batch_norm`: their decay, epsilon,
  ``scale=True``, batch statistics, moving statistics updated in place) and
  ``tf.app.flags`` (:class:`FlagRecorder`, which records their ``main.py`` flag definitions
  into a flags object instead of registering absl flags); ``tf.global_variables_initializer``
  runs the real initializer and then a callback (:attr:`AuthorsCode.after_initializer`), the
  one place where the harness copies initial weights into their variables;
* ``torch``: a host-memory stand-in for the three calls of their GPU voting path
  (``torch.tensor(...).cuda()``, ``torch.sum(..., dim=)``, ``.cpu().numpy()``), whose
  ``*_gpu`` voting functions are pointed at their own numpy versions
  (``stachastic_convert2topk`` / ``convert2topk``);
* ``torchvision``, ``sklearn``, ``keras.utils.np_utils``, ``tensorflow.contrib.slim``: stubs
  (``np_utils.to_categorical`` is the one-hot their partitioner calls; everything else
  raises if used);
* ``np.float`` / ``np.int`` (removed in numpy 1.24): restored as ``float`` / ``int`` while
  :class:`AuthorsCode` is open.

Nothing of their code is copied here; their modules are imported from ``repo`` and removed
from ``sys.modules`` again when the :class:`AuthorsCode` is closed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

#: Their top-level modules that the side-by-side path imports.
AUTHORS_MODULES = ("model", "ops", "utils", "rdp_utils", "pate_core", "dp_pca", "gen_data")
#: Files whose presence identifies the authors' repository.
REQUIRED_FILES = ("model.py", "main.py", "ops.py", "rdp_utils.py", "pate_core.py")


class AuthorsCodeError(RuntimeError):
    """The authors' repository cannot be found or loaded."""


class _FolderFinder(importlib.abc.MetaPathFinder):
    """Finds top-level modules in one folder first (the authors' code imports its
    siblings by plain name) without putting that folder on the import path; installed
    while their code loads, removed after."""

    def __init__(self, folder):
        self.folder = str(folder)

    def find_spec(self, name, path=None, target=None):
        if "." in name:
            return None
        return importlib.machinery.PathFinder.find_spec(name, [self.folder])


def check_repo(repo: str | os.PathLike) -> Path:
    """The authors' repository folder, or an error that says what is missing."""
    path = Path(repo).expanduser()
    if not path.is_dir():
        raise AuthorsCodeError(
            f"the authors' DataLens repository was not found at {str(path)!r}; pass "
            f"--authors_repo PATH (a checkout of AI-secure/DataLens, e.g. ../shared/"
            f"authors-datalens)")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise AuthorsCodeError(f"{str(path)!r} is not the authors' DataLens repository: "
                               f"{', '.join(missing)} missing")
    return path


# --------------------------------------------------------------------------- batch norm
def contrib_batch_norm(inputs, decay: float = 0.999, center: bool = True,
                       scale: bool = False, epsilon: float = 0.001,
                       updates_collections: Any = tf1.GraphKeys.UPDATE_OPS,
                       is_training: bool = True, scope: str | None = None, **unused: Any):
    """``tf.contrib.layers.batch_norm`` as the authors call it (TF 1.14 semantics).

    Variables ``beta`` (zeros), ``gamma`` (ones, if ``scale``), ``moving_mean`` (zeros) and
    ``moving_variance`` (ones) in variable scope ``scope``; in training mode the output is
    gamma (x - mean) / sqrt(var + epsilon) + beta with the batch's mean and (biased)
    variance over every axis but the last, and the moving statistics move towards them
    with ``decay`` -- in place when ``updates_collections`` is None, as the authors set it.
    Only what their code uses is supported; anything else raises.
    """
    if unused:
        raise AuthorsCodeError(f"batch_norm stand-in: unsupported arguments {sorted(unused)}")
    if not is_training:
        raise AuthorsCodeError("batch_norm stand-in: only is_training=True is used by the "
                               "authors' DataLens path")
    if not center:
        raise AuthorsCodeError("batch_norm stand-in: center=False is not supported")
    channels = inputs.get_shape()[-1]
    with tf1.variable_scope(scope, default_name="BatchNorm"):
        beta = tf1.get_variable("beta", [channels], initializer=tf1.zeros_initializer())
        gamma = (tf1.get_variable("gamma", [channels], initializer=tf1.ones_initializer())
                 if scale else None)
        moving_mean = tf1.get_variable("moving_mean", [channels], trainable=False,
                                       initializer=tf1.zeros_initializer())
        moving_variance = tf1.get_variable("moving_variance", [channels], trainable=False,
                                           initializer=tf1.ones_initializer())
        axes = list(range(inputs.get_shape().ndims - 1))
        mean, variance = tf.nn.moments(inputs, axes)
        updates = [tf1.assign_sub(moving_mean, (moving_mean - mean) * (1.0 - decay)),
                   tf1.assign_sub(moving_variance, (moving_variance - variance) * (1.0 - decay))]
        if updates_collections is None:
            with tf.control_dependencies(updates):
                mean, variance = tf.identity(mean), tf.identity(variance)
        else:
            for update in updates:
                tf1.add_to_collection(updates_collections, update)
        return tf.nn.batch_normalization(inputs, mean, variance, beta, gamma, epsilon)


# --------------------------------------------------------------------------- flags
class FlagRecorder(types.ModuleType):
    """Stand-in for ``tf.app.flags``: ``DEFINE_*`` calls set attributes of ``FLAGS``."""

    def __init__(self):
        super().__init__("tensorflow.app.flags")
        self.FLAGS = types.SimpleNamespace()
        self.help: dict[str, str] = {}

    def _define(self, kind: Callable[[Any], Any]):
        def define(name: str, default: Any, help_text: str = "", *args: Any, **kw: Any):
            setattr(self.FLAGS, name, default if default is None else kind(default))
            self.help[name] = help_text
        return define

    def __getattr__(self, name: str):
        kinds = {"DEFINE_integer": int, "DEFINE_float": float, "DEFINE_string": str,
                 "DEFINE_boolean": bool, "DEFINE_bool": bool}
        if name in kinds:
            return self._define(kinds[name])
        raise AttributeError(name)


# --------------------------------------------------------------------------- stand-ins
class HostArray(np.ndarray):
    """A numpy array with the torch methods their GPU voting path calls (no-ops here)."""

    def cuda(self) -> "HostArray":
        return self

    def cpu(self) -> "HostArray":
        return self

    def numpy(self) -> np.ndarray:
        return np.asarray(self)


def _unavailable(what: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any):
        raise AuthorsCodeError(f"{what} is not available in dclens' compatibility layer (the "
                               f"side-by-side path does not use it)")
    return fail


def _stub_module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    module.__getattr__ = lambda attr: _unavailable(f"{name}.{attr}")  # type: ignore
    return module


def _to_categorical(values, num_classes: int | None = None) -> np.ndarray:
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    count = int(values.max()) + 1 if num_classes is None else num_classes
    out = np.zeros((values.size, count), np.float32)
    out[np.arange(values.size), values] = 1.0
    return out if values.size != 1 else out[0]


def _torch_module() -> types.ModuleType:
    def tensor(data, *args: Any, **kwargs: Any) -> HostArray:
        return np.asarray(data).view(HostArray)

    def total(data, dim: int | None = None, *args: Any, **kwargs: Any) -> HostArray:
        return np.asarray(np.sum(np.asarray(data), axis=dim)).view(HostArray)

    torch = _stub_module("torch", tensor=tensor, sum=total)
    torch.utils = _stub_module("torch.utils")
    torch.utils.data = _stub_module("torch.utils.data")
    return torch


def _tf_shim(after_initializer: Callable[[], None]) -> types.ModuleType:
    class TF1(types.ModuleType):
        def __getattr__(self, name: str):
            return getattr(tf1, name)

    shim = TF1("tensorflow")
    shim.contrib = _stub_module("tensorflow.contrib")
    shim.contrib.layers = _stub_module("tensorflow.contrib.layers",
                                       batch_norm=contrib_batch_norm)
    shim.contrib.slim = _stub_module("tensorflow.contrib.slim")
    shim.app = _stub_module("tensorflow.app", flags=FlagRecorder(),
                            run=_unavailable("tf.app.run"))

    class Initializer:
        def __init__(self):
            self.op = tf1.global_variables_initializer()

        def run(self, session=None):
            (session or tf1.get_default_session()).run(self.op)
            after_initializer()

    shim.global_variables_initializer = Initializer
    shim.initialize_all_variables = Initializer
    return shim


@contextlib.contextmanager
def _swapped_modules(replacements: dict[str, types.ModuleType]) -> Iterator[None]:
    saved = {name: sys.modules.get(name) for name in replacements}
    sys.modules.update(replacements)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


# --------------------------------------------------------------------------- loading
@dataclasses.dataclass
class AuthorsCode:
    """The authors' modules, loaded by :func:`load_authors_code`.

    Attributes:
      model, rdp_utils, pate_core: their modules.
      flags: their ``main.py`` flags object with their defaults (a fresh copy per load).
      flag_help: their help text per flag.
      after_initializer: called right after their ``tf.global_variables_initializer()``
        ran (set it to copy weights in); a no-op by default.
    """

    repo: Path
    model: types.ModuleType
    rdp_utils: types.ModuleType
    pate_core: types.ModuleType
    flags: types.SimpleNamespace
    flag_help: dict[str, str]
    after_initializer: Callable[[], None] = lambda: None


@contextlib.contextmanager
def load_authors_code(repo: str | os.PathLike) -> Iterator[AuthorsCode]:
    """Imports the authors' ``main.py`` (for its flags), ``model.py`` and their imports.

    While the context is open, ``np.float`` and ``np.int`` exist (their code uses them
    at run time); on exit, their modules leave ``sys.modules`` and numpy is restored.
    """
    path = check_repo(repo)
    holder: dict[str, AuthorsCode] = {}

    def after_initializer() -> None:
        holder["code"].after_initializer()

    shim = _tf_shim(after_initializer)
    torch = _torch_module()
    sklearn = _stub_module("sklearn")
    stubs = {
        "tensorflow": shim,
        "tensorflow.contrib": shim.contrib,
        "tensorflow.contrib.slim": shim.contrib.slim,
        "tensorflow.contrib.layers": shim.contrib.layers,
        "torch": torch, "torch.utils": torch.utils, "torch.utils.data": torch.utils.data,
        "torchvision": _stub_module("torchvision"),
        "torchvision.transforms": _stub_module("torchvision.transforms"),
        "sklearn": sklearn,
        "sklearn.preprocessing": _stub_module("sklearn.preprocessing"),
        "sklearn.random_projection": _stub_module("sklearn.random_projection"),
        "keras.utils.np_utils": _stub_module("keras.utils.np_utils",
                                             to_categorical=_to_categorical),
    }
    try:
        import six.moves  # noqa: F401  (their code imports xrange from it)
    except ImportError:
        six = _stub_module("six")
        six.moves = _stub_module("six.moves", xrange=range)
        stubs.update({"six": six, "six.moves": six.moves})
    theirs = {name: None for name in (*AUTHORS_MODULES, "authors_main")}
    numpy_aliases = {name: np.__dict__.get(name) for name in ("float", "int")}
    np.float, np.int = float, int  # type: ignore[attr-defined]
    finder = _FolderFinder(path)
    sys.meta_path.insert(0, finder)
    try:
        with _swapped_modules({**stubs, **{name: None for name in theirs}}):
            for name in theirs:
                sys.modules.pop(name, None)
            try:
                spec = importlib.util.spec_from_file_location("authors_main", path / "main.py")
                main = importlib.util.module_from_spec(spec)
                sys.modules["authors_main"] = main
                spec.loader.exec_module(main)
                model = importlib.import_module("model")
                rdp_utils = importlib.import_module("rdp_utils")
                pate_core = importlib.import_module("pate_core")
            except AuthorsCodeError:
                raise
            except Exception as error:
                raise AuthorsCodeError(f"cannot import the authors' code from {str(path)!r}: "
                                       f"{type(error).__name__}: {error}") from error
        sys.meta_path.remove(finder)
        # Their GPU voting functions -> their numpy ones (same arguments and results).
        rdp_utils.stachastic_convert2topk_gpu = (
            lambda grad, topk, b=None: rdp_utils.stachastic_convert2topk(np.asarray(grad),
                                                                          topk, b=b))
        rdp_utils.convert2topk_gpu = (
            lambda grad, topk: rdp_utils.convert2topk(np.asarray(grad), topk))
        recorder = shim.app.flags
        code = AuthorsCode(repo=path, model=model, rdp_utils=rdp_utils, pate_core=pate_core,
                           flags=recorder.FLAGS, flag_help=recorder.help)
        holder["code"] = code
        yield code
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for name, value in numpy_aliases.items():
            if value is None:
                np.__dict__.pop(name, None)
            else:
                setattr(np, name, value)
