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

Inputs (:func:`dclens.evaluation.synthetic_input.load_synthetic`): our ``samples.npz`` (or a run directory holding it), the
authors' pickle prefix (``.../eps-1.00.data`` for ``eps-1.00.data-0.pkl`` ..), one pickle
of rows, or any ``.npz`` with images and labels. Pickles can run code when loaded: read
only files you trust (``.npz`` files are read with ``allow_pickle=False``).

A note on the authors' scripts, for whoever compares: their Fashion-MNIST script reads
only ``--range`` pickles, default 1, into a 100,000-row array whose other rows stay zero
(zero image, all-zero label); our ``sen`` protocol uses every sample given.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable

import numpy as np

from dclens.evaluation import authors_protocol, classifiers, dpimagebench
from dclens import data
from dclens.data import splits
from dclens.common import export
from dclens.evaluation import quality as quality_scores
from dclens.evaluation.synthetic_input import (EvaluationError, base_dataset, load_synthetic,
                                               run_config_path, run_dir_config,
                                               train_split_name)

PROTOCOLS = {
    "val": ("real-test accuracy at the epoch with the best accuracy on a held-out part of "
            "the synthetic data (no test-set selection)"),
    "sen": ("best real-test accuracy over all epochs (the authors' protocol: selects on the "
            "test set, optimistic)"),
    "authors": ("the authors' evaluation script exactly: --range pickles in a 100,000-row "
                "zero array, SGD 600 epochs, best test accuracy (selects on the test set)"),
    "dpimagebench": ("DPImageBench's eval.mode=val: the mean of its classifiers that ran "
                     "(ResNet, WRN, ResNeXt), each trained on 55,000 of 60,000 samples, the "
                     "epoch chosen on 5,000 real training records the "
                     "synthesizer never read"),
}
HEADLINE = "val"


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


#: What classifiers are scored on (:attr:`EvalSettings.test_set`).
TEST = "test"
TUNING_HOLDOUT = "tuning_holdout"
TEST_SETS = (TEST, TUNING_HOLDOUT)


