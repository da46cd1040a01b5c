"""Visual quality of samples: Inception Score and FID measured with a *domain* classifier.

The usual Inception Score (IS) and Frechet Inception Distance (FID) use an ImageNet
Inception-v3 network. Its weights cannot be fetched on these machines, and on 28x28
grey images they say little anyway, so -- as GS-WGAN does for its MNIST IS -- both are
computed here with a classifier trained on the dataset's *real training split*:

* IS  = exp(E_x KL(p(y|x) || p(y))) on that classifier's softmax outputs (mean and
  standard deviation over ``splits`` disjoint splits). Its range is [1, classes].
* FID = ||mu_1 - mu_2||^2 + Tr(S_1 + S_2 - 2 (S_1 S_2)^(1/2)) between the Gaussians fitted
  to the classifier's penultimate-layer features (the Dense 64 layer of the authors'
  classifier, :data:`dclens.evaluation.classifiers.FEATURE_LAYER`).

**These numbers are domain-classifier IS/FID**: they compare runs that use the same
domain classifier (same dataset, same settings: see :func:`DomainSettings.key`) and are
not comparable with ImageNet-Inception IS/FID in papers.

The domain classifier is trained once and cached in ``$DCLENS_CACHE`` (default
``~/.cache/dclens``) under a name keyed by the dataset, the data location and a hash of
its training settings; it is written atomically (a temporary file renamed into place).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import warnings
from typing import Callable

import numpy as np

from dclens.evaluation import classifiers
from dclens import data
from dclens.data import splits
from dclens.common import export

CACHE_ENV = "DCLENS_CACHE"
NOTE = ("domain-classifier IS/FID: computed with the authors' CNN trained on the real "
        "training split of this dataset (not ImageNet Inception-v3), as GS-WGAN's MNIST IS; "
        "comparable only with numbers from the same domain classifier (same cache key)")


def default_cache_dir() -> str:
    """``$DCLENS_CACHE`` if set, else ``~/.cache/dclens``."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                                     "dclens")


# ------------------------------------------------------------------ the two scores

def inception_score(probabilities: np.ndarray, splits: int = 10) -> tuple[float, float]:
    """IS of softmax rows ``probabilities`` [N, K]: (mean, std) over ``splits`` splits."""
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 2 or len(p) == 0:
        raise ValueError(f"probabilities must be a non-empty [N, classes] array, got shape "
                         f"{p.shape}")
    if not 1 <= splits <= len(p):
        raise ValueError(f"splits must be in [1, {len(p)}] for {len(p)} rows, got {splits}")
    eps = 1e-12
    scores = []
    for part in np.array_split(p, splits):
        marginal = part.mean(axis=0, keepdims=True)
        kl = np.sum(part * (np.log(part + eps) - np.log(marginal + eps)), axis=1)
        scores.append(float(np.exp(kl.mean())))
    return float(np.mean(scores)), float(np.std(scores))


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (float64) of feature rows [N, D]; needs N >= 2."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"need at least 2 feature rows [N, D], got shape {f.shape}")
    return f.mean(axis=0), np.cov(f, rowvar=False)


def frechet_distance(mu1: np.ndarray, cov1: np.ndarray, mu2: np.ndarray,
                     cov2: np.ndarray) -> float:
    """Frechet distance between N(mu1, cov1) and N(mu2, cov2) (scipy.linalg.sqrtm)."""
    diff = mu1 - mu2
    covmean = _sqrtm(cov1 @ cov2)
    if covmean is None:
        # Singular product (e.g. ReLU features that are always 0): regularise both
        # covariances a little, as the reference FID implementations do.
        offset = np.eye(len(cov1)) * 1e-6
        covmean = _sqrtm((cov1 + offset) @ (cov2 + offset))
        if covmean is None:
            raise ValueError("the feature covariances are too degenerate for FID")
    value = float(diff @ diff + np.trace(cov1) + np.trace(cov2) - 2.0 * np.trace(covmean))
    return max(value, 0.0)   # tiny negative values are round-off


def _sqrtm(matrix: np.ndarray) -> np.ndarray | None:
    """Real part of the principal square root, or None where it is inaccurate."""
    import scipy.linalg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # singular-matrix warnings: checked below
        root = scipy.linalg.sqrtm(matrix)
    if not np.all(np.isfinite(root)):
        return None
    scale = max(np.linalg.norm(matrix), 1e-30)
    if np.linalg.norm(root @ root - matrix) / scale > 1e-3:
        return None
    return np.real(root)


def fid_from_features(features1: np.ndarray, features2: np.ndarray) -> float:
    """FID between two sets of feature rows."""
    return frechet_distance(*feature_statistics(features1), *feature_statistics(features2))


