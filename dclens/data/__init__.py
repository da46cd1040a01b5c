"""Dataset loading and disjoint partitioning for dclens (the partitions:
:mod:`dclens.data.partitions`).

Everything here returns plain NumPy arrays. TensorFlow, TensorFlow Datasets and
PIL are imported lazily inside the functions that need them, so importing this
module is cheap.

Supported dataset names (the DataLens authors' names):

* ``mnist``, ``fashion_mnist`` -- 28x28x1, 10 classes, read from IDX files
  (or from an already prepared TensorFlow Datasets copy; never downloaded).
* ``celebA-gender-<split>`` -- 64x64x3, 0=female, 1=male (``Male`` attribute).
* ``celebA-hair-<split>`` -- 64x64x3, 0=Black_Hair, 1=Blond_Hair, 2=Brown_Hair;
  only images with exactly one of the three attributes set are kept.

``<split>`` is one of train/val/test/all (``list_eval_partition.txt``:
0=train, 1=val, 2=test).
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

# The partition API is the package's too (``data.index_partition`` etc.).
from dclens.data.partitions import (check_labels, check_partitions,  # noqa: F401
                                    index_partition, partition, partition_class_counts)

DEFAULT_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

_FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_HAIR_ATTRIBUTES = ("Black_Hair", "Blond_Hair", "Brown_Hair")
_CELEBA_SPLITS = {"train": 0, "val": 1, "test": 2, "all": None}
_IDX_UINT8 = 0x08
_PROGRESS_EVERY = 10_000


class DataError(ValueError):
    """Missing/corrupt/mismatched data; message names the file and what to do."""


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Static facts about a dataset name."""

    name: str
    height: int
    width: int
    channels: int
    num_classes: int
    class_names: tuple[str, ...]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(height, width, channels)."""
        return (self.height, self.width, self.channels)


def valid_dataset_names() -> tuple[str, ...]:
    """Every name accepted by :func:`dataset_spec` and :func:`load_dataset`."""
    celeba = tuple(f"celebA-{task}-{split}" for task in ("gender", "hair")
                   for split in _CELEBA_SPLITS)
    return ("mnist", "fashion_mnist") + celeba


def dataset_spec(name: str) -> DatasetSpec:
    """Return the :class:`DatasetSpec` for ``name``; DataError if unknown."""
    if name == "mnist":
        return DatasetSpec(name, 28, 28, 1, 10, tuple(str(d) for d in range(10)))
    if name == "fashion_mnist":
        return DatasetSpec(name, 28, 28, 1, 10, _FASHION_CLASSES)
    if name in valid_dataset_names():
        if name.startswith("celebA-gender-"):
            return DatasetSpec(name, 64, 64, 3, 2, ("female", "male"))
        return DatasetSpec(name, 64, 64, 3, 3, _HAIR_ATTRIBUTES)
    raise DataError(f"unknown dataset name {name!r}; valid names are: "
                    f"{', '.join(valid_dataset_names())}")


@dataclasses.dataclass(frozen=True, eq=False)
class LabeledImages:
    """Images (float32 NHWC in [0, 1]) with int64 labels, validated on creation."""

    images: np.ndarray
    labels: np.ndarray
    spec: DatasetSpec
    source: str

    def __post_init__(self) -> None:
        img, lab, spec = self.images, self.labels, self.spec
        where = f" (loaded from {self.source})"
        if not isinstance(img, np.ndarray) or img.dtype != np.float32:
            raise DataError(f"images must be a float32 ndarray, got "
                            f"{type(img).__name__} {getattr(img, 'dtype', '')}{where}")
        if img.ndim != 4 or img.shape[1:] != spec.image_shape:
            raise DataError(f"images have shape {img.shape}, expected "
                            f"[N, {', '.join(map(str, spec.image_shape))}] for "
                            f"{spec.name!r}{where}")
        if not isinstance(lab, np.ndarray) or lab.dtype != np.int64 or lab.ndim != 1:
            raise DataError(f"labels must be a 1-D int64 ndarray, got "
                            f"{getattr(lab, 'dtype', type(lab).__name__)} with shape "
                            f"{getattr(lab, 'shape', None)}{where}")
        if len(lab) != len(img):
            raise DataError(f"{len(img)} images but {len(lab)} labels{where}")
        if len(img) and not (img.min() >= 0.0 and img.max() <= 1.0):
            raise DataError(f"image values span [{img.min()}, {img.max()}], expected "
                            f"[0, 1] (NaN counts as out of range){where}")
        if len(lab) and (lab.min() < 0 or lab.max() >= spec.num_classes):
            raise DataError(f"labels span [{lab.min()}, {lab.max()}], expected "
                            f"[0, {spec.num_classes}) for {spec.name!r}{where}")

    def __len__(self) -> int:
        return len(self.labels)

    def one_hot(self) -> np.ndarray:
        """Labels as float32 one-hot rows, shape [N, num_classes]."""
        return np.eye(self.spec.num_classes, dtype=np.float32)[self.labels]


# --------------------------------------------------------------------- IDX files

def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (gzipped or raw, detected by magic bytes) of uint8 data."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"IDX file not found: {path}")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"{path} starts like gzip but cannot be decompressed "
                            f"({exc}); the file is corrupt or truncated, download "
                            f"it again") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path} is not an IDX file: bad magic {raw[:4].hex()!r} "
                        f"(expected 0000 followed by type and ndim bytes)")
    if raw[2] != _IDX_UINT8:
        raise DataError(f"{path} has IDX type code 0x{raw[2]:02x}; only 0x08 "
                        f"(uint8) is supported")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated: {len(raw)} bytes, but a {ndim}-D "
                        f"IDX header needs {header}; download it again")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims, dtype=np.int64))
    actual = len(raw) - header
    if actual < expected:
        raise DataError(f"{path} is truncated: header says shape {dims} "
                        f"({expected} bytes) but only {actual} data bytes follow; "
                        f"download it again")
    if actual > expected:
        raise DataError(f"{path} has {actual - expected} bytes of trailing garbage "
                        f"after the {expected} bytes of shape {dims}; the file is "
                        f"corrupt, download it again")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


# ------------------------------------------------------------------- loading

def load_dataset(name: str, data_dir: str | os.PathLike | None = None, *,
                 split: str = "train", limit: int | None = None,
                 progress: bool = True) -> LabeledImages:
    """Load dataset ``name`` as :class:`LabeledImages`.

    For mnist/fashion_mnist ``split`` is "train" or "test"; for celebA the
    split is part of the name and ``split`` is ignored. ``limit`` keeps only
    the first ``limit`` records of the split. ``progress`` prints CelebA
    loading progress to stderr. See the module docstring for layouts.
    """
    spec = dataset_spec(name)
    if limit is not None and limit < 0:
        raise DataError(f"limit must be None or >= 0, got {limit}")
    if name in ("mnist", "fashion_mnist"):
        return _load_idx_dataset(spec, data_dir, split, limit)
    return _load_celeba(spec, data_dir, limit, progress)


def _idx_search_dirs(name: str, data_dir: str | os.PathLike | None) -> list[Path]:
    """Directories searched for IDX files, in order."""
    if data_dir is not None:
        return [Path(data_dir) / name, Path(data_dir)]
    if name == "fashion_mnist":
        return [Path(DEFAULT_FASHION_MNIST_DIR)]
    return []


def _find_idx_pair(directory: Path, split: str,
                   tried: list[str]) -> tuple[Path, Path] | None:
    """Return (images, labels) paths in ``directory`` if both exist."""
    prefix = "train" if split == "train" else "t10k"
    found = []
    for stem in (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"):
        candidates = [directory / stem, directory / f"{stem}.gz"]
        tried.extend(str(c) for c in candidates)
        found.append(next((c for c in candidates if c.is_file()), None))
    return (found[0], found[1]) if None not in found else None


def _load_idx_dataset(spec: DatasetSpec, data_dir: str | os.PathLike | None,
                      split: str, limit: int | None) -> LabeledImages:
    """Load mnist/fashion_mnist from IDX files, falling back to prepared TFDS."""
    if split not in ("train", "test"):
        raise DataError(f"split {split!r} is not valid for {spec.name!r}; "
                        f"use 'train' or 'test'")
    tried: list[str] = []
    for directory in _idx_search_dirs(spec.name, data_dir):
        pair = _find_idx_pair(directory, split, tried)
        if pair is not None:
            images, labels = read_idx(pair[0]), read_idx(pair[1])
            source = f"{pair[0]} + {pair[1]}"
            return _mnist_like(spec, images, labels, source, limit)
    tfds_dirs = [data_dir] if data_dir is not None else []
    loaded = _load_from_tfds(spec.name, split, tfds_dirs + [None], tried)
    if loaded is not None:
        return _mnist_like(spec, *loaded, limit)
    hint = ("; or install the Debian package: apt-get install dataset-fashion-mnist "
            f"(files land in {DEFAULT_FASHION_MNIST_DIR})"
            if spec.name == "fashion_mnist" else "")
    raise DataError(
        f"could not find {spec.name!r} split {split!r}. Tried:\n  "
        + "\n  ".join(tried)
        + f"\nPut the IDX files (e.g. {'train' if split == 'train' else 't10k'}"
        f"-images-idx3-ubyte[.gz] and the matching labels-idx1 file) in "
        f"<data_dir>/{spec.name}/ and pass data_dir{hint}")


def _load_from_tfds(name: str, split: str, data_dirs: list,
                    tried: list[str]) -> tuple[np.ndarray, np.ndarray, str] | None:
    """Load an already prepared TFDS copy (never downloads); None if absent."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        tried.append("tensorflow_datasets (not installed)")
        return None
    for data_dir in data_dirs:
        builder = tfds.builder(name, data_dir=None if data_dir is None
                               else str(data_dir), try_gcs=False)
        tried.append(f"tensorflow_datasets prepared copy at {builder.data_dir}")
        if not builder.is_prepared():
            continue
        arrays = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
        images = np.asarray(arrays["image"])
        if images.ndim == 4 and images.shape[-1] == 1:
            images = images[..., 0]
        return images, np.asarray(arrays["label"]), f"tfds:{builder.data_dir}"
    return None


