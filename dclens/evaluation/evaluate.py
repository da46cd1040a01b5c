"""Downstream evaluation of synthetic data: train on synthetic, test on real (paper Table 1).

DataLens is judged by the accuracy, on the *real* test split, of a classifier trained on
its synthetic samples. Two protocols are reported, always by name:

``val`` (the headline)
    A stratified, seeded part of the *synthetic* data (``val_fraction``) is held out.
    The classifier trains on the rest; after every epoch it is measured on the held-out
    synthetic part and on the real test set. The reported number is the real-test
    accuracy of the epoch with the best *validation* accuracy. The choice of epoch is
    :func:`select_by_validation`, a pure function of the validation curve: it never sees
    a test label, so the test set is used for measuring only.

``sen`` (the authors')
    The best real-test accuracy over all epochs, as the authors' evaluation scripts
    print ("Max eval acc"). This selects on the test set and is optimistic; it is here
    to be put beside the paper's numbers. By default it is read from the same training
    run as ``val`` (trained on the non-held-out part); ``sen_on_all_data`` trains a second
    classifier on *all* synthetic samples, as the authors do.

The classifier and its schedules are in :mod:`dclens.evaluation.classifiers`; the visual-quality
scores (domain-classifier IS/FID) in :mod:`dclens.evaluation.quality`.

Inputs (:func:`load_synthetic`): our ``samples.npz`` (or a run directory holding it), the
authors' pickle prefix (``.../eps-1.00.data`` for ``eps-1.00.data-0.pkl`` ..), one pickle
of rows, or any ``.npz`` with images and labels. Pickles can run code when loaded: read
only files you trust (``.npz`` files are read with ``allow_pickle=False``).

A note on the authors' scripts, for whoever compares: their Fashion-MNIST script reads
only ``--range`` pickles, default 1, into a 100,000-row array whose other rows stay zero
(zero image, all-zero label); our ``sen`` protocol uses every sample given.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import pickle
import zipfile
import re
import time
from typing import Callable

import numpy as np

from dclens.evaluation import authors_protocol, classifiers
from dclens import data
from dclens.common import export
from dclens.evaluation import quality as quality_scores

PROTOCOLS = {
    "val": ("real-test accuracy at the epoch with the best accuracy on a held-out part of "
            "the synthetic data (no test-set selection)"),
    "sen": ("best real-test accuracy over all epochs (the authors' protocol: selects on the "
            "test set, optimistic)"),
    "authors": ("the authors' evaluation script exactly: --range pickles in a 100,000-row "
                "zero array, SGD 600 epochs, best test accuracy (selects on the test set)"),
}
HEADLINE = "val"
SAMPLES_FILE = "samples.npz"
_NPZ_KEYS = (("x", "y"), ("images", "labels"), ("x_train", "y_train"), ("X", "Y"))


class EvaluationError(ValueError):
    """Inputs the evaluation cannot use; the message says which file and what to do."""


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Everything that decides an evaluation's numbers (recorded in its JSON).

    Attributes:
      schedule: the classifier's training schedule.
      val_fraction: part of the synthetic data held out for the ``val`` protocol.
      seed: root of every seed (subset, split, initialisation/dropout, shuffles).
      max_samples: evaluate a seeded random subset of this many synthetic samples
        (None = all).
      test_limit: use only the first ``test_limit`` real test records (None = all).
      sen_on_all_data: train a second classifier on all synthetic data for ``sen``.
      quality: compute domain-classifier IS/FID.
      quality_samples: synthetic (and real test) images used for IS/FID; FID depends on
        this number, compare only equal counts.
      domain: how the domain classifier is trained (part of its cache key).
      official: the schedule is the authors' (recorded, for the report).
      authors: also run the authors' evaluation script's protocol
        (:mod:`dclens.evaluation.authors_protocol`) with these settings; None: not run.
    """

    schedule: classifiers.Schedule = classifiers.DEFAULT_SCHEDULE
    val_fraction: float = 0.1
    seed: int = 0
    max_samples: int | None = None
    test_limit: int | None = None
    sen_on_all_data: bool = False
    quality: bool = True
    quality_samples: int = 10_000
    domain: quality_scores.DomainSettings = quality_scores.DomainSettings()
    official: bool = False
    authors: authors_protocol.AuthorsProtocol | None = None

    def __post_init__(self) -> None:
        def require(condition: bool, message: str) -> None:
            if not condition:
                raise EvaluationError(message)

        require(isinstance(self.schedule, classifiers.Schedule),
                f"schedule must be a Schedule, got {self.schedule!r}")
        require(isinstance(self.val_fraction, (int, float))
                and not isinstance(self.val_fraction, bool)
                and 0 < self.val_fraction <= 0.5,
                f"val_fraction must be in (0, 0.5], got {self.val_fraction!r}")
        require(_is_int(self.seed) and self.seed >= 0,
                f"seed must be an integer >= 0, got {self.seed!r}")
        for name in ("max_samples", "test_limit"):
            value = getattr(self, name)
            require(value is None or (_is_int(value) and value >= 1),
                    f"{name} must be None or an integer >= 1, got {value!r}")
        require(_is_int(self.quality_samples) and self.quality_samples >= 2,
                f"quality_samples must be an integer >= 2, got {self.quality_samples!r}")
        require(isinstance(self.domain, quality_scores.DomainSettings),
                f"domain must be a DomainSettings, got {self.domain!r}")

    def replace(self, **changes) -> "EvalSettings":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["schedule"] = self.schedule.to_dict()
        values["domain"] = self.domain.to_dict()
        values["authors"] = None if self.authors is None else self.authors.to_dict()
        return values

    def seeds(self) -> dict[str, int]:
        """The derived seeds: subset, split, init (weights + dropout), shuffle, quality."""
        names = ("subset", "split", "init", "shuffle", "quality")
        state = np.random.SeedSequence(self.seed).generate_state(len(names), np.uint32) >> 1
        return {name: int(value) for name, value in zip(names, state)}


