"""Tests for dclens.data: IDX reading, dataset loading, CelebA, partitioning."""

from __future__ import annotations

import gzip
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from dclens import data
from dclens.data import DataError, dataset_spec, load_dataset, partition, read_idx

REAL_FMNIST = Path(data.DEFAULT_FASHION_MNIST_DIR)


# ------------------------------------------------------------------ helpers

def idx_bytes(array: np.ndarray, *, type_code: int = 0x08) -> bytes:
    """Serialise a uint8 array in IDX format."""
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(
        f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray, *, gz: bool = False) -> Path:
    """Write ``array`` as an IDX file (gzip-compressed if ``gz``)."""
    payload = idx_bytes(array)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def write_mnist_split(directory: Path, *, n: int = 20, split: str = "train",
                      size: int = 28, n_labels: int | None = None,
                      gz: bool = False, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Write random images/labels IDX files for ``split`` into ``directory``."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, size, size), dtype=np.uint8)
    images[0, 0, 0] = 255
    labels = rng.integers(0, 10, size=n_labels or n, dtype=np.uint8)
    prefix = "train" if split == "train" else "t10k"
    ext = ".gz" if gz else ""
    write_idx(directory / f"{prefix}-images-idx3-ubyte{ext}", images, gz=gz)
    write_idx(directory / f"{prefix}-labels-idx1-ubyte{ext}", labels, gz=gz)
    return images, labels


@pytest.fixture
def no_tfds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace tensorflow_datasets by a fake that has nothing prepared."""
    calls: list[str] = []

    class Builder:
        def __init__(self, name: str, data_dir: str | None) -> None:
            self.data_dir = f"{data_dir or '~/tensorflow_datasets'}/{name}/3.0.1"

        def is_prepared(self) -> bool:
            return False

        def as_dataset(self, **kwargs):  # pragma: no cover - must not be called
            raise AssertionError("as_dataset called on unprepared builder")

    def builder(name: str, *, data_dir: str | None = None, try_gcs: bool = True):
        assert try_gcs is False, "must never reach out to GCS"
        calls.append(name)
        return Builder(name, data_dir)

    fake = types.SimpleNamespace(builder=builder, as_numpy=lambda x: x)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    return calls


# ------------------------------------------------------------------ specs

@pytest.mark.parametrize("name", data.valid_dataset_names())
def test_dataset_spec_every_name(name: str) -> None:
    spec = dataset_spec(name)
    assert spec.name == name
    assert len(spec.class_names) == spec.num_classes
    if name in ("mnist", "fashion_mnist"):
        assert spec.image_shape == (28, 28, 1) and spec.num_classes == 10
    elif "-gender-" in name:
        assert spec.image_shape == (64, 64, 3) and spec.class_names == ("female", "male")
    else:
        assert spec.image_shape == (64, 64, 3)
        assert spec.class_names == ("Black_Hair", "Blond_Hair", "Brown_Hair")


def test_dataset_spec_unknown_lists_valid_names() -> None:
    with pytest.raises(DataError, match=r"'cifar10'.*fashion_mnist.*celebA-hair-test"):
        dataset_spec("cifar10")


# ------------------------------------------------------------------ IDX

@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trip(tmp_path: Path, gz: bool) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    out = read_idx(write_idx(tmp_path / "x.idx", array, gz=gz))
    assert out.dtype == np.uint8 and out.flags.writeable
    np.testing.assert_array_equal(out, array)


def test_read_idx_detects_gzip_by_magic_not_name(tmp_path: Path) -> None:
    array = np.arange(10, dtype=np.uint8)
    path = tmp_path / "plain-name-ubyte"
    path.write_bytes(gzip.compress(idx_bytes(array)))
    np.testing.assert_array_equal(read_idx(path), array)
    raw_named_gz = tmp_path / "raw.gz"
    raw_named_gz.write_bytes(idx_bytes(array))
    np.testing.assert_array_equal(read_idx(raw_named_gz), array)


@pytest.mark.parametrize("payload, pattern", [
    (b"\x12\x34\x08\x01\x00\x00\x00\x01\x00", "bad magic"),
    (b"\x00", "bad magic"),
    (idx_bytes(np.zeros(3, np.uint8), type_code=0x0D), "type code 0x0d"),
    (b"\x00\x00\x08\x03\x00\x00", "truncated"),
    (idx_bytes(np.zeros((4, 5), np.uint8))[:-3], r"truncated.*\(4, 5\).*20 bytes.*17"),
    (idx_bytes(np.zeros(4, np.uint8)) + b"junk", "4 bytes of trailing garbage"),
    (gzip.compress(idx_bytes(np.zeros(100, np.uint8)), mtime=0)[:-10], "cannot be decompressed"),
])
def test_read_idx_corrupt(tmp_path: Path, payload: bytes, pattern: str) -> None:
    path = tmp_path / "bad-idx"
    path.write_bytes(payload)
    with pytest.raises(DataError, match=pattern) as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found.*nope"):
        read_idx(tmp_path / "nope")


# ------------------------------------------------------------------ mnist-like

@pytest.mark.parametrize("layout", ["authors", "flat"])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_load_idx_layouts(tmp_path: Path, no_tfds: list[str], layout: str,
                          gz: bool, name: str) -> None:
    directory = tmp_path / name if layout == "authors" else tmp_path
    images, labels = write_mnist_split(directory, n=15, gz=gz)
    ds = load_dataset(name, tmp_path)
    assert ds.images.shape == (15, 28, 28, 1) and ds.images.dtype == np.float32
    assert ds.images.min() >= 0.0 and ds.images.max() == 1.0
    np.testing.assert_allclose(ds.images[..., 0] * 255.0, images, atol=1e-3)
    assert ds.labels.dtype == np.int64
    np.testing.assert_array_equal(ds.labels, labels)
    assert str(directory) in ds.source and ds.spec.name == name
    assert no_tfds == []
    onehot = ds.one_hot()
    assert onehot.shape == (15, 10) and onehot.dtype == np.float32
    np.testing.assert_array_equal(onehot.argmax(1), labels)


def test_load_test_split_and_limit(tmp_path: Path, no_tfds: list[str]) -> None:
    write_mnist_split(tmp_path, n=30, split="train", seed=1)
    _, test_labels = write_mnist_split(tmp_path, n=12, split="test", seed=2)
    ds = load_dataset("mnist", tmp_path, split="test", limit=5)
    assert len(ds) == 5
    np.testing.assert_array_equal(ds.labels, test_labels[:5])
    with pytest.raises(DataError, match="'validation'.*'train' or 'test'"):
        load_dataset("mnist", tmp_path, split="validation")


def test_load_count_mismatch(tmp_path: Path, no_tfds: list[str]) -> None:
    write_mnist_split(tmp_path, n=10, n_labels=9)
    with pytest.raises(DataError, match=r"10 images but labels have shape \(9,\)") as info:
        load_dataset("mnist", tmp_path)
    assert "train-images-idx3-ubyte" in str(info.value)
    assert "train-labels-idx1-ubyte" in str(info.value)


def test_load_wrong_image_size(tmp_path: Path, no_tfds: list[str]) -> None:
    write_mnist_split(tmp_path, n=4, size=32)
    with pytest.raises(DataError, match=r"\(4, 32, 32\).*\[N, 28, 28\]"):
        load_dataset("mnist", tmp_path)


def test_load_label_out_of_range(tmp_path: Path, no_tfds: list[str]) -> None:
    write_mnist_split(tmp_path, n=4)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1, 2, 10, 3], np.uint8))
    with pytest.raises(DataError, match="label value 10 >= 10"):
        load_dataset("mnist", tmp_path)


def test_load_bad_magic_through_loader(tmp_path: Path, no_tfds: list[str]) -> None:
    write_mnist_split(tmp_path / "fashion_mnist", n=4)
    (tmp_path / "fashion_mnist" / "train-images-idx3-ubyte").write_bytes(b"GIF89a....")
    with pytest.raises(DataError, match="bad magic"):
        load_dataset("fashion_mnist", tmp_path)


def test_load_missing_lists_paths_tried(tmp_path: Path, no_tfds: list[str]) -> None:
    with pytest.raises(DataError) as info:
        load_dataset("fashion_mnist", tmp_path / "empty")
    message = str(info.value)
    for path in (tmp_path / "empty" / "fashion_mnist" / "train-images-idx3-ubyte",
                 tmp_path / "empty" / "fashion_mnist" / "train-labels-idx1-ubyte.gz",
                 tmp_path / "empty" / "train-images-idx3-ubyte.gz"):
        assert str(path) in message
    assert "tensorflow_datasets prepared copy" in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert no_tfds == ["fashion_mnist", "fashion_mnist"]
    with pytest.raises(DataError) as info:
        load_dataset("mnist", tmp_path / "empty", split="test")
    assert "t10k-images-idx3-ubyte" in str(info.value)
    assert "dataset-fashion-mnist" not in str(info.value)


def test_load_from_prepared_tfds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images = np.full((3, 28, 28, 1), 51, dtype=np.uint8)

    class Builder:
        data_dir = "/fake/tfds/mnist/3.0.1"

        def is_prepared(self) -> bool:
            return True

        def as_dataset(self, *, split: str, batch_size: int):
            assert split == "test" and batch_size == -1
            return {"image": images, "label": np.array([7, 0, 9], np.int64)}

    fake = types.SimpleNamespace(builder=lambda name, **kw: Builder(),
                                 as_numpy=lambda x: x)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    ds = load_dataset("mnist", tmp_path, split="test")
    assert ds.images.shape == (3, 28, 28, 1)
    np.testing.assert_allclose(ds.images, 0.2)
    np.testing.assert_array_equal(ds.labels, [7, 0, 9])
    assert ds.source.startswith("tfds:")


def test_real_tfds_never_downloads(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow_datasets")
    tried: list[str] = []
    assert data._load_from_tfds("mnist", "train", [tmp_path], tried) is None
    assert str(tmp_path) in tried[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not REAL_FMNIST.is_dir(),
                    reason=f"{REAL_FMNIST} absent (apt-get install dataset-fashion-mnist)")
def test_real_fashion_mnist() -> None:
    train = load_dataset("fashion_mnist")
    test = load_dataset("fashion_mnist", split="test")
    assert train.images.shape == (60000, 28, 28, 1)
    assert test.images.shape == (10000, 28, 28, 1)
    for ds in (train, test):
        assert ds.images.dtype == np.float32 and ds.images.max() == 1.0
        assert ds.images.min() == 0.0
        assert set(np.unique(ds.labels)) == set(range(10))
    assert np.all(np.bincount(train.labels) == 6000)


# ------------------------------------------------------------------ LabeledImages

def test_labeled_images_validation() -> None:
    spec = dataset_spec("mnist")
    ok = np.zeros((2, 28, 28, 1), np.float32)
    with pytest.raises(DataError, match="float32"):
        data.LabeledImages(ok.astype(np.float64), np.zeros(2, np.int64), spec, "t")
    with pytest.raises(DataError, match=r"\(2, 28, 28\)"):
        data.LabeledImages(ok[..., 0], np.zeros(2, np.int64), spec, "t")
    with pytest.raises(DataError, match="2 images but 3 labels"):
        data.LabeledImages(ok, np.zeros(3, np.int64), spec, "t")
    with pytest.raises(DataError, match=r"span \[2.0, 2.0\], expected \[0, 1\]"):
        data.LabeledImages(ok + 2, np.zeros(2, np.int64), spec, "t")
    with pytest.raises(DataError, match=r"labels span \[0, 10\]"):
        data.LabeledImages(ok, np.array([0, 10]), spec, "t")


# ------------------------------------------------------------------ CelebA

ATTRS = ["5_o_Clock_Shadow", "Black_Hair", "Blond_Hair", "Brown_Hair", "Male", "Young"]
# (male, black, blond, brown, partition)
CELEBA_ROWS = [
    (1, 1, 0, 0, 0), (0, 0, 1, 0, 0), (0, 0, 0, 1, 0), (1, 0, 0, 0, 0),  # 3: no hair
    (0, 1, 1, 0, 0),                                                      # 4: two hairs
    (1, 0, 1, 0, 1), (0, 1, 0, 0, 1), (1, 0, 0, 1, 1),
    (0, 0, 1, 0, 2), (1, 1, 0, 0, 2), (0, 0, 0, 0, 2), (1, 0, 0, 1, 2),   # 10: no hair
]


def make_celeba(root: Path) -> list[str]:
    """Write a 12-image CelebA in the official layout; return file names."""
    from PIL import Image
    (root / "img_align_celeba").mkdir(parents=True)
    files = [f"{i + 1:06d}.jpg" for i in range(len(CELEBA_ROWS))]
    attr_lines = [str(len(files)), " ".join(ATTRS)]
    part_lines = []
    for i, (name, (male, black, blond, brown, part)) in enumerate(zip(files, CELEBA_ROWS)):
        pixels = np.zeros((218, 178, 3), np.uint8)
        pixels[20:198] = (10 * i, 255, 0)  # central 178x178 square is coloured
        Image.fromarray(pixels).save(root / "img_align_celeba" / name, quality=95)
        values = [-1, black, blond, brown, male, 1]
        attr_lines.append(name + "  " + " ".join(f"{1 if v == 1 else -1:2d}" for v in values))
        part_lines.append(f"{name} {part}")
    (root / "list_attr_celeba.txt").write_text("\n".join(attr_lines) + "\n")
    (root / "list_eval_partition.txt").write_text("\n".join(part_lines) + "\n")
    return files


@pytest.fixture
def celeba_dir(tmp_path: Path) -> Path:
    pytest.importorskip("PIL")
    make_celeba(tmp_path / "celebA")
    return tmp_path


def test_celeba_gender_splits(celeba_dir: Path) -> None:
    male = np.array([r[0] for r in CELEBA_ROWS])
    part = np.array([r[4] for r in CELEBA_ROWS])
    for split, code in (("train", 0), ("val", 1), ("test", 2), ("all", None)):
        ds = load_dataset(f"celebA-gender-{split}", celeba_dir, split="ignored",
                          progress=False)
        expected = male if code is None else male[part == code]
        np.testing.assert_array_equal(ds.labels, expected)
        assert ds.images.shape == (len(expected), 64, 64, 3)
        assert ds.images.dtype == np.float32
    # centre crop: the coloured band (not the black margins) fills the output
    assert ds.images[:, [0, -1], :, 1].min() > 0.9
    np.testing.assert_allclose(ds.images[:, 2:-2, :, 1], 1.0, atol=0.02)
    np.testing.assert_allclose(ds.images[5, 2:-2, :, 0], 50 / 255, atol=0.03)


def test_celeba_hair_labels_and_limit(celeba_dir: Path, capsys) -> None:
    ds = load_dataset("celebA-hair-all", celeba_dir / "celebA")
    # rows 3, 4 (two hairs) and 10 are excluded
    np.testing.assert_array_equal(ds.labels, [0, 1, 2, 1, 0, 2, 1, 0, 2])
    assert ds.spec.num_classes == 3 and ds.one_hot().shape == (9, 3)
    assert "loaded 9/9" in capsys.readouterr().err
    train = load_dataset("celebA-hair-train", celeba_dir, progress=False)
    np.testing.assert_array_equal(train.labels, [0, 1, 2])
    small = load_dataset("celebA-hair-test", celeba_dir, limit=2, progress=False)
    np.testing.assert_array_equal(small.labels, [1, 0])


def test_celeba_missing_image(celeba_dir: Path) -> None:
    (celeba_dir / "celebA" / "img_align_celeba" / "000002.jpg").unlink()
    with pytest.raises(DataError, match=r"000002\.jpg.*missing"):
        load_dataset("celebA-gender-train", celeba_dir, progress=False)


def test_celeba_unreadable_image(celeba_dir: Path) -> None:
    (celeba_dir / "celebA" / "img_align_celeba" / "000001.jpg").write_bytes(b"notajpeg")
    with pytest.raises(DataError, match=r"cannot read image .*000001\.jpg"):
        load_dataset("celebA-gender-all", celeba_dir, progress=False)


def test_celeba_missing_files(tmp_path: Path, celeba_dir: Path) -> None:
    with pytest.raises(DataError, match="list_attr_celeba.txt not found"):
        load_dataset("celebA-gender-train", tmp_path / "nowhere")
    with pytest.raises(DataError, match="needs data_dir"):
        load_dataset("celebA-gender-train")
    root = celeba_dir / "celebA"
    (root / "list_eval_partition.txt").unlink()
    with pytest.raises(DataError, match="list_eval_partition.txt not found"):
        load_dataset("celebA-gender-val", celeba_dir)
    assert len(load_dataset("celebA-gender-all", celeba_dir, progress=False)) == 12
    text = (root / "list_attr_celeba.txt").read_text().replace("Male", "Female")
    (root / "list_attr_celeba.txt").write_text(text)
    with pytest.raises(DataError, match="attribute 'Male' missing from .*list_attr"):
        load_dataset("celebA-gender-all", celeba_dir)


def test_celeba_malformed_attr_row(celeba_dir: Path) -> None:
    path = celeba_dir / "celebA" / "list_attr_celeba.txt"
    lines = path.read_text().splitlines()
    lines[4] = lines[4].rsplit(" ", 1)[0]
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match="line 5: expected a file name and 6 values"):
        load_dataset("celebA-gender-all", celeba_dir)


# ------------------------------------------------------------------ partition

def imbalanced_labels(seed: int = 0) -> np.ndarray:
    """1000 x class 0, 100 x class 1 (10x rarer), 7 x class 2 (< #partitions)."""
    labels = np.repeat([0, 1, 2], [1000, 100, 7])
    return np.random.default_rng(seed).permutation(labels)


def check_partition(parts: np.ndarray, labels: np.ndarray, t: int, c: int) -> None:
    """Assert disjointness, equal sizes and per-class balance."""
    n = len(labels)
    assert parts.dtype == np.int64 and parts.shape == (t, n // t)
    assert len(np.unique(parts)) == parts.size, "a record index is reused"
    assert parts.min() >= 0 and parts.max() < n
    counts = data.partition_class_counts(labels, parts, num_classes=c)
    assert np.all(counts.max(axis=0) - counts.min(axis=0) <= 1), counts
    assert np.all(counts.sum(axis=1) == n // t)


@pytest.mark.parametrize("t", [1, 3, 10, 50, 1107])
def test_partition_guarantees(t: int) -> None:
    labels = imbalanced_labels()
    parts = partition(labels, t, num_classes=3, seed=123)
    check_partition(parts, labels, t, 3)


def test_partition_keeps_rare_class_when_divisible() -> None:
    labels = np.repeat([0, 1, 2], [1000, 100, 8])  # 1108 = 4 * 277, nothing dropped
    parts = partition(labels, 4, num_classes=3, seed=0)
    check_partition(parts, labels, 4, 3)
    np.testing.assert_array_equal(np.sort(parts.ravel()), np.arange(1108))
    counts = data.partition_class_counts(labels, parts, num_classes=3)
    np.testing.assert_array_equal(counts[:, 2], [2, 2, 2, 2])


def test_partition_seeded() -> None:
    labels = imbalanced_labels()
    a = partition(labels, 10, num_classes=3, seed=7)
    np.testing.assert_array_equal(a, partition(labels, 10, num_classes=3, seed=7))
    assert not np.array_equal(a, partition(labels, 10, num_classes=3, seed=8))


def wraparound_partitioner(labels: np.ndarray, t: int, num_classes: int) -> np.ndarray:
    """The authors' bug: each partition takes a fixed per-class quota, wrapping
    around inside a class that is too small (so records get reused)."""
    m = len(labels) // t
    parts = []
    for p in range(t):
        row = []
        for c in range(num_classes):
            quota = m // num_classes + (c < m % num_classes)
            idx = np.flatnonzero(labels == c)
            row.extend(idx[(p * quota + np.arange(quota)) % len(idx)])
        parts.append(row)
    return np.array(parts, dtype=np.int64)


def test_disjointness_check_catches_wraparound_bug() -> None:
    labels = imbalanced_labels()
    buggy = wraparound_partitioner(labels, 10, 3)
    assert len(np.unique(buggy)) < buggy.size  # the check used above would fail
    with pytest.raises(AssertionError, match="reused"):
        check_partition(buggy, labels, 10, 3)


def _changed_parts(parts_a: np.ndarray, parts_b: np.ndarray) -> int:
    """How many parts hold a different set of record indices."""
    return sum(set(a) != set(b) for a, b in zip(parts_a.tolist(), parts_b.tolist()))


def test_replacing_one_record_changes_one_index_part_but_many_class_balanced_parts() -> None:
    """The unit of the teachers' sensitivity: replace record 7 by an adversarial one (its
    label changes).  The index partition does not look at the data: the same parts, so
    only the part holding record 7 sees a different record.  The class-balanced one
    stripes records over parts in label order: the change shifts the records between
    the two labels into other parts -- here most of the 50 parts change."""
    from dclens.data import index_partition

    labels = np.arange(600) % 10
    swapped = labels.copy()
    swapped[7] = 2                                   # label 7 -> 2
    index_a, index_b = (index_partition(len(labels), 50, seed=3) for _ in range(2))
    np.testing.assert_array_equal(index_a, index_b)  # data-independent: identical parts
    assert int(np.sum(index_a == 7)) <= 1            # record 7 is in at most one part
    balanced_a = partition(labels, 50, num_classes=10, seed=3)
    balanced_b = partition(swapped, 50, num_classes=10, seed=3)
    assert _changed_parts(balanced_a, balanced_b) > 25


def test_partition_errors() -> None:
    labels = np.array([0, 1, 1, 0, 2])
    with pytest.raises(ValueError, match=r"more teachers \(6\) than records \(5\).*at most 5"):
        partition(labels, 6, num_classes=3, seed=0)
    with pytest.raises(ValueError, match="num_partitions must be >= 1, got 0"):
        partition(labels, 0, num_classes=3, seed=0)
    with pytest.raises(ValueError, match=r"labels span \[0, 2\].*\[0, 2\)"):
        partition(labels, 2, num_classes=2, seed=0)
    with pytest.raises(ValueError, match="1-D integer"):
        partition(labels.astype(float), 2, num_classes=3, seed=0)
    with pytest.raises(ValueError, match="1-D integer"):
        partition(labels.reshape(5, 1), 2, num_classes=3, seed=0)
    with pytest.raises(ValueError, match=r"labels span \[-1"):
        partition(np.array([-1, 0, 1]), 1, num_classes=3, seed=0)


def test_import_is_cheap() -> None:
    import subprocess
    code = ("import sys, dclens.data; "
            "bad = [m for m in ('tensorflow', 'tensorflow_datasets', 'PIL') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[1])


# ------------------------------------------------------- the authors' CelebA pickles
def _write_authors_gender(folder, rng):
    import joblib

    folder.mkdir(parents=True, exist_ok=True)
    parts = {"celebA-trn-x-lg-ups-0.pkl": 3, "celebA-trn-x-lg-ups-1.pkl": 2,
             "celebA-val-x-lg-ups-0.pkl": 2, "celebA-tst-x.pkl": 1}
    images = {}
    for name, count in parts.items():
        images[name] = rng.integers(0, 256, size=(count, 64, 64, 3)).astype(np.float64)
        joblib.dump(images[name], folder / name)
    labels = {"celebA-trn-gender-lg-ups.pkl": np.array([0, 1, 1, 0, 1]),
              "celebA-val-gender-lg-ups.pkl": np.array([1, 0]),
              "celebA-tst-gender.pkl": np.array([1])}
    for name, value in labels.items():
        joblib.dump(value, folder / name)
    return images, labels


def test_authors_celeba_pickles_are_read_as_their_loader_does(tmp_path):
    images, labels = _write_authors_gender(tmp_path / "celebA", np.random.default_rng(0))
    train = data.load_dataset("celebA-gender-train", tmp_path)
    want = np.concatenate([images["celebA-trn-x-lg-ups-0.pkl"],
                           images["celebA-trn-x-lg-ups-1.pkl"],
                           images["celebA-val-x-lg-ups-0.pkl"]]) / 255.0
    np.testing.assert_allclose(train.images, want.astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(train.labels, [0, 1, 1, 0, 1, 1, 0])
    assert "authors' gender pickles" in train.source
    val = data.load_dataset("celebA-gender-val", tmp_path)
    assert len(val) == 2 and list(val.labels) == [1, 0]
    test = data.load_dataset("celebA-gender-test", tmp_path, limit=1)
    assert test.images.shape == (1, 64, 64, 3) and test.images.max() <= 1.0
    with pytest.raises(data.DataError, match="splits"):
        data.load_dataset("celebA-gender-all", tmp_path)


def test_authors_celeba_pickles_refuse_incomplete_or_wrong_files(tmp_path):
    import joblib

    _write_authors_gender(tmp_path, np.random.default_rng(1))
    (tmp_path / "celebA-tst-x.pkl").unlink()
    with pytest.raises(data.DataError, match="celebA-tst-x.pkl not found"):
        data.load_dataset("celebA-gender-test", tmp_path)
    joblib.dump(np.zeros((2, 32, 32, 3)), tmp_path / "celebA-val-x-lg-ups-0.pkl")
    with pytest.raises(data.DataError, match=r"shape \(32, 32, 3\)"):
        data.load_dataset("celebA-gender-val", tmp_path)
    joblib.dump(np.zeros((3, 64, 64, 3)), tmp_path / "celebA-val-x-lg-ups-0.pkl")
    with pytest.raises(data.DataError, match="3 images but 2 labels"):
        data.load_dataset("celebA-gender-val", tmp_path)