def _mnist_like(spec: DatasetSpec, images: np.ndarray, labels: np.ndarray,
                source: str, limit: int | None) -> LabeledImages:
    """Validate uint8 [N,28,28] images + labels and convert to LabeledImages."""
    if images.ndim != 3 or images.shape[1:] != (spec.height, spec.width):
        raise DataError(f"{spec.name} images have shape {images.shape}, expected "
                        f"[N, {spec.height}, {spec.width}] ({source}); wrong file?")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(f"{len(images)} images but labels have shape "
                        f"{labels.shape} ({source}); the files do not belong together")
    if len(labels) and int(labels.max()) >= spec.num_classes:
        raise DataError(f"label value {int(labels.max())} >= {spec.num_classes} "
                        f"classes ({source}); wrong labels file?")
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    floats = (images.astype(np.float32) / np.float32(255.0))[..., None]
    return LabeledImages(floats, labels.astype(np.int64), spec, source)


# ------------------------------------------------------------------- CelebA

def _celeba_root(data_dir: str | os.PathLike | None, name: str) -> Path:
    """Return the directory holding CelebA's official files."""
    if data_dir is None:
        raise DataError(f"{name!r} needs data_dir: the folder that holds "
                        f"img_align_celeba/, list_attr_celeba.txt and "
                        f"list_eval_partition.txt (or a celebA/ subfolder with them)")
    roots = [Path(data_dir), Path(data_dir) / "celebA"]
    for root in roots:
        if (root / "list_attr_celeba.txt").is_file():
            return root
    raise DataError(f"list_attr_celeba.txt not found in {roots[0]} or {roots[1]}; "
                    f"download CelebA (aligned images + annotation files) there")


