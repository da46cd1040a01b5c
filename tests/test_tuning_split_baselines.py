"""The tuning split for the baselines (DP-SGD / GEP and GS-WGAN): a run on the private
records reads nothing else (the adversarial swap of every tuning record leaves its bits
unchanged), and a DP-SGD screening run is scored on the tuning holdout, never the test set."""

import json

import numpy as np
import pytest

from conftest import load_script, write_idx
from dclens.data import splits

PRIVATE = 80
TOTAL = PRIVATE + splits.TUNING_RECORDS


def _images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 10
    images = rng.integers(0, 60, size=(count, 28, 28))
    for i, label in enumerate(labels):
        images[i, 2 * label + 2:2 * label + 6, 4:24] = 230
    return images, labels


def _write(root, train, test=None):
    folder = root / "fashion_mnist"
    folder.mkdir(parents=True)
    write_idx(folder / "train-images-idx3-ubyte.gz", train[0])
    write_idx(folder / "train-labels-idx1-ubyte.gz", train[1])
    if test is not None:
        write_idx(folder / "t10k-images-idx3-ubyte.gz", test[0])
        write_idx(folder / "t10k-labels-idx1-ubyte.gz", test[1])
    return root


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    """Two data sets that agree on the private records and the test split only: in the
    second every tuning record is another image with another label."""
    images, labels = _images(TOTAL, 0)
    test = _images(50, 1)
    rng = np.random.default_rng(2)
    swapped_images, swapped_labels = images.copy(), labels.copy()
    swapped_images[PRIVATE:] = rng.integers(0, 256, size=images[PRIVATE:].shape)
    swapped_labels[PRIVATE:] = (labels[PRIVATE:] + 1 + rng.integers(0, 9, TOTAL - PRIVATE)) % 10
    base = tmp_path_factory.mktemp("baseline-splits")
    return {"indexed": _write(base / "indexed", (images, labels), test),
            "swapped": _write(base / "swapped", (swapped_images, swapped_labels), test),
            "no_test": _write(base / "no_test", (images, labels))}


def _gswgan(data_dir, out, records):
    tool = load_script("gswgan")
    assert tool.main(["--run_dir", str(out), "--data_dir", str(data_dir),
                      "--training_records", records, "--num_discriminators", "4",
                      "--model_dim", "2", "--batch_size", "6", "--critic_iters", "1",
                      "--warm_iterations", "0", "--iterations", "3", "--num_samples", "10",
                      "--seed", "1", "--sigma", "1.0", "--quiet"]) == 0


def _dpsgd(data_dir, out, records):
    """A tiny DP-SGD run on (at most) the first 80 of ``records``."""
    tool = load_script("dpsgd")
    assert tool.main(["--method", "gm", "--data_dir", str(data_dir), "--run_dir", str(out),
                      "--training_records", records, "--max_records", str(PRIVATE),
                      "--batch_size", "20", "--epochs", "1",
                      "--validation", "20", "--target_eps", "4", "--seed", "5",
                      "--quiet"]) == 0


def _outputs(run_dir) -> dict:
    """Every array the run released and its ledger's epsilon."""
    out = {"epsilon": json.loads((run_dir / "privacy.json").read_text())["epsilon"]}
    for name in ("samples.npz", "model_weights.npz"):
        if (run_dir / name).exists():
            with np.load(run_dir / name) as saved:
                out.update({f"{name}:{k}": saved[k].copy() for k in saved.files})
    return out


@pytest.mark.parametrize("method", ["gswgan", "dpsgd"])
def test_a_private_baseline_run_is_bit_identical_whatever_the_tuning_split_holds(
        method, data_dirs, tmp_path):
    runner = {"gswgan": _gswgan, "dpsgd": _dpsgd}[method]
    outputs = {}
    for name in ("indexed", "swapped"):
        runner(data_dirs[name], tmp_path / name, "private")
        outputs[name] = _outputs(tmp_path / name)
    config = json.loads((tmp_path / "indexed" / "config.json").read_text())["config"]
    assert config["training_records"] == "private"
    if method == "dpsgd":
        outputs = {name: {**outputs[name], **_model_weights(tmp_path / name / "model.keras")}
                   for name in outputs}
    assert outputs["indexed"].keys() == outputs["swapped"].keys()
    assert len(outputs["indexed"]) > 1
    for key, value in outputs["indexed"].items():
        np.testing.assert_array_equal(value, outputs["swapped"][key])
    # The adversary's data sets do differ (so the test could fail).
    full = [splits.load_training_records("fashion_mnist", data_dirs[name], "all",
                                         progress=False) for name in ("indexed", "swapped")]
    assert not np.array_equal(full[0].images, full[1].images)


def _model_weights(path) -> dict:
    import keras

    return {f"weight{i}": w for i, w in
            enumerate(keras.models.load_model(path).get_weights())}


def test_a_dpsgd_screening_run_is_scored_on_the_tuning_holdout(data_dirs, tmp_path):
    """On a data set with no test split at all, a tuning-records run completes: it never
    opened the test set; its facts say what it was scored on."""
    _dpsgd(data_dirs["no_test"], tmp_path / "screen", "tuning")
    facts = json.loads((tmp_path / "screen" / "privacy.json").read_text())
    text = json.dumps(facts)
    assert "tuning holdout" in text and '"training_records": "tuning"' in text
    with pytest.raises(Exception, match="t10k|test"):
        _dpsgd(data_dirs["no_test"], tmp_path / "private", "private")