def scored_on(test_set: str) -> str:
    """The words for what a test set is, for logs."""
    return "the tuning holdout" if test_set == TUNING_HOLDOUT else "the real test set"


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
      test_set: what the classifiers are scored on: :data:`TEST` (the real test split)
        or :data:`TUNING_HOLDOUT` (the tuning split's holdout,
        :mod:`dclens.data.splits`): a screening run's scores, which may then choose
        hyper-parameters without having looked at the test set.
      sen_on_all_data: train a second classifier on all synthetic data for ``sen``.
      quality: compute domain-classifier IS/FID.
      quality_samples: synthetic (and real test) images used for IS/FID; FID depends on
        this number, compare only equal counts.
      domain: how the domain classifier is trained (part of its cache key).
      official: the schedule is the authors' (recorded, for the report).
      authors: also run the authors' evaluation script's protocol
        (:mod:`dclens.evaluation.authors_protocol`) with these settings; None: not run.
      dpimagebench: also run DPImageBench's protocol
        (:mod:`dclens.evaluation.dpimagebench`) with these settings; None: not run.
    """

    schedule: classifiers.Schedule = classifiers.DEFAULT_SCHEDULE
    val_fraction: float = 0.1
    seed: int = 0
    max_samples: int | None = None
    test_limit: int | None = None
    test_set: str = TEST
    sen_on_all_data: bool = False
    quality: bool = True
    quality_samples: int = 10_000
    domain: quality_scores.DomainSettings = quality_scores.DomainSettings()
    official: bool = False
    authors: authors_protocol.AuthorsProtocol | None = None
    dpimagebench: dpimagebench.DPImageBenchProtocol | None = None

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
        require(self.test_set in TEST_SETS,
                f"test_set must be one of {list(TEST_SETS)}, got {self.test_set!r}")
        require(isinstance(self.domain, quality_scores.DomainSettings),
                f"domain must be a DomainSettings, got {self.domain!r}")
        screening = self.test_set == TUNING_HOLDOUT
        require(self.dpimagebench is None or isinstance(self.dpimagebench,
                                                        dpimagebench.DPImageBenchProtocol),
                f"dpimagebench must be a DPImageBenchProtocol or None, got "
                f"{self.dpimagebench!r}")
        require(self.dpimagebench is None or not screening,
                "DPImageBench's protocol selects on tuning-split records and reports the "
                "test set; a screening evaluation (test_set tuning_holdout) cannot run it")
        tuned_domain = self.domain.training_records is splits.TrainingRecords.TUNING
        require(not self.quality or screening == tuned_domain,
                "a screening evaluation (test_set tuning_holdout) scores IS/FID with a domain "
                "classifier of the tuning split, and an ordinary one with one of all "
                "records; got test_set "
                f"{self.test_set!r} with a domain classifier of "
                f"{self.domain.training_records.value!r} records (use "
                "EvalSettings.for_screening())")

    def for_screening(self) -> "EvalSettings":
        """These settings scored on the tuning holdout, IS/FID with a domain classifier of
        the tuning split: nothing of the private records or the test set is looked at."""
        return self.replace(test_set=TUNING_HOLDOUT, domain=dataclasses.replace(
            self.domain, training_records=splits.TrainingRecords.TUNING))

    def replace(self, **changes) -> "EvalSettings":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values["schedule"] = self.schedule.to_dict()
        values["domain"] = self.domain.to_dict()
        values["authors"] = None if self.authors is None else self.authors.to_dict()
        if self.dpimagebench is None:
            del values["dpimagebench"]      # absent: the key of every earlier cache
        else:
            values["dpimagebench"] = self.dpimagebench.to_dict()
        if self.test_set == TEST:
            # Absent means the test split: the key of every cache written before the option.
            del values["test_set"]
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

def load_test(dataset: str, data_dir: str | os.PathLike | None = None, *,
              limit: int | None = None, test_set: str = TEST) -> data.LabeledImages:
    """The real test split of ``dataset``, or with ``test_set`` :data:`TUNING_HOLDOUT` the
    tuning holdout of its training split (first ``limit`` records if given)."""
    if test_set == TUNING_HOLDOUT:
        return splits.load_tuning_holdout(train_split_name(dataset), data_dir, limit=limit)
    if test_set != TEST:
        raise EvaluationError(f"test_set must be one of {list(TEST_SETS)}, got "
                              f"{test_set!r}")
    name = quality_scores.test_split_name(train_split_name(dataset))
    if name is None:
        raise EvaluationError(f"no real test split is known for dataset {dataset!r}; use "
                              f"mnist, fashion_mnist, celebA-gender or celebA-hair")
    return data.load_dataset(name, data_dir, split="test", limit=limit, progress=False)


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
    synthetic images (drawn with ``seed``) against the first ``samples`` real images of
    ``test`` (the test set, or a screening run's tuning holdout):
    :func:`dclens.evaluation.quality.quality_record`. The domain classifier is trained on the
    real training records ``domain`` names once and cached in ``cache_dir``."""
    classifier = quality_scores.domain_classifier(train_split_name(synthetic.spec.name),
                                                  data_dir, settings=domain,
                                                  cache_dir=cache_dir, log=log)
    scored = random_subset(synthetic, samples, seed)
    record = quality_scores.quality_record(
        classifier, scored.images, test.images[:samples], labels=scored.labels,
        reference_labels=test.labels[:samples])
    where = scored_on(TUNING_HOLDOUT if domain.training_records is splits.TrainingRecords.TUNING
                      else TEST)
    log(f"domain-classifier IS {record['inception_score']:.3f} ({where} "
        f"{record['reference_inception_score']:.3f}), FID to {where} "
        f"{record['fid']:.3f}, label agreement {record['label_agreement']:.4f} ({where} "
        f"{record['reference_label_agreement']:.4f}), checkerboard share "
        f"{record['checkerboard_share']:.4f} ({where} "
        f"{record['reference_checkerboard_share']:.4f})")
    return record