def _read_celeba_attributes(path: Path) -> tuple[list[str], list[str], np.ndarray]:
    """Parse list_attr_celeba.txt -> (file names, attribute names, int8 [N, A])."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    if len(lines) < 2 or not lines[0].strip().isdigit():
        raise DataError(f"{path}: expected an image count on line 1 and attribute "
                        f"names on line 2; is this CelebA's list_attr_celeba.txt?")
    names = lines[1].split()
    files, rows = [], []
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split()
        if len(fields) != len(names) + 1 or any(v not in ("1", "-1") for v in fields[1:]):
            raise DataError(f"{path} line {number}: expected a file name and "
                            f"{len(names)} values of 1/-1, got {line!r}")
        files.append(fields[0])
        rows.append([int(v) for v in fields[1:]])
    if len(files) != int(lines[0]):
        raise DataError(f"{path}: line 1 says {lines[0].strip()} images but "
                        f"{len(files)} rows follow; the file is truncated or corrupt")
    return files, names, np.array(rows, dtype=np.int8).reshape(len(files), len(names))


def _read_celeba_partition(path: Path) -> dict[str, int]:
    """Parse list_eval_partition.txt -> {file name: 0|1|2}."""
    if not path.is_file():
        raise DataError(f"{path} not found; it is needed for the train/val/test "
                        f"split (use a '-all' dataset name to skip it)")
    result = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or fields[1] not in ("0", "1", "2"):
            raise DataError(f"{path} line {number}: expected '<file> <0|1|2>', "
                            f"got {line!r}")
        result[fields[0]] = int(fields[1])
    return result


def _attribute_column(attr_names: list[str], wanted: str, path: Path) -> int:
    """Index of attribute ``wanted``; DataError naming the file if absent."""
    if wanted not in attr_names:
        raise DataError(f"attribute {wanted!r} missing from {path} (has "
                        f"{len(attr_names)} columns: {' '.join(attr_names)})")
    return attr_names.index(wanted)


def _celeba_labels(spec: DatasetSpec, attr_names: list[str], attrs: np.ndarray,
                   path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Return (keep mask, int64 labels for every row) for gender or hair."""
    if "-gender-" in spec.name:
        male = attrs[:, _attribute_column(attr_names, "Male", path)] == 1
        return np.ones(len(attrs), dtype=bool), male.astype(np.int64)
    cols = [_attribute_column(attr_names, a, path) for a in _HAIR_ATTRIBUTES]
    hair = attrs[:, cols] == 1
    return hair.sum(axis=1) == 1, hair.argmax(axis=1).astype(np.int64)


