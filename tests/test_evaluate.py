"""Downstream evaluation: protocols, inputs, domain-classifier IS/FID (dclens.evaluation.evaluate)."""

from __future__ import annotations

import inspect
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from dclens.evaluation import classifiers, evaluate, quality, record_outputs
from dclens import data
from dclens.common import export

REAL_FMNIST = Path(data.DEFAULT_FASHION_MNIST_DIR)
needs_fmnist = pytest.mark.skipif(
    not (REAL_FMNIST / "t10k-images-idx3-ubyte.gz").exists(),
    reason=f"{REAL_FMNIST} absent (apt-get install dataset-fashion-mnist)")

# Short schedules on subsets keep the file fast on 2 cores.
SHORT = classifiers.Schedule(optimizer="adam", learning_rate=2e-3, batch_size=64, epochs=6)
DOMAIN = quality.DomainSettings(schedule=classifiers.Schedule(batch_size=128, epochs=3),
                                train_limit=5000)
SPEC = data.dataset_spec("fashion_mnist")


@pytest.fixture(scope="module")
def real():
    train = data.load_dataset("fashion_mnist", split="train", limit=6000)
    test = data.load_dataset("fashion_mnist", split="test", limit=1000)
    return train, test


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def noise_images(count: int, seed: int = 0) -> data.LabeledImages:
    rng = np.random.default_rng(seed)
    return data.LabeledImages(rng.random((count, 28, 28, 1), dtype=np.float32),
                              rng.integers(0, 10, count).astype(np.int64), SPEC, "noise")


# ------------------------------------------------------------ accuracy of real data and noise

@needs_fmnist
def test_real_images_give_high_accuracy_noise_gives_chance(real, cache_dir, tmp_path):
    train, test = real
    settings = evaluate.EvalSettings(schedule=SHORT, quality=False)
    record = evaluate.evaluate(train, test, settings, log=lambda _: None)
    assert record["protocols"]["val"]["accuracy"] > 0.85
    assert record["protocols"]["sen"]["accuracy"] >= record["protocols"]["val"]["accuracy"]
    assert record["headline"] == "val"
    assert len(record["curves"]["test_accuracy"]) == SHORT.epochs
    assert record["split"]["train"] + record["split"]["val"] == len(train)

    noise = evaluate.evaluate(noise_images(1000), test, settings.replace(
        schedule=classifiers.Schedule(batch_size=64, epochs=2)), log=lambda _: None)
    assert noise["protocols"]["val"]["accuracy"] < 0.2

    paths = record_outputs.write_outputs(record, tmp_path / "out")
    saved = json.loads(Path(paths["json"]).read_text())
    assert saved["protocols"]["val"]["accuracy"] == record["protocols"]["val"]["accuracy"]
    assert Path(paths["png"]).stat().st_size > 1000


# ------------------------------------------------------------ the val protocol by construction

def test_select_by_validation_sees_only_the_validation_curve():
    assert list(inspect.signature(evaluate.select_by_validation).parameters) == ["val_accuracy"]
    assert evaluate.select_by_validation([0.2, 0.5, 0.4, 0.5]) == 1      # earliest of ties
    assert evaluate.select_by_test([0.2, 0.3, 0.9]) == 2
    with pytest.raises(evaluate.EvaluationError, match="no finite validation"):
        evaluate.select_by_validation([])


@needs_fmnist
def test_corrupting_test_labels_does_not_change_the_chosen_epoch(real):
    train, test = real
    settings = evaluate.EvalSettings(schedule=classifiers.Schedule(batch_size=64, epochs=3),
                                     quality=False, max_samples=1500)
    first = evaluate.evaluate(train, test, settings, log=lambda _: None)
    shuffled = np.random.default_rng(5).permutation(test.labels)
    corrupted = data.LabeledImages(test.images, shuffled, test.spec, "corrupted test labels")
    second = evaluate.evaluate(train, corrupted, settings, log=lambda _: None)
    assert second["curves"]["test_accuracy"] != first["curves"]["test_accuracy"]
    np.testing.assert_allclose(second["curves"]["val_accuracy"],
                               first["curves"]["val_accuracy"], atol=1e-3)
    assert second["protocols"]["val"]["epoch"] == first["protocols"]["val"]["epoch"]