def evaluate(synthetic: data.LabeledImages, test: data.LabeledImages,
             settings: EvalSettings = EvalSettings(), *, data_dir: str | None = None,
             cache_dir: str | None = None, input_kind: str = "arrays",
             authors_state_path: str | os.PathLike | None = None,
             dpimagebench_state_prefix: str | None = None,
             log: Callable[[str], None] = print) -> dict:
    """Trains the classifier on ``synthetic``, measures it on ``test``; the JSON record.

    ``data_dir`` is where the real training data lies (for the domain classifier of
    IS/FID, trained once and cached in ``cache_dir``). ``authors_state_path``: the resume
    file of the authors' protocol (600 epochs: up to hours), so an interrupted evaluation
    continues its trajectory when run again (see :func:`run_authors_protocol`).
    ``dpimagebench_state_prefix``: the same for DPImageBench's protocol, one file per
    classifier (``<prefix>-<classifier>.npz``).
    """
    started = time.perf_counter()
    _check_inputs(synthetic, test, settings)
    dpimagebench_validation = None
    if settings.dpimagebench is not None:      # refused before any training if unusable
        dpimagebench.check_images(synthetic.spec)
        dpimagebench.classifier_training_rows(len(synthetic), settings.dpimagebench)
        dpimagebench_validation = dpimagebench.load_validation(
            train_split_name(synthetic.spec.name), data_dir, settings.dpimagebench)
    if settings.quality:
        _note_the_domain_classifier(synthetic, settings, data_dir, cache_dir, log)
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
    log(f"classifier: {len(train_idx)} train / {len(val_idx)} held-out val images "
        f"({input_kind}), {len(test)} real test images; {settings.schedule.optimizer} lr "
        f"{settings.schedule.learning_rate:g}, batch {settings.schedule.batch_size}, "
        f"{settings.schedule.epochs} epochs")
    curves = _fit(synthetic.images[train_idx], synthetic.labels[train_idx], test, settings,
                  seeds, log, validation=(synthetic.images[val_idx], synthetic.labels[val_idx]))
    chosen = select_by_validation(curves["val_accuracy"])        # never sees test labels
    protocols = {"val": {"accuracy": curves["test_accuracy"][chosen], "epoch": chosen + 1,
                         "val_accuracy": curves["val_accuracy"][chosen],
                         "description": PROTOCOLS["val"]}}
    sen_curves = None
    if settings.sen_on_all_data:
        log("sen protocol: a second classifier on all synthetic samples (as the authors)")
        sen_curves = _fit(synthetic.images, synthetic.labels, test, settings, seeds, log)
    protocols["sen"] = _sen_protocol(curves, sen_curves)
    log(f"accuracy on {scored_on(settings.test_set)}: val protocol {protocols['val']['accuracy']:.4f} "
        f"(epoch {protocols['val']['epoch']}), sen protocol "
        f"{protocols['sen']['accuracy']:.4f} (epoch {protocols['sen']['epoch']})")
    if settings.authors is not None:
        protocols[authors_key(settings.authors)] = run_authors_protocol(
            as_given, test, settings.authors, seed=seeds["init"],
            state_path=authors_state_path, log=log)
    if settings.dpimagebench is not None:
        protocols["dpimagebench"] = dpimagebench.run_dpimagebench(
            as_given, test, settings.dpimagebench, seed=seeds["init"],
            validation=dpimagebench_validation, state_prefix=dpimagebench_state_prefix, log=log)
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


def _check_inputs(synthetic: data.LabeledImages, test: data.LabeledImages,
                  settings: EvalSettings) -> None:
    """Refuses, before any training, inputs the protocols cannot use."""
    if synthetic.spec.image_shape != test.spec.image_shape:
        raise EvaluationError(f"synthetic images are {synthetic.spec.image_shape} but the test "
                              f"images are {test.spec.image_shape}")
    if synthetic.spec.num_classes != test.spec.num_classes:
        raise EvaluationError(f"synthetic data has {synthetic.spec.num_classes} classes, the "
                              f"test data {test.spec.num_classes}")
    if len(test) == 0:
        raise EvaluationError(f"the test data ({test.source}) is empty")
    authors = settings.authors
    if authors is not None and len(synthetic) < authors.real_rows:
        fits = len(synthetic) // authors.rows_per_pickle
        remedy = (f"lower --range to at most {fits} or give more samples" if fits else
                  f"give at least {authors.rows_per_pickle} samples (one pickle), or drop "
                  f"--protocol authors")
        raise EvaluationError(
            f"--range {authors.range} reads {authors.real_rows} samples (the authors' "
            f"{authors.rows_per_pickle} per pickle) but only {len(synthetic)} are given; "
            f"{remedy}")