def _load_celeba_image(path: Path, size: int) -> np.ndarray:
    """Centre-crop to a square, resize to size x size, float32 HWC in [0, 1]."""
    from PIL import Image, UnidentifiedImageError
    if not path.is_file():
        raise DataError(f"image {path} is listed in list_attr_celeba.txt but "
                        f"missing; re-extract img_align_celeba")
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            w, h = img.size
            side = min(w, h)
            left, top = (w - side) // 2, (h - side) // 2
            img = img.crop((left, top, left + side, top + side))
            img = img.resize((size, size), Image.BILINEAR)
            return np.asarray(img, dtype=np.float32) / np.float32(255.0)
    except (OSError, UnidentifiedImageError, SyntaxError) as exc:
        raise DataError(f"cannot read image {path} ({exc}); the file is corrupt, "
                        f"re-extract img_align_celeba") from exc


#: The authors' preprocessed CelebA pickles (their model.py ``load_batch_celebA_gender`` /
#: ``load_batch_celebA_hair``): split -> (image chunk patterns, label files).  Their
#: "train" reads their train and val pickles (they train on both).
AUTHORS_CELEBA_FILES = {
    "gender": {"train": (["celebA-trn-x-lg-ups-{i}.pkl", "celebA-val-x-lg-ups-{i}.pkl"],
                         ["celebA-trn-gender-lg-ups.pkl", "celebA-val-gender-lg-ups.pkl"]),
               "val": (["celebA-val-x-lg-ups-{i}.pkl"], ["celebA-val-gender-lg-ups.pkl"]),
               "test": (["celebA-tst-x.pkl"], ["celebA-tst-gender.pkl"])},
    "hair": {"train": (["celeb-trn-ups-hair-x-{i}.pkl", "celeb-val-ups-hair-x-{i}.pkl"],
                       ["celeb-trn-ups-hair-y.pkl", "celeb-val-ups-hair-y.pkl"]),
             "val": (["celeb-val-ups-hair-x-{i}.pkl"], ["celeb-val-ups-hair-y.pkl"]),
             "test": (["celeb-tst-ups-hair-x.pkl"], ["celeb-tst-ups-hair-y.pkl"])},
}


def _authors_celeba_root(data_dir: str | os.PathLike | None, spec: DatasetSpec
                         ) -> tuple[Path, str, str] | None:
    """(folder, task, split) if ``data_dir`` (or its celebA/) holds the authors' pickles
    for ``spec``'s task, else None."""
    if data_dir is None:
        return None
    task, split = spec.name.split("-")[1], spec.name.rsplit("-", 1)[1]
    first = AUTHORS_CELEBA_FILES[task]["val"][1][0]
    for root in (Path(data_dir), Path(data_dir) / "celebA"):
        if (root / first).is_file():
            return root, task, split
    return None


def _read_trusted_pickle(path: Path) -> np.ndarray:
    """One joblib/pickle array of the authors' layout (pickles can run code: trusted files
    only)."""
    import joblib

    try:
        return np.asarray(joblib.load(path))
    except Exception as error:
        raise DataError(f"cannot read {path} as the authors' joblib pickle: "
                        f"{type(error).__name__}: {error}") from error