def test_validation_split_is_stratified_disjoint_and_seeded():
    labels = np.repeat(np.arange(10), [50, 50, 50, 50, 50, 50, 50, 50, 50, 1])
    train, val = evaluate.split_validation(labels, 0.1, seed=3, num_classes=10)
    assert len(np.intersect1d(train, val)) == 0
    assert len(train) + len(val) == len(labels)
    assert np.bincount(labels[val], minlength=10).tolist() == [5] * 9 + [0]   # singleton stays
    again = evaluate.split_validation(labels, 0.1, seed=3, num_classes=10)
    np.testing.assert_array_equal(again[1], val)
    other = evaluate.split_validation(labels, 0.1, seed=4, num_classes=10)
    assert not np.array_equal(other[1], val)


# ------------------------------------------------------------ inputs

def test_authors_pickles_round_trip_with_our_writer(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.random((53, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, 53)
    paths = export.write_authors_pickles(tmp_path, images, labels, num_classes=10,
                                         epsilon=1.0)
    prefix = str(tmp_path / "eps-1.00.data")
    for given in (prefix, paths[0], paths[3], str(tmp_path)):
        loaded, kind = evaluate.load_synthetic(given, "fashion_mnist")
        assert kind == "authors_pickles"
        np.testing.assert_array_equal(loaded.images, images)
        np.testing.assert_array_equal(loaded.labels, labels)


def test_npz_inputs_ours_and_generic(tmp_path):
    rng = np.random.default_rng(2)
    images = rng.random((20, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, 20)
    export.write_samples_npz(tmp_path / "samples.npz", images, labels)
    for given in (tmp_path / "samples.npz", tmp_path):
        loaded, kind = evaluate.load_synthetic(given, "fashion_mnist")
        assert kind == "npz"
        np.testing.assert_array_equal(loaded.images, images)
    # uint8 [N, 28, 28] images with one-hot labels under other key names.
    raw = (images[..., 0] * 255).astype(np.uint8)
    np.savez(tmp_path / "other.npz", images=raw, labels=np.eye(10)[labels])
    loaded, _ = evaluate.load_synthetic(tmp_path / "other.npz", "fashion_mnist")
    np.testing.assert_allclose(loaded.images[..., 0], raw / 255.0, atol=1e-6)
    np.testing.assert_array_equal(loaded.labels, labels)


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.npz", ["missing.npz", "not found"]),
    (lambda d: str(d / "eps-1.00.data"), ["eps-1.00.data-0.pkl", "prefix"]),
    (lambda d: np.savez(d / "s.npz", x=np.zeros((4, 32, 32, 3), np.float32),
                        y=np.zeros(4, np.int64)) or d / "s.npz",
     ["(4, 32, 32, 3)", "28x28x1", "--dataset"]),
    (lambda d: np.savez(d / "e.npz", x=np.zeros((0, 28, 28, 1), np.float32),
                        y=np.zeros(0, np.int64)) or d / "e.npz", ["no samples"]),
    (lambda d: np.savez(d / "k.npz", a=np.zeros(3)) or d / "k.npz", ["['a']", "x/y"]),
    (lambda d: np.savez(d / "r.npz", x=np.full((2, 28, 28, 1), 2.0, np.float32),
                        y=np.zeros(2, np.int64)) or d / "r.npz", ["[0, 1]"]),
])
def test_bad_inputs_fail_clearly(tmp_path, make, message):
    with pytest.raises((evaluate.EvaluationError, data.DataError)) as info:
        evaluate.load_synthetic(make(tmp_path), "fashion_mnist")
    for part in message:
        assert part in str(info.value)


def test_pickle_with_wrong_columns_names_the_file(tmp_path):
    path = tmp_path / "eps-1.00.data-0.pkl"
    path.write_bytes(pickle.dumps(np.zeros((3, 100), np.float32)))
    with pytest.raises(evaluate.EvaluationError, match="100 columns, expected 784 pixels"):
        evaluate.load_synthetic(str(tmp_path / "eps-1.00.data"), "fashion_mnist")


def test_missing_class_warns(tiny_fmnist_dir):
    test = data.load_dataset("fashion_mnist", tiny_fmnist_dir, split="test")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 9, 60)        # class 9 (Ankle boot) never appears
    synthetic = data.LabeledImages(rng.random((60, 28, 28, 1), dtype=np.float32), labels,
                                   SPEC, "nine classes")
    messages = []
    record = evaluate.evaluate(synthetic, test, evaluate.EvalSettings(
        schedule=classifiers.Schedule(epochs=1, batch_size=16), quality=False),
        log=messages.append)
    assert any("Ankle boot" in w for w in record["warnings"])
    assert any("warning" in m and "Ankle boot" in m for m in messages)


