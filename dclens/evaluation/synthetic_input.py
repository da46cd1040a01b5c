"""Reading the synthetic data to evaluate, in every layout dclens and the authors write.

Inputs (:func:`load_synthetic`): our ``samples.npz`` (or a run directory holding it), the
authors' pickle prefix (``.../eps-1.00.data`` for ``eps-1.00.data-0.pkl`` ..), one pickle
of rows, or any ``.npz`` with images and labels.  Pickles can run code when loaded: read
only files you trust (``.npz`` files are read with ``allow_pickle=False``).  Every refusal
names the file and what is wrong with it.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import re
import zipfile

import numpy as np

from dclens import data
from dclens.runs import rundir

SAMPLES_FILE = "samples.npz"
_NPZ_KEYS = (("x", "y"), ("images", "labels"), ("x_train", "y_train"), ("X", "Y"))


class EvaluationError(ValueError):
    """Inputs the evaluation cannot use; the message says which file and what to do."""


def base_dataset(name: str) -> str:
    """``celebA-gender-train`` -> ``celebA-gender``; ``fashion_mnist`` unchanged."""
    if name.startswith("celebA-") and name.count("-") == 2:
        return name.rsplit("-", 1)[0]
    return name


def train_split_name(name: str) -> str:
    """The name that loads the real training data for ``name``."""
    base = base_dataset(name)
    return f"{base}-train" if base.startswith("celebA-") else base


def _images_to_spec(images: np.ndarray, spec: data.DatasetSpec, source: str) -> np.ndarray:
    """Flat rows, [N,H,W] or [N,H,W,C]; uint8 0..255 or floats in [0,1] -> float32 NHWC."""
    images = np.asarray(images)
    if images.dtype == np.uint8:
        images = images.astype(np.float32) / np.float32(255.0)
    elif images.dtype.kind not in "fiu":
        raise EvaluationError(f"{source}: images have dtype {images.dtype}; expected "
                              f"floats in [0, 1] or uint8")
    images = images.astype(np.float32, copy=False)
    h, w, c = spec.image_shape
    if images.ndim == 2 and images.shape[1] == h * w * c:
        images = images.reshape(-1, h, w, c)
    elif images.ndim == 3 and images.shape[1:] == (h, w) and c == 1:
        images = images[..., None]
    if images.ndim != 4 or images.shape[1:] != spec.image_shape:
        raise EvaluationError(
            f"{source}: images have shape {images.shape}, but the {spec.name} test images "
            f"are {h}x{w}x{c} (expected [N, {h}, {w}, {c}] or flat rows of {h * w * c}); "
            f"pass the right --dataset for these samples")
    return images


def _labels_from(labels: np.ndarray, num_classes: int, source: str) -> np.ndarray:
    """int labels [N] or one-hot/probability rows [N, K] -> int64 [N]."""
    labels = np.asarray(labels)
    if labels.ndim == 2:
        if labels.shape[1] != num_classes:
            raise EvaluationError(f"{source}: label rows have {labels.shape[1]} columns, "
                                  f"expected {num_classes} (one per class)")
        return labels.argmax(axis=1).astype(np.int64)
    if labels.ndim != 1:
        raise EvaluationError(f"{source}: labels have shape {labels.shape}; expected [N] "
                              f"class indices or [N, {num_classes}] one-hot rows")
    if labels.dtype.kind == "f":
        if not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels)):
            raise EvaluationError(f"{source}: labels are floats that are not whole numbers")
    elif labels.dtype.kind not in "iu":
        raise EvaluationError(f"{source}: labels have dtype {labels.dtype}; expected "
                              f"integers")
    return labels.astype(np.int64)


def _labeled(images: np.ndarray, labels: np.ndarray, spec: data.DatasetSpec,
             source: str) -> data.LabeledImages:
    images = _images_to_spec(images, spec, source)
    labels = _labels_from(labels, spec.num_classes, source)
    if len(images) != len(labels):
        raise EvaluationError(f"{source}: {len(images)} images but {len(labels)} labels")
    if len(images) == 0:
        raise EvaluationError(f"{source} holds no samples; nothing to evaluate")
    try:
        return data.LabeledImages(images, labels, spec, source)
    except data.DataError as error:
        raise EvaluationError(str(error)) from error


def _read_rows(path: str) -> np.ndarray:
    """One pickle of rows (plain pickle, or joblib.dump when joblib is installed)."""
    try:
        with open(path, "rb") as stream:
            rows = pickle.load(stream)
    except FileNotFoundError as error:
        raise EvaluationError(f"{path} not found") from error
    except Exception as error:   # joblib's format needs joblib to unpickle its arrays
        try:
            import joblib
        except ImportError:
            raise EvaluationError(
                f"cannot unpickle {path} ({type(error).__name__}: {error}); files written "
                f"by joblib.dump need joblib: pip install joblib") from error
        try:
            rows = joblib.load(path)
        except Exception as joblib_error:
            raise EvaluationError(
                f"{path} is not a readable pickle of sample rows (truncated or damaged: "
                f"{type(error).__name__}: {error}); write the samples again (python "
                "scripts/main.py --checkpoint_dir RUN without --train re-samples a trained "
                "run) or pass the run's samples.npz") from joblib_error
    rows = np.asarray(rows)
    if rows.ndim != 2:
        raise EvaluationError(f"{path}: expected a 2-D array of rows (pixels + one-hot "
                              f"label), got shape {rows.shape}")
    return rows


def authors_prefix_files(prefix: str) -> list[str]:
    """``<prefix>-0.pkl``, ``-1.pkl``, ... (consecutive from 0, as the authors write them)."""
    files = []
    while os.path.exists(f"{prefix}-{len(files)}.pkl"):
        files.append(f"{prefix}-{len(files)}.pkl")
    if not files:
        raise EvaluationError(
            f"no file {prefix}-0.pkl: pass our samples.npz, a run directory, or the authors' "
            f"pickle prefix (e.g. runs/x/eps-1.00.data for eps-1.00.data-0.pkl .. -9.pkl)")
    return files


def read_authors_rows(paths: list[str], spec: data.DatasetSpec) -> data.LabeledImages:
    """The authors' layout: rows of H*W*C pixels followed by a one-hot label."""
    dim = int(np.prod(spec.image_shape))
    parts = []
    for path in paths:
        rows = _read_rows(path)
        if rows.shape[1] != dim + spec.num_classes:
            raise EvaluationError(
                f"{path}: rows have {rows.shape[1]} columns, expected {dim} pixels + "
                f"{spec.num_classes} label columns for {spec.name}; pass the right --dataset")
        parts.append(rows)
    rows = np.concatenate(parts).astype(np.float32)
    source = paths[0] if len(paths) == 1 else f"{paths[0]} .. {os.path.basename(paths[-1])}"
    return _labeled(rows[:, :dim], rows[:, dim:], spec, source)