def _load_authors_celeba(spec: DatasetSpec, root: Path, task: str, split: str,
                         limit: int | None) -> LabeledImages:
    """CelebA from the authors' preprocessed pickles: images [N, 64, 64, 3] in [0, 1] or
    [0, 255] (scaled to [0, 1]) in numbered chunks, labels as class indices."""
    if split not in AUTHORS_CELEBA_FILES[task]:
        raise DataError(f"{spec.name!r}: the authors' CelebA pickles have the splits "
                        f"{sorted(AUTHORS_CELEBA_FILES[task])}, not {split!r}")
    patterns, label_files = AUTHORS_CELEBA_FILES[task][split]
    chunks = []
    for pattern in patterns:
        paths = [root / pattern] if "{i}" not in pattern else []
        i = 0
        while "{i}" in pattern and (root / pattern.format(i=i)).is_file():
            paths.append(root / pattern.format(i=i))
            i += 1
        if not paths or not paths[0].is_file():
            raise DataError(f"{root / pattern.format(i=0)} not found: the authors' "
                            f"{spec.name} pickles are incomplete in {root}")
        chunks.extend(_read_trusted_pickle(path) for path in paths)
    images = np.concatenate(chunks).astype(np.float32)
    labels = np.concatenate([_read_trusted_pickle(root / f).reshape(-1)
                             for f in label_files]).astype(np.int64)
    if images.shape[1:] != (spec.height, spec.width, spec.channels):
        raise DataError(f"the authors' {spec.name} images in {root} have shape "
                        f"{images.shape[1:]}, expected {(spec.height, spec.width, spec.channels)}")
    if len(images) != len(labels):
        raise DataError(f"the authors' {spec.name} pickles in {root} hold {len(images)} "
                        f"images but {len(labels)} labels")
    if images.size and images.max() > 1.0:
        images /= 255.0
    if images.size and (images.min() < 0.0 or images.max() > 1.0):
        raise DataError(f"the authors' {spec.name} images in {root} are outside [0, 255]")
    labels = check_labels(labels, spec.num_classes)
    return LabeledImages(images[:limit], labels[:limit], spec,
                         f"{root} (the authors' {task} pickles, {split})")


def _load_celeba(spec: DatasetSpec, data_dir: str | os.PathLike | None,
                 limit: int | None, progress: bool) -> LabeledImages:
    """Load celebA-gender-<split> / celebA-hair-<split>: the authors' preprocessed pickles
    when ``data_dir`` holds them, else the official layout."""
    authors = _authors_celeba_root(data_dir, spec)
    if authors is not None:
        return _load_authors_celeba(spec, *authors, limit)
    root = _celeba_root(data_dir, spec.name)
    image_dir = root / "img_align_celeba"
    if (image_dir / "img_align_celeba").is_dir():  # zip extracted one level deeper
        image_dir = image_dir / "img_align_celeba"
    if not image_dir.is_dir():
        raise DataError(f"image folder {image_dir} not found; extract "
                        f"img_align_celeba.zip into {root}")
    attr_path = root / "list_attr_celeba.txt"
    files, attr_names, attrs = _read_celeba_attributes(attr_path)
    keep, labels = _celeba_labels(spec, attr_names, attrs, attr_path)
    split_code = _CELEBA_SPLITS[spec.name.rsplit("-", 1)[1]]
    if split_code is not None:
        part_path = root / "list_eval_partition.txt"
        partition_of = _read_celeba_partition(part_path)
        missing = [f for f in files if f not in partition_of]
        if missing:
            raise DataError(f"{len(missing)} images (first: {missing[0]}) from "
                            f"{attr_path} are not listed in {part_path}")
        keep &= np.array([partition_of[f] == split_code for f in files], dtype=bool)
    chosen = np.flatnonzero(keep)[:limit]
    images = np.empty((len(chosen), spec.height, spec.width, 3), dtype=np.float32)
    for i, row in enumerate(chosen):
        images[i] = _load_celeba_image(image_dir / files[row], spec.height)
        if progress and ((i + 1) % _PROGRESS_EVERY == 0 or i + 1 == len(chosen)):
            print(f"[dclens.data] {spec.name}: loaded {i + 1}/{len(chosen)} images",
                  file=sys.stderr, flush=True)
    return LabeledImages(images, labels[chosen], spec, f"{image_dir} + {attr_path}")


# ------------------------------------------------------------------ partition