def test_settings_are_validated_with_the_bad_value():
    with pytest.raises(evaluate.EvaluationError, match="got 0.9"):
        evaluate.EvalSettings(val_fraction=0.9)
    with pytest.raises(classifiers.ScheduleError, match="'rmsprop'"):
        classifiers.Schedule(optimizer="rmsprop")
    with pytest.raises(classifiers.ScheduleError, match="epochs.*got 0"):
        classifiers.Schedule(epochs=0)
    official = evaluate.official_settings("fashion_mnist")
    assert official.schedule == classifiers.Schedule("sgd", 2e-3, 512, 600)
    assert official.sen_on_all_data
    assert evaluate.official_settings("celebA-gender").schedule.epochs == 250


def test_same_seed_builds_the_same_classifier():
    a = classifiers.build_classifier((28, 28, 1), 10, seed=7)
    b = classifiers.build_classifier((28, 28, 1), 10, seed=7)
    c = classifiers.build_classifier((28, 28, 1), 10, seed=8)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)
    assert not np.array_equal(a.get_weights()[0], c.get_weights()[0])


# ------------------------------------------------------------ IS / FID

def test_scores_on_known_inputs():
    uniform = np.full((100, 10), 0.1)
    assert quality.inception_score(uniform)[0] == pytest.approx(1.0)
    confident = np.eye(10)[np.arange(100) % 10]
    assert quality.inception_score(confident, splits=1)[0] == pytest.approx(10.0, rel=1e-6)
    rng = np.random.default_rng(0)
    features = rng.normal(size=(2000, 8))
    assert quality.fid_from_features(features, features) == pytest.approx(0.0, abs=1e-6)
    shifted = features + 3.0     # mean shift only: FID = ||3 * ones||^2 = 72
    assert quality.fid_from_features(features, shifted) == pytest.approx(72.0, rel=1e-6)


def test_class_conditional_scores_against_closed_form():
    """Each synthetic class c ~ N(m_c, s_c^2 I_D), each real class ~ N(0, I_D): the intra-class
    FID is |m_c|^2 + D (s_c - 1)^2 and the spread ratio s_c. With n = 20,000 rows per side the
    estimated mean shift's cross term 2 m . delta has sd 2 |m| sqrt((s^2 + 1) / n) (0.13 for
    the last class); tolerance 4 such sd + 0.05 for the covariance term; 1% on the ratio."""
    rng = np.random.default_rng(1)
    dim, n = 4, 20000
    shifts, scales = [0.0, 1.0, 2.0], [1.0, 0.5, 2.0]
    features, labels, real, real_labels = [], [], [], []
    for c, (shift, scale) in enumerate(zip(shifts, scales)):
        features.append(shift + scale * rng.normal(size=(n, dim)))
        real.append(rng.normal(size=(n, dim)))
        labels += [c] * n
        real_labels += [c] * n
    result = quality.class_conditional_scores(np.concatenate(features), np.array(labels),
                                              np.concatenate(real), np.array(real_labels),
                                              num_classes=4)
    expected = [dim * m * m + dim * (s - 1) ** 2 for m, s in zip(shifts, scales)]
    tolerances = [4 * 2 * np.sqrt(dim) * m * np.sqrt((s * s + 1) / n) + 0.05
                  for m, s in zip(shifts, scales)]
    for entry, want, scale, tol in zip(result["per_class"], expected, scales, tolerances):
        assert entry["intra_fid"] == pytest.approx(want, abs=tol)
        assert entry["spread_ratio"] == pytest.approx(scale, rel=0.01)
    # Class 3 has no rows: unscored, left out of the means.
    assert result["per_class"][3] == {"class": 3, "samples": 0, "intra_fid": None,
                                      "spread_ratio": None}
    assert result["classes_scored"] == 3
    assert result["intra_fid"] == pytest.approx(np.mean(expected), abs=max(tolerances))
    assert result["spread_ratio"] == pytest.approx(np.mean(scales), rel=0.01)