def official_settings(dataset: str, **changes) -> EvalSettings:
    """The authors' schedule for ``dataset`` and ``sen`` trained on all data."""
    base = EvalSettings(schedule=classifiers.official_schedule(base_dataset(dataset)),
                        sen_on_all_data=True, official=True)
    return base.replace(**changes)


# ------------------------------------------------------------------ dataset names

def base_dataset(name: str) -> str:
    """``celebA-gender-train`` -> ``celebA-gender``; ``fashion_mnist`` unchanged."""
    if name.startswith("celebA-") and name.count("-") == 2:
        return name.rsplit("-", 1)[0]
    return name


def train_split_name(name: str) -> str:
    """The name that loads the real training data for ``name``."""
    base = base_dataset(name)
    return f"{base}-train" if base.startswith("celebA-") else base


def load_test(dataset: str, data_dir: str | os.PathLike | None = None, *,
              limit: int | None = None) -> data.LabeledImages:
    """The real test split of ``dataset`` (first ``limit`` records if given)."""
    name = quality_scores.test_split_name(train_split_name(dataset))
    if name is None:
        raise EvaluationError(f"no real test split is known for dataset {dataset!r}; use "
                              f"mnist, fashion_mnist, celebA-gender or celebA-hair")
    return data.load_dataset(name, data_dir, split="test", limit=limit, progress=False)


# ------------------------------------------------------------------ reading synthetic data

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


def run_dir_config(path: str | os.PathLike) -> dict | None:
    """The ``config.json`` of the dclens run that ``path`` (or its folder) belongs to; its
    data settings are under ``["train"]`` whichever method wrote it."""
    path = os.fspath(path)
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    candidate = os.path.join(folder, "config.json")
    if not os.path.exists(candidate):
        return None
    with open(candidate) as stream:
        saved = json.load(stream)
    config = saved.get("config") if isinstance(saved, dict) else None
    if isinstance(config, dict) and "train" not in config and "dataset" in config:
        # Runs of the other methods (GS-WGAN, ...) keep the data settings at the top.
        config = {**config, "train": {"dataset": config["dataset"],
                                      "data_dir": config.get("data_dir")}}
    return config


# ------------------------------------------------------------------ protocol pieces