def class_conditional_scores(features: np.ndarray, labels: np.ndarray,
                             reference_features: np.ndarray, reference_labels: np.ndarray,
                             num_classes: int) -> dict:
    """Per-class sample quality in a feature space, synthetic against real.

    For each class c with at least 2 rows on both sides:

    * intra-class FID (Miyato & Koyama, ICLR 2018): the FID between the features of the
      samples labelled c and those of the real images of class c. Their mean over the
      classes is ``intra_fid``; unlike the FID of the whole set it is not fooled by a
      generator whose classes are each mislabelled copies of another class.
    * spread ratio: sqrt(tr S_c / tr R_c), the RMS distance of the class's samples from
      their class mean over that of the real class (S_c, R_c the two feature
      covariances). Below 1 the class's samples are less diverse than the real class
      (mode collapse); above 1 more spread out (noise). ``spread_ratio`` is its mean.

    Classes with fewer than 2 rows on either side get None and are left out of the means;
    ``classes_scored`` says how many were scored. Estimates from n rows per class are
    biased upwards like every FID (O(D / n)): compare runs at equal sample counts.
    """
    labels, reference_labels = np.asarray(labels), np.asarray(reference_labels)
    per_class = []
    for c in range(num_classes):
        mine, real = features[labels == c], reference_features[reference_labels == c]
        if len(mine) < 2 or len(real) < 2:
            per_class.append({"class": c, "samples": int(len(mine)), "intra_fid": None,
                              "spread_ratio": None})
            continue
        mu, cov = feature_statistics(mine)
        real_mu, real_cov = feature_statistics(real)
        per_class.append({
            "class": c, "samples": int(len(mine)),
            "intra_fid": frechet_distance(mu, cov, real_mu, real_cov),
            "spread_ratio": float(np.sqrt(np.trace(cov) / max(np.trace(real_cov), 1e-30)))})
    scored = [entry for entry in per_class if entry["intra_fid"] is not None]

    def mean(key):
        return float(np.mean([entry[key] for entry in scored])) if scored else None

    return {"intra_fid": mean("intra_fid"), "spread_ratio": mean("spread_ratio"),
            "classes_scored": len(scored), "per_class": per_class}


# ------------------------------------------------------------------ domain classifier

@dataclasses.dataclass(frozen=True)
class DomainSettings:
    """How the domain classifier is trained (all part of its cache key).

    Attributes:
      schedule: optimizer, learning rate, batch size, epochs.
      seed: initialisation / dropout / shuffle seed.
      train_limit: use only the first ``train_limit`` real training records (tests).
      training_records: which training records it learns from
        (:class:`dclens.data.splits.TrainingRecords`): ``all``, or ``tuning`` for a
        screening run's scores, which may then choose hyper-parameters without having
        looked at the private records or the test set (its accuracy is then measured on
        the tuning holdout).
    """

    schedule: classifiers.Schedule = classifiers.Schedule(epochs=10, batch_size=128)
    seed: int = 0
    train_limit: int | None = None
    training_records: splits.TrainingRecords = splits.TrainingRecords.ALL

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, classifiers.Schedule):
            raise ValueError(f"schedule must be a Schedule, got {self.schedule!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.train_limit is not None and (not isinstance(self.train_limit, int)
                                             or self.train_limit < 2):
            raise ValueError(f"train_limit must be None or an integer >= 2, got "
                             f"{self.train_limit!r}")
        object.__setattr__(self, "training_records",
                           splits.TrainingRecords.parse(self.training_records))
        if self.training_records not in (splits.TrainingRecords.ALL,
                                         splits.TrainingRecords.TUNING):
            raise ValueError(f"the domain classifier learns from all training records or "
                             f"the tuning split, got {self.training_records!r}")

    def to_dict(self) -> dict:
        values = {"schedule": self.schedule.to_dict(), "seed": self.seed,
                  "train_limit": self.train_limit, "architecture": "authors_classifier"}
        # Absent means all records: the key of every cache written before the option.
        if self.training_records is not splits.TrainingRecords.ALL:
            values["training_records"] = self.training_records.value
        return values

    def key(self, dataset: str, data_dir: str | os.PathLike | None) -> str:
        """Cache key: dataset + a hash of these settings and the data location."""
        where = "default" if data_dir is None else os.path.abspath(os.fspath(data_dir))
        blob = json.dumps({"settings": self.to_dict(), "data_dir": where, "version": 1},
                          sort_keys=True)
        return f"{dataset}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


@dataclasses.dataclass(frozen=True, eq=False)
class DomainClassifier:
    """A trained domain classifier: softmax model, feature model and its record."""

    model: object
    features_model: object
    info: dict

    def probabilities(self, images: np.ndarray) -> np.ndarray:
        return classifiers.predict_probabilities(self.model, images)

    def features(self, images: np.ndarray) -> np.ndarray:
        return classifiers.run_in_batches(self.features_model, images)