def _read_npz(path: str, spec: data.DatasetSpec) -> data.LabeledImages:
    damaged = ("; write the samples again (python scripts/main.py --checkpoint_dir RUN "
               "without --train re-samples a trained run)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = set(archive.files)
            arrays = next(((archive[image_key], archive[label_key])
                           for image_key, label_key in _NPZ_KEYS
                           if image_key in names and label_key in names), None)
    except FileNotFoundError as error:
        raise EvaluationError(f"{path} not found") from error
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        # numpy's own message for a file that is not an .npz suggests allow_pickle=True,
        # which would execute whatever the file holds: never that.
        raise EvaluationError(f"{path} is not a readable .npz archive of samples (truncated "
                              f"or not an .npz: {type(error).__name__}){damaged}") from error
    if arrays is not None:
        return _labeled(*arrays, spec, path)
    raise EvaluationError(f"{path} holds arrays {sorted(names)}; expected images and labels "
                          f"under one of " + ", ".join(f"{a}/{b}" for a, b in _NPZ_KEYS))


def resolve_input(path: str | os.PathLike) -> tuple[str, str]:
    """(kind, path) for an input path; kind is npz, authors_pickles or pickle."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, SAMPLES_FILE)):
            return "npz", os.path.join(path, SAMPLES_FILE)
        prefixes = sorted({f[:-len("-0.pkl")] for f in
                           glob.glob(os.path.join(path, "*.data-0.pkl"))})
        if len(prefixes) == 1:
            return "authors_pickles", prefixes[0]
        if prefixes:
            raise EvaluationError(f"{path} holds several pickle sets ({', '.join(prefixes)}); "
                                  f"pass one prefix")
        raise EvaluationError(f"{path} holds neither {SAMPLES_FILE} nor authors' pickles "
                              f"(*.data-0.pkl); pass the samples file itself")
    if path.endswith(".npz"):
        if not os.path.exists(path):
            raise EvaluationError(f"{path} not found; pass a samples.npz, a run directory or "
                                  f"an authors' pickle prefix")
        return "npz", path
    match = re.fullmatch(r"(.*)-(\d+)\.pkl", path)
    if match and os.path.exists(f"{match.group(1)}-0.pkl"):
        return "authors_pickles", match.group(1)
    if path.endswith(".pkl") and os.path.exists(path):
        return "pickle", path
    return "authors_pickles", path


def load_synthetic(path: str | os.PathLike, dataset: str) -> tuple[data.LabeledImages, str]:
    """Reads synthetic samples for ``dataset``; returns (images, kind of input)."""
    spec = data.dataset_spec(train_split_name(dataset))
    kind, where = resolve_input(path)
    if kind == "npz":
        return _read_npz(where, spec), kind
    if kind == "pickle":
        return read_authors_rows([where], spec), kind
    return read_authors_rows(authors_prefix_files(where), spec), kind


def run_config_path(path: str | os.PathLike) -> str:
    """Where the ``config.json`` of the run that ``path`` (or its folder) belongs to is, or
    would be: beside the samples, or, for an extra sample set of a finished run
    (``<run>/samples-<n>``, written by sampling the run again), the run's own."""
    path = os.fspath(path)
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    candidate = os.path.join(folder, "config.json")
    if not os.path.exists(candidate):
        run_dir = rundir.run_of_sample_set(folder)
        if run_dir is not None:
            return rundir.RunPaths(run_dir).config
    return candidate


def run_dir_config(path: str | os.PathLike) -> dict | None:
    """The ``config.json`` of the dclens run that ``path`` (or its folder) belongs to
    (:func:`run_config_path`; None if there is none); its data settings are under
    ``["train"]`` whichever method wrote it."""
    candidate = run_config_path(path)
    if not os.path.exists(candidate):
        return None
    with open(candidate) as stream:
        saved = json.load(stream)
    config = saved.get("config") if isinstance(saved, dict) else None
    if isinstance(config, dict) and "train" not in config and "dataset" in config:
        # Runs of the other methods (GS-WGAN, ...) keep the data settings at the top.
        config = {**config, "train": {"dataset": config["dataset"],
                                      "data_dir": config.get("data_dir"),
                                      "training_records": config.get("training_records",
                                                                     "all")}}
    return config