def test_intra_fid_sees_swapped_classes_that_fid_does_not():
    """Two well separated real classes; the 'samples' are the real images with the two labels
    swapped. The whole-set FID is 0; the intra-class FID is the squared distance of the two
    class means (|6 * ones_3|^2 = 108) plus a covariance term of O(D / n) (the two classes'
    sample covariances differ slightly; tolerance 1.0), and each class's spread ratio is the
    other class's spread over its own."""
    rng = np.random.default_rng(2)
    real = np.concatenate([rng.normal(size=(500, 3)), 6.0 + rng.normal(size=(500, 3))])
    labels = np.repeat([0, 1], 500)
    assert quality.fid_from_features(real, real) == pytest.approx(0.0, abs=1e-6)
    same = quality.class_conditional_scores(real, labels, real, labels, num_classes=2)
    assert same["intra_fid"] == pytest.approx(0.0, abs=1e-6)
    swapped = quality.class_conditional_scores(real, 1 - labels, real, labels, num_classes=2)
    empirical = np.sum((real[:500].mean(0) - real[500:].mean(0)) ** 2)
    assert swapped["intra_fid"] == pytest.approx(empirical, abs=1.0)
    assert empirical == pytest.approx(108.0, rel=0.05)
    for entry in swapped["per_class"]:
        assert entry["spread_ratio"] == pytest.approx(
            np.sqrt(np.trace(np.cov(real[labels == 1 - entry["class"]], rowvar=False))
                    / np.trace(np.cov(real[labels == entry["class"]], rowvar=False))))


@needs_fmnist
def test_domain_is_fid_real_versus_noise_and_cache(real, cache_dir):
    train, test = real
    messages = []
    domain = quality.domain_classifier("fashion_mnist", settings=DOMAIN, cache_dir=cache_dir,
                                       log=messages.append)
    assert domain.info["cache"] == "miss"
    noise = noise_images(1000).images
    real_record = quality.quality_record(domain, train.images[:1000], test.images,
                                         labels=train.labels[:1000],
                                         reference_labels=test.labels)
    noise_record = quality.quality_record(domain, noise, test.images)
    assert real_record["inception_score"] > 2 * noise_record["inception_score"]
    # Real images with their labels agree about as often as the classifier is accurate
    # (its accuracy is over all 10,000 test images, ours over the first 1,000: binomial sd
    # ~0.013, tolerance 0.05); with every label shifted by one class they (almost) never do.
    assert real_record["label_agreement"] > 0.6
    assert abs(real_record["reference_label_agreement"]
               - domain.info["test_accuracy"]) < 0.05
    shifted = quality.quality_record(domain, train.images[:1000], test.images[:100],
                                     labels=(train.labels[:1000] + 1) % 10)
    assert shifted["label_agreement"] < 0.2
    assert "label_agreement" not in noise_record and "per_class" not in noise_record
    # Real images against real images of the same classes: intra-class FID small and each
    # class about as spread as the real one; with the labels shifted it is far larger.
    assert real_record["per_class"]["classes_scored"] == 10
    assert 0.7 < real_record["per_class"]["spread_ratio"] < 1.3
    shifted_both = quality.quality_record(domain, train.images[:1000], test.images,
                                          labels=(train.labels[:1000] + 1) % 10,
                                          reference_labels=test.labels)
    assert (real_record["per_class"]["intra_fid"] * 3
            < shifted_both["per_class"]["intra_fid"])
    assert real_record["fid"] * 10 < noise_record["fid"]
    assert "domain-classifier" in real_record["note"]
    assert real_record["checkerboard_share"] == quality.checkerboard_share(
        train.images[:1000])
    assert real_record["reference_checkerboard_share"] == quality.checkerboard_share(
        test.images)
    # real clothes are smooth; independent uniform noise spreads its power evenly, so 3 of
    # its 28 x 28 - 1 frequencies carry about 3 / 783 of it
    assert real_record["checkerboard_share"] < 0.002 < noise_record["checkerboard_share"]

    cached = quality.domain_classifier("fashion_mnist", settings=DOMAIN, cache_dir=cache_dir,
                                       log=messages.append)
    assert cached.info["cache"] == "hit"
    np.testing.assert_allclose(cached.probabilities(test.images[:50]),
                               domain.probabilities(test.images[:50]), atol=1e-6)
    files = os.listdir(cache_dir)
    assert any(f.startswith("domain-classifier-fashion_mnist-") and f.endswith(".keras")
               for f in files)
    assert not [f for f in files if f.startswith(".tmp-")]
    other = quality.DomainSettings(schedule=DOMAIN.schedule, train_limit=4000)
    assert other.key("fashion_mnist", None) != DOMAIN.key("fashion_mnist", None)