def _note_the_domain_classifier(synthetic: data.LabeledImages, settings: EvalSettings,
                                data_dir: str | None, cache_dir: str | None,
                                log: Callable[[str], None]) -> None:
    """Says up front when IS/FID will first train their domain classifier (minutes)."""
    if quality_scores.cached_model_path(
            train_split_name(synthetic.spec.name), data_dir, settings=settings.domain,
            cache_dir=cache_dir) is not None:
        return
    epochs = settings.domain.schedule.epochs
    screening = settings.domain.training_records is splits.TrainingRecords.TUNING
    records = "the tuning split's records" if screening else "the real training split"
    log(f"note: IS/FID need a domain classifier, trained once on {records} "
        f"and then cached ({cache_dir or quality_scores.default_cache_dir()}): {epochs} "
        f"epochs, about {epochs * quality_scores.DOMAIN_SECONDS_PER_EPOCH_2_CORES / 60:.0f}"
        " min on 2 CPU cores for Fashion-MNIST's whole training split, after the "
        "classifiers below; --no_quality skips it")


def _fit(images: np.ndarray, labels: np.ndarray, test: data.LabeledImages,
         settings: EvalSettings, seeds: dict, log: Callable[[str], None], *,
         validation: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
    """A fresh classifier (the same initial weights every time) trained on (images,
    labels); its per-epoch curves on ``validation`` (if given) and the real test set."""
    spec = test.spec
    model = classifiers.build_classifier(spec.image_shape, spec.num_classes,
                                         seed=seeds["init"])
    classifiers.compile_for(model, settings.schedule)
    monitors = {} if validation is None else {"val": validation}
    monitors["test"] = (test.images, test.labels)
    return classifiers.fit_with_curves(model, images, labels, schedule=settings.schedule,
                                       seed=seeds["shuffle"], monitors=monitors, log=log)


def _sen_protocol(curves: dict, sen_curves: dict | None) -> dict:
    """The authors' selection: the epoch of best *test* accuracy (reported, never a
    headline), of the all-samples classifier if one was trained, else of the val run's."""
    source_curves = sen_curves if sen_curves is not None else curves
    best = select_by_test(source_curves["test_accuracy"])
    return {"accuracy": source_curves["test_accuracy"][best], "epoch": best + 1,
            "trained_on": "all synthetic samples" if sen_curves is not None
            else "the non-held-out synthetic samples (same run as val)",
            "description": PROTOCOLS["sen"]}


def evaluate_path(path: str | os.PathLike, dataset: str | None = None, *,
                  data_dir: str | None = None, settings: EvalSettings = EvalSettings(),
                  cache_dir: str | None = None,
                  authors_state_path: str | os.PathLike | None = None,
                  dpimagebench_state_prefix: str | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """:func:`evaluate` for samples on disk; dataset/data_dir default to the run's config."""
    saved = run_dir_config(path)
    if dataset is None:
        dataset = saved["train"]["dataset"] if saved else "fashion_mnist"
    if data_dir is None and saved:
        data_dir = saved["train"].get("data_dir")
    synthetic, kind = load_synthetic(path, dataset)
    test = load_test(dataset, data_dir, limit=settings.test_limit,
                     test_set=settings.test_set)
    record = evaluate(synthetic, test, settings, data_dir=data_dir, cache_dir=cache_dir,
                      input_kind=kind, authors_state_path=authors_state_path,
                      dpimagebench_state_prefix=dpimagebench_state_prefix, log=log)
    record["input"]["path"] = os.fspath(path)
    return record


def evaluate_real(dataset: str, data_dir: str | None = None, *,
                  settings: EvalSettings = EvalSettings(), cache_dir: str | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """The reference row: the same classifier trained on the real training data (for a
    screening evaluation, on the tuning split's training records)."""
    records = (splits.TrainingRecords.TUNING if settings.test_set == TUNING_HOLDOUT
               else splits.TrainingRecords.ALL)
    real = splits.load_training_records(train_split_name(dataset), data_dir, records,
                                        progress=False)
    test = load_test(dataset, data_dir, limit=settings.test_limit,
                     test_set=settings.test_set)
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