def _with_features(model, info: dict) -> DomainClassifier:
    import keras

    features = keras.Model(model.inputs[0], model.get_layer(classifiers.FEATURE_LAYER).output)
    return DomainClassifier(model, features, info)


def cached_model_path(dataset: str, data_dir: str | os.PathLike | None = None, *,
                      settings: DomainSettings = DomainSettings(),
                      cache_dir: str | os.PathLike | None = None) -> str | None:
    """The cached domain classifier's file for these settings, or None if not cached."""
    cache_dir = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir()
    key = settings.key(dataset, data_dir)
    model_path = os.path.join(cache_dir, f"domain-classifier-{key}.keras")
    info_path = os.path.join(cache_dir, f"domain-classifier-{key}.json")
    return model_path if os.path.exists(model_path) and os.path.exists(info_path) else None


#: Seconds per epoch of the default domain classifier on 60,000 Fashion-MNIST images on a
#: 2-core AVX2 EPYC, as a user measured it (issue 11); used only for the up-front estimate
#: that evaluate.py prints before training it.
DOMAIN_SECONDS_PER_EPOCH_2_CORES = 40


def domain_classifier(dataset: str, data_dir: str | os.PathLike | None = None, *,
                      settings: DomainSettings = DomainSettings(),
                      cache_dir: str | os.PathLike | None = None,
                      log: Callable[[str], None] = print) -> DomainClassifier:
    """The domain classifier of ``dataset`` (a training-split name), trained or from cache.

    ``dataset`` is a name :func:`dclens.data.load_dataset` accepts for the *training*
    data (``fashion_mnist``, ``mnist``, ``celebA-gender-train``, ...).
    """
    import keras

    cache_dir = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir()
    key = settings.key(dataset, data_dir)
    model_path = os.path.join(cache_dir, f"domain-classifier-{key}.keras")
    info_path = os.path.join(cache_dir, f"domain-classifier-{key}.json")
    if os.path.exists(model_path) and os.path.exists(info_path):
        with open(info_path) as stream:
            info = json.load(stream)
        info["cache"] = "hit"
        log(f"domain classifier for IS/FID: cached {model_path}")
        return _with_features(keras.models.load_model(model_path), info)

    log(f"domain classifier for IS/FID: training on the real {dataset} training split "
        f"(cached afterwards in {model_path})")
    started = time.perf_counter()
    real = splits.load_training_records(dataset, data_dir, settings.training_records,
                                        limit=settings.train_limit, progress=False)
    model = classifiers.build_classifier(real.spec.image_shape, real.spec.num_classes,
                                         seed=settings.seed, name="domain_classifier")
    classifiers.compile_for(model, settings.schedule)
    curves = classifiers.fit_with_curves(model, real.images, real.labels,
                                         schedule=settings.schedule, seed=settings.seed,
                                         monitors={}, log=log)
    info = {"dataset": dataset, "data_source": real.source, "records": len(real),
            "settings": settings.to_dict(), "key": key, "train_curves": curves,
            "seconds": time.perf_counter() - started, "note": NOTE}
    test_name = test_split_name(dataset)
    if test_name is not None:
        try:
            test = (splits.load_tuning_holdout(dataset, data_dir)
                    if settings.training_records is splits.TrainingRecords.TUNING
                    else data.load_dataset(test_name, data_dir, split="test", progress=False))
            info["test_accuracy"] = classifiers.accuracy(model, test.images, test.labels)
            info["test_records"] = test.source
            log(f"domain classifier: real test accuracy {info['test_accuracy']:.4f} "
                f"({test.source})")
        except data.DataError as error:   # the score does not need it; say why it is absent
            info["test_accuracy_unavailable"] = str(error)
    with export.atomic_path(model_path) as temporary:
        model.save(temporary)
    export.write_json(info_path, info)
    info["cache"] = "miss"
    return _with_features(model, info)


def test_split_name(dataset: str) -> str | None:
    """The dataset name whose ``split="test"`` load gives the real test data."""
    if dataset in ("mnist", "fashion_mnist"):
        return dataset
    if dataset.startswith("celebA-"):
        return dataset.rsplit("-", 1)[0] + "-test"
    return None


# ------------------------------------------------------------------ scores of a sample set