def split_validation(labels: np.ndarray, fraction: float, *, seed: int,
                     num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified (train, val) index arrays: ``round(fraction * n_c)`` of each class to val.

    Classes with a single sample stay in train. Deterministic in ``seed``.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train, val = [], []
    for c in range(num_classes):
        members = rng.permutation(np.flatnonzero(labels == c))
        n = len(members)
        take = 0 if n < 2 else min(max(int(round(fraction * n)), 1), n - 1)
        val.append(members[:take])
        train.append(members[take:])
    train_idx = rng.permutation(np.concatenate(train)).astype(np.int64)
    val_idx = np.sort(np.concatenate(val)).astype(np.int64)
    return train_idx, val_idx


def select_by_validation(val_accuracy) -> int:
    """Index of the epoch to report under ``val``: the best validation accuracy.

    Ties go to the earliest epoch. Takes only the validation curve: the real test set
    cannot influence the choice.
    """
    curve = np.asarray(list(val_accuracy), dtype=np.float64)
    if curve.size == 0 or not np.any(np.isfinite(curve)):
        raise EvaluationError("no finite validation accuracy to select an epoch from")
    return int(np.nanargmax(curve))


def select_by_test(test_accuracy) -> int:
    """Index of the epoch reported under ``sen`` (the authors'): the best test accuracy."""
    curve = np.asarray(list(test_accuracy), dtype=np.float64)
    if curve.size == 0:
        raise EvaluationError("empty test-accuracy curve")
    return int(np.nanargmax(curve))


# ------------------------------------------------------------------ the evaluation

def random_subset(images: data.LabeledImages, size: int | None,
                  seed: int) -> data.LabeledImages:
    """``size`` images drawn without replacement with ``seed`` (in their given order);
    all of them when ``size`` is None or not smaller."""
    if size is None or size >= len(images):
        return images
    keep = np.sort(np.random.default_rng(seed).permutation(len(images))[:size])
    return data.LabeledImages(images.images[keep], images.labels[keep], images.spec,
                              f"{images.source} (random subset of {size})")


def _warnings_for(synthetic: data.LabeledImages) -> list[str]:
    counts = np.bincount(synthetic.labels, minlength=synthetic.spec.num_classes)
    missing = [synthetic.spec.class_names[c] for c in np.flatnonzero(counts == 0)]
    found = []
    if missing:
        found.append(f"class(es) missing from the synthetic data: {', '.join(missing)}; the "
                     f"classifier cannot predict them, accuracy is capped accordingly")
    return found


def authors_key(protocol: authors_protocol.AuthorsProtocol) -> str:
    """The record's protocol name for the authors' script read with ``--range R``."""
    return f"authors_range{protocol.range}"


def run_authors_protocol(synthetic: data.LabeledImages, test: data.LabeledImages,
                         protocol: authors_protocol.AuthorsProtocol, *, seed: int,
                         state_path: str | os.PathLike | None = None,
                         log: Callable[[str], None] = print) -> dict:
    """The authors' protocol on the samples in their given order (their script reads the
    first pickles); the record's protocol entry. ``state_path``: resume file (see
    :func:`dclens.evaluation.authors_protocol.train_authors_protocol`)."""
    log(f"authors protocol: {protocol.epochs} epochs of SGD over the first "
        f"{protocol.real_rows} samples in a {protocol.rows}-row zero array")
    result = authors_protocol.train_authors_protocol(synthetic, test, protocol, seed=seed,
                                                     state_path=state_path, log=log)
    entry = {key: result[key] for key in ("accuracy", "epoch", "settings", "authors_settings",
                                          "path", "seconds", "finished", "seed",
                                          "description")}
    entry["curve"] = result["curves"]
    log(f"authors protocol (range {protocol.range}): {result['accuracy']:.4f} (epoch "
        f"{result['epoch']}, {result['seconds']:.0f} s)")
    return entry


def authors_entries(protocols: dict) -> list[dict]:
    """The record's authors-protocol entries, by range."""
    return sorted((p for key, p in protocols.items() if key.startswith("authors")),
                  key=lambda p: p["settings"]["range"])


def score_quality(synthetic: data.LabeledImages, test: data.LabeledImages, *, samples: int,
                  seed: int,
                  domain: quality_scores.DomainSettings = quality_scores.DomainSettings(),
                  data_dir: str | None = None, cache_dir: str | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """Domain-classifier IS, FID and label agreement of a random subset of ``samples``
    synthetic images (drawn with ``seed``) against the first ``samples`` real test images:
    :func:`dclens.evaluation.quality.quality_record`. The domain classifier is trained on the real
    training split once and cached in ``cache_dir``."""
    classifier = quality_scores.domain_classifier(train_split_name(synthetic.spec.name),
                                                  data_dir, settings=domain,
                                                  cache_dir=cache_dir, log=log)
    scored = random_subset(synthetic, samples, seed)
    record = quality_scores.quality_record(
        classifier, scored.images, test.images[:samples], labels=scored.labels,
        reference_labels=test.labels[:samples])
    log(f"domain-classifier IS {record['inception_score']:.3f} (real test "
        f"{record['reference_inception_score']:.3f}), FID to the real test set "
        f"{record['fid']:.3f}, label agreement {record['label_agreement']:.4f} (real test "
        f"{record['reference_label_agreement']:.4f})")
    return record


def evaluate(synthetic: data.LabeledImages, test: data.LabeledImages,
             settings: EvalSettings = EvalSettings(), *, data_dir: str | None = None,
             cache_dir: str | None = None, input_kind: str = "arrays",
             authors_state_path: str | os.PathLike | None = None,
             log: Callable[[str], None] = print) -> dict:
    """Trains the classifier on ``synthetic``, measures it on ``test``; the JSON record.

    ``data_dir`` is where the real training data lies (for the domain classifier of
    IS/FID, trained once and cached in ``cache_dir``). ``authors_state_path``: the resume
    file of the authors' protocol (600 epochs: up to hours), so an interrupted evaluation
    continues its trajectory when run again (see :func:`run_authors_protocol`).
    """
    started = time.perf_counter()
    if synthetic.spec.image_shape != test.spec.image_shape:
        raise EvaluationError(f"synthetic images are {synthetic.spec.image_shape} but the test "
                              f"images are {test.spec.image_shape}")
    if synthetic.spec.num_classes != test.spec.num_classes:
        raise EvaluationError(f"synthetic data has {synthetic.spec.num_classes} classes, the "
                              f"test data {test.spec.num_classes}")
    if len(test) == 0:
        raise EvaluationError(f"the test data ({test.source}) is empty")
    if settings.quality and quality_scores.cached_model_path(
            train_split_name(synthetic.spec.name), data_dir, settings=settings.domain,
            cache_dir=cache_dir) is None:
        epochs = settings.domain.schedule.epochs
        log(f"note: IS/FID need a domain classifier, trained once on the real training split "
            f"and then cached ({cache_dir or quality_scores.default_cache_dir()}): {epochs} "
            f"epochs, about {epochs * quality_scores.DOMAIN_SECONDS_PER_EPOCH_2_CORES / 60:.0f}"
            " min on 2 CPU cores for Fashion-MNIST, after the classifiers below; "
            "--no_quality skips it")
    seeds = settings.seeds()
    given = len(synthetic)
    as_given = synthetic              # the authors' protocol reads the first samples given
    synthetic = random_subset(synthetic, settings.max_samples, seeds["subset"])
    warnings = _warnings_for(synthetic)
    for warning in warnings:
        log(f"warning: {warning}")
    spec = synthetic.spec
    train_idx, val_idx = split_validation(synthetic.labels, settings.val_fraction,
                                          seed=seeds["split"], num_classes=spec.num_classes)
    if len(val_idx) == 0 or len(train_idx) == 0:
        raise EvaluationError(f"{len(synthetic)} synthetic samples are too few to hold out a "
                              f"validation part (val_fraction={settings.val_fraction}); give "
                              f"more samples")
    x_train, y_train = synthetic.images[train_idx], synthetic.labels[train_idx]
    x_val, y_val = synthetic.images[val_idx], synthetic.labels[val_idx]
    log(f"classifier: {len(train_idx)} train / {len(val_idx)} held-out val images "
        f"({input_kind}), {len(test)} real test images; {settings.schedule.optimizer} lr "
        f"{settings.schedule.learning_rate:g}, batch {settings.schedule.batch_size}, "
        f"{settings.schedule.epochs} epochs")
    model = classifiers.build_classifier(spec.image_shape, spec.num_classes,
                                         seed=seeds["init"])
    classifiers.compile_for(model, settings.schedule)
    curves = classifiers.fit_with_curves(
        model, x_train, y_train, schedule=settings.schedule, seed=seeds["shuffle"],
        monitors={"val": (x_val, y_val), "test": (test.images, test.labels)}, log=log)
    del model

    chosen = select_by_validation(curves["val_accuracy"])        # never sees test labels
    protocols = {"val": {"accuracy": curves["test_accuracy"][chosen], "epoch": chosen + 1,
                         "val_accuracy": curves["val_accuracy"][chosen],
                         "description": PROTOCOLS["val"]}}
    sen_curves = None
    if settings.sen_on_all_data:
        log("sen protocol: a second classifier on all synthetic samples (as the authors)")
        model = classifiers.build_classifier(spec.image_shape, spec.num_classes,
                                             seed=seeds["init"])
        classifiers.compile_for(model, settings.schedule)
        sen_curves = classifiers.fit_with_curves(
            model, synthetic.images, synthetic.labels, schedule=settings.schedule,
            seed=seeds["shuffle"], monitors={"test": (test.images, test.labels)}, log=log)
        del model
    source_curves = sen_curves if sen_curves is not None else curves
    best = select_by_test(source_curves["test_accuracy"])
    protocols["sen"] = {"accuracy": source_curves["test_accuracy"][best], "epoch": best + 1,
                        "trained_on": "all synthetic samples" if sen_curves is not None
                        else "the non-held-out synthetic samples (same run as val)",
                        "description": PROTOCOLS["sen"]}
    log(f"accuracy on the real test set: val protocol {protocols['val']['accuracy']:.4f} "
        f"(epoch {protocols['val']['epoch']}), sen protocol "
        f"{protocols['sen']['accuracy']:.4f} (epoch {protocols['sen']['epoch']})")

    if settings.authors is not None:
        protocols[authors_key(settings.authors)] = run_authors_protocol(
            as_given, test, settings.authors, seed=seeds["init"],
            state_path=authors_state_path, log=log)

    quality_result = None
    if settings.quality:
        quality_result = score_quality(synthetic, test, samples=settings.quality_samples,
                                       seed=seeds["quality"], domain=settings.domain,
                                       data_dir=data_dir, cache_dir=cache_dir, log=log)

    import keras
    import tensorflow as tf

    return {
        "dataset": base_dataset(spec.name),
        "input": {"kind": input_kind, "source": synthetic.source, "given_samples": given,
                  "samples": len(synthetic),
                  "class_counts": np.bincount(synthetic.labels,
                                              minlength=spec.num_classes).tolist()},
        "test": {"source": test.source, "samples": len(test)},
        "classifier": {"architecture": "authors_classifier (Conv32 k3, MaxPool 2, Dropout .2, "
                                       "Conv64 k3, Dropout .25, Dense 64, Dense softmax)",
                       "schedule": settings.schedule.to_dict(),
                       "official_schedule": settings.official},
        "split": {"val_fraction": settings.val_fraction, "train": int(len(train_idx)),
                  "val": int(len(val_idx)), "stratified": True},
        "settings": settings.to_dict(),
        "seeds": {"root": settings.seed, **seeds},
        "headline": HEADLINE,
        "protocols": protocols,
        "curves": curves,
        "sen_curves": sen_curves,
        "quality": quality_result,
        "warnings": warnings,
        "seconds": time.perf_counter() - started,
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    }


def evaluate_path(path: str | os.PathLike, dataset: str | None = None, *,
                  data_dir: str | None = None, settings: EvalSettings = EvalSettings(),
                  cache_dir: str | None = None,
                  authors_state_path: str | os.PathLike | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """:func:`evaluate` for samples on disk; dataset/data_dir default to the run's config."""
    saved = run_dir_config(path)
    if dataset is None:
        dataset = saved["train"]["dataset"] if saved else "fashion_mnist"
    if data_dir is None and saved:
        data_dir = saved["train"].get("data_dir")
    synthetic, kind = load_synthetic(path, dataset)
    test = load_test(dataset, data_dir, limit=settings.test_limit)
    record = evaluate(synthetic, test, settings, data_dir=data_dir, cache_dir=cache_dir,
                      input_kind=kind, authors_state_path=authors_state_path, log=log)
    record["input"]["path"] = os.fspath(path)
    return record


def evaluate_real(dataset: str, data_dir: str | None = None, *,
                  settings: EvalSettings = EvalSettings(), cache_dir: str | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """The reference row: the same classifier trained on the real training data."""
    real = data.load_dataset(train_split_name(dataset), data_dir, split="train",
                             progress=False)
    test = load_test(dataset, data_dir, limit=settings.test_limit)
    return evaluate(real, test, settings, data_dir=data_dir, cache_dir=cache_dir,
                    input_kind="real_train", log=log)


def cached_real_reference(dataset: str, data_dir: str | None = None, *,
                          settings: EvalSettings = EvalSettings(),
                          cache_dir: str | None = None,
                          log: Callable[[str], None] = print) -> dict:
    """:func:`evaluate_real`, cached (JSON) in the cache dir under a hash of its inputs."""
    import hashlib

    cache_dir = cache_dir or quality_scores.default_cache_dir()
    where = "default" if data_dir is None else os.path.abspath(data_dir)
    blob = json.dumps({"dataset": base_dataset(dataset), "data_dir": where,
                       "settings": settings.to_dict(), "version": 1}, sort_keys=True)
    key = hashlib.sha256(blob.encode()).hexdigest()[:12]
    path = os.path.join(cache_dir, f"real-reference-{base_dataset(dataset)}-{key}.json")
    if os.path.exists(path):
        log(f"real-data reference: cached {path}")
        with open(path) as stream:
            return json.load(stream)
    log("real-data reference: training the same classifier on the real training data")
    record = evaluate_real(dataset, data_dir, settings=settings, cache_dir=cache_dir, log=log)
    export.write_json(path, record)
    return record


# ------------------------------------------------------------------ outputs

def plot_curves(record: dict, path: str | os.PathLike, *, title: str = "") -> None:
    """PNG of the per-epoch accuracies with both protocols' epochs marked."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    curves = record["curves"]
    figure = pyplot.figure(figsize=(6.4, 4.0), dpi=100)
    axes = figure.add_subplot(1, 1, 1)
    epochs = curves["epoch"]
    axes.plot(epochs, curves["train_accuracy"], color="0.6",
              label="train part (running, dropout on)")
    axes.plot(epochs, curves["val_accuracy"], color="tab:blue", label="held-out val part")
    axes.plot(epochs, curves["test_accuracy"], color="tab:red", label="real test")
    if record.get("sen_curves"):
        axes.plot(record["sen_curves"]["epoch"], record["sen_curves"]["test_accuracy"],
                  color="tab:orange", linestyle="--", label="real test (sen, all data)")
    val, sen = record["protocols"]["val"], record["protocols"]["sen"]
    axes.axvline(val["epoch"], color="tab:blue", linestyle=":",
                 label=f"val protocol: {val['accuracy']:.4f} (epoch {val['epoch']})")
    axes.axvline(sen["epoch"], color="tab:red", linestyle=":",
                 label=f"sen protocol: {sen['accuracy']:.4f} (epoch {sen['epoch']})")
    longest = max(epochs)
    for authors, color in zip(authors_entries(record["protocols"]),
                              ("tab:green", "tab:purple", "tab:brown", "tab:olive")):
        axes.plot(authors["curve"]["epoch"], authors["curve"]["test_accuracy"],
                  color=color, linewidth=0.8,
                  label=f"real test (authors protocol, range "
                        f"{authors['settings']['range']}): best {authors['accuracy']:.4f} "
                        f"(epoch {authors['epoch']})")
        longest = max(longest, max(authors["curve"]["epoch"]))
    axes.set_xlabel("epoch")
    axes.set_ylabel("accuracy")
    if longest > 100:
        axes.set_xscale("log")        # tens of epochs beside the authors' 600
    else:
        axes.xaxis.get_major_locator().set_params(integer=True)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    axes.set_title(title or f"{record['dataset']}: classifier trained on "
                   f"{record['input']['kind']} ({record['input']['samples']} samples)",
                   fontsize=9)
    figure.tight_layout()
    export.atomic_write(path, lambda s: figure.savefig(s, format="png"))
    pyplot.close(figure)


def authors_state_file(out_dir: str | os.PathLike, name: str,
                       protocol: authors_protocol.AuthorsProtocol) -> str:
    """Where ``scripts/evaluate.py`` keeps the authors' protocol's resume state: beside
    the outputs, ``<out>/<name>-authors-range<R>.npz`` (kept after the end, so the same
    evaluation run again returns at once; another input or setting is refused by name)."""
    return os.path.join(os.fspath(out_dir), f"{name}-authors-range{protocol.range}.npz")


def write_outputs(record: dict, out_dir: str | os.PathLike,
                  name: str = "evaluation") -> dict[str, str]:
    """``<name>.json`` and ``<name>.png`` in ``out_dir`` (atomic); returns their paths."""
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, f"{name}.json"),
             "png": os.path.join(out_dir, f"{name}.png")}
    export.write_json(paths["json"], record)
    plot_curves(record, paths["png"])
    return paths


def summary_line(record: dict) -> str:
    """One line with both protocols and the quality scores."""
    p = record["protocols"]
    text = (f"{record['dataset']}: val {p['val']['accuracy']:.4f} (headline) | "
            f"sen {p['sen']['accuracy']:.4f}")
    for authors in authors_entries(p):
        text += f" | authors (range {authors['settings']['range']}) {authors['accuracy']:.4f}"
    text += f" | {record['input']['samples']} samples"
    if record.get("quality"):
        q = record["quality"]
        text += (f" | domain IS {q['inception_score']:.3f} (real "
                 f"{q['reference_inception_score']:.3f}) | domain FID {q['fid']:.3f}")
    return text