def _truncated_npz(folder):
    rng = np.random.default_rng(3)
    export.write_samples_npz(folder / "samples.npz", rng.random((50, 28, 28, 1), np.float32),
                             rng.integers(0, 10, 50))
    whole = (folder / "samples.npz").read_bytes()
    (folder / "cut.npz").write_bytes(whole[:len(whole) // 2])
    return folder / "cut.npz"


def _random_npz(folder):
    (folder / "noise.npz").write_bytes(np.random.default_rng(4).bytes(5000))
    return folder / "noise.npz"


def _truncated_pickle(folder):
    rows = np.zeros((20, 794), np.float32)
    (folder / "eps-1.00.data-0.pkl").write_bytes(pickle.dumps(rows)[:3000])
    return str(folder / "eps-1.00.data")


@pytest.mark.parametrize("make, file_name", [(_truncated_npz, "cut.npz"),
                                             (_random_npz, "noise.npz"),
                                             (_truncated_pickle, "eps-1.00.data-0.pkl")])
def test_damaged_sample_files_are_refused_by_name_with_the_fix(tmp_path, make, file_name,
                                                              capsys):
    """A truncated .npz or pickle used to escape with a traceback; random bytes got numpy's
    advice to pass allow_pickle=True (which would run whatever the file holds)."""
    from conftest import load_script

    given = make(tmp_path)
    with pytest.raises(evaluate.EvaluationError) as info:
        evaluate.load_synthetic(given, "fashion_mnist")
    text = str(info.value)
    assert file_name in text and "not a readable" in text and "write the samples again" in text
    assert "allow_pickle" not in text
    cli = load_script("evaluate")
    assert cli.main([str(given), "--dataset", "fashion_mnist"]) == 2
    err = capsys.readouterr().err
    assert "not a readable" in err and "Traceback" not in err


def test_label_confusion_counts_where_each_label_lands():
    """Against a plain double loop: rows are the given labels, columns the classifier's
    classes; each row with images sums to 1, its diagonal is that label's agreement, and
    a label without images is a row of zeros."""
    rng = np.random.default_rng(4)
    probabilities = rng.dirichlet(np.ones(4), size=300)
    labels = rng.choice([0, 1, 3], size=300)          # label 2 never given
    confusion = quality.label_confusion(probabilities, labels)
    predicted = probabilities.argmax(axis=1)
    for y in range(4):
        given = [i for i in range(300) if labels[i] == y]
        for c in range(4):
            expected = (sum(predicted[i] == c for i in given) / len(given)) if given else 0.0
            assert confusion["matrix"][y][c] == pytest.approx(expected, abs=1e-12)
    assert np.allclose(np.sum(confusion["matrix"], axis=1), [1, 1, 0, 1])
    assert confusion["predicted_shares"] == pytest.approx(
        [np.mean(predicted == c) for c in range(4)])
    agreement = quality.label_agreement(probabilities, labels)
    assert agreement == pytest.approx(sum(np.mean(labels == y) * confusion["matrix"][y][y]
                                          for y in range(4)))
    with pytest.raises(ValueError, match=r"labels have shape \(299,\)"):
        quality.label_confusion(probabilities, labels[:299])