def label_agreement(probabilities: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of images whose domain-classifier class is their given label.

    For conditional samples G(z, y) it measures class-conditional fidelity: whether an
    image of label y looks like class y to a classifier of real data (at most about that
    classifier's real test accuracy, 1/classes for labels unrelated to the images)."""
    labels = np.asarray(labels)
    if labels.shape != (len(probabilities),):
        raise ValueError(f"labels have shape {labels.shape}, expected "
                         f"({len(probabilities)},) (one per image)")
    return float(np.mean(np.argmax(probabilities, axis=1) == labels))


def label_confusion(probabilities: np.ndarray, labels: np.ndarray) -> dict:
    """Where the samples of each label land: ``matrix[y][c]`` is the fraction of the
    images labelled y that the domain classifier puts in class c (each row sums to 1; a
    label without images has a row of zeros), and ``predicted_shares[c]`` the fraction of
    all images put in class c.  The diagnostic behind a low :func:`label_agreement`: mass
    spread over many classes (the label is ignored), or piled on a few (mode collapse)."""
    labels = np.asarray(labels)
    if labels.shape != (len(probabilities),):
        raise ValueError(f"labels have shape {labels.shape}, expected "
                         f"({len(probabilities)},) (one per image)")
    classes = probabilities.shape[1]
    predicted = np.argmax(probabilities, axis=1)
    counts = np.zeros((classes, classes), np.int64)
    np.add.at(counts, (labels, predicted), 1)
    totals = counts.sum(axis=1, keepdims=True)
    matrix = np.divide(counts, totals, out=np.zeros((classes, classes)), where=totals > 0)
    return {"matrix": matrix.tolist(),
            "predicted_shares": (np.bincount(predicted, minlength=classes)
                                 / max(1, len(predicted))).tolist()}


def checkerboard_share(images: np.ndarray) -> float:
    """The mean share of an image's spectral power at the grid's highest frequencies.

    For each image x (H x W x C, H and W even) with its mean removed, power P(u, v) =
    |DFT(x)(u, v)|^2 summed over channels; the share is (P(H/2, W/2) + P(H/2, 0) +
    P(0, W/2)) / sum P: the power in patterns that alternate every pixel (a checkerboard,
    and stripes one pixel wide), which stride-2 transposed convolutions print (their
    output pixels see alternately more and fewer kernel taps).  Real Fashion-MNIST
    images have about 0.001; an image that is one such pattern has 1.  A constant image
    (no power) counts 0.  Returns the mean over the images.
    """
    x = np.asarray(images, np.float64)
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or x.shape[1] % 2 or x.shape[2] % 2 or len(x) == 0:
        raise ValueError(f"images must be [N, H, W(, C)] with N >= 1 and H, W even, got "
                         f"shape {np.shape(images)}")
    x = x - x.mean(axis=(1, 2), keepdims=True)
    power = (np.abs(np.fft.fft2(x, axes=(1, 2))) ** 2).sum(axis=3)
    h, w = x.shape[1] // 2, x.shape[2] // 2
    highest = power[:, h, w] + power[:, h, 0] + power[:, 0, w]
    total = power.sum(axis=(1, 2))
    return float(np.mean(np.divide(highest, total, out=np.zeros_like(total),
                                   where=total > 0)))


def quality_record(classifier: DomainClassifier, images: np.ndarray,
                   reference_images: np.ndarray, *, splits: int = 10,
                   labels: np.ndarray | None = None,
                   reference_labels: np.ndarray | None = None) -> dict:
    """IS of ``images``, IS of ``reference_images`` and FID between the two sets; with
    ``labels`` (and ``reference_labels``) also their :func:`label_agreement`, and with
    both the per-class scores of :func:`class_conditional_scores` (``per_class``), and
    both sets' :func:`checkerboard_share`."""
    probabilities = classifier.probabilities(images)
    score, spread = inception_score(probabilities, splits=min(splits, len(images)))
    reference_probabilities = classifier.probabilities(reference_images)
    reference_score, reference_spread = inception_score(
        reference_probabilities, splits=min(splits, len(reference_images)))
    features = classifier.features(images)
    reference_features = classifier.features(reference_images)
    fid = fid_from_features(features, reference_features)
    agreement = {}
    if labels is not None:
        agreement["label_agreement"] = label_agreement(probabilities, labels)
        agreement["label_confusion"] = label_confusion(probabilities, labels)
    if reference_labels is not None:
        agreement["reference_label_agreement"] = label_agreement(reference_probabilities,
                                                                 reference_labels)
    if labels is not None and reference_labels is not None:
        agreement["per_class"] = class_conditional_scores(
            features, labels, reference_features, reference_labels,
            num_classes=probabilities.shape[1])
    return {**agreement, "inception_score": score, "inception_score_std": spread,
            "fid": fid, "checkerboard_share": checkerboard_share(images),
            "reference_checkerboard_share": checkerboard_share(reference_images),
            "reference_inception_score": reference_score,
            "reference_inception_score_std": reference_spread,
            "samples": int(len(images)), "reference_samples": int(len(reference_images)),
            "splits": splits, "classifier_key": classifier.info.get("key"),
            "classifier_test_accuracy": classifier.info.get("test_accuracy"), "note": NOTE}
