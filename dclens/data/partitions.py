"""The disjoint partitions of a data set's records among teachers (or discriminators).

Disjointness is what the one-teacher sensitivity rests on: a record is in exactly one
partition, so replacing it changes one teacher's data.  :func:`index_partition` (dclens'
default) cuts a random permutation of the record *indices*, so which partition a record
joins does not depend on any record; :func:`partition` is the authors' class-balanced
split, which depends on every label (replacing one record can move many), so runs that use
it carry no proven epsilon.  :func:`check_partitions` validates partitions given from
outside (e.g. the authors', for the side-by-side harness).
"""

from __future__ import annotations

import numpy as np


def partition(labels: np.ndarray, num_partitions: int, *, num_classes: int,
              seed: int) -> np.ndarray:
    """Split record indices into ``num_partitions`` disjoint, class-balanced parts.

    **Data-dependent:** records are striped over the parts in label order, so replacing
    one record can move many others to other parts.  A mechanism whose sensitivity counts
    one part per record is not private on these parts; use :func:`index_partition`.  (The
    authors' ``--shuffle``; kept for side-by-side runs.)

    Returns int64 [num_partitions, m] with m = len(labels) // num_partitions.

    Guarantees:

    * Disjoint: every record index appears at most once in the whole array
      (this is what the DP analysis of the teacher ensemble relies on). The
      ``len(labels) - num_partitions * m`` leftover records are dropped, chosen
      uniformly at random.
    * Equal sizes: every partition holds exactly m records.
    * Class balance: for every class, the per-partition counts of that class
      differ by at most one across partitions (as even as the kept records
      allow; a class with fewer records than partitions is absent from some).
    * Deterministic: the same (labels, num_partitions, num_classes, seed) gives
      the same result. Record order inside each partition is shuffled.
    """
    labels = check_labels(labels, num_classes)
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)):
        raise ValueError(f"num_partitions must be an int, got {num_partitions!r}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    n = len(labels)
    m = n // num_partitions
    if m < 1:
        raise ValueError(f"more teachers ({num_partitions}) than records ({n}): "
                         f"each partition would be empty; use at most {n} teachers")
    rng = np.random.default_rng(seed)
    kept = rng.permutation(n)[: num_partitions * m]  # random drop + in-class shuffle
    by_class = kept[np.argsort(labels[kept], kind="stable")]
    striped = by_class.reshape(m, num_partitions).T  # element j -> partition j % T
    return np.ascontiguousarray(rng.permuted(striped, axis=1), dtype=np.int64)


def index_partition(num_records: int, num_partitions: int, *, seed: int) -> np.ndarray:
    """Disjoint partitions of a random permutation of the record *indices*, [N, m].

    Which partition record i joins depends on i and ``seed`` only, never on the data, so
    replacing one record changes exactly one partition's data (the unit of the teachers'
    sensitivity argument).  The ``num_records - N * m`` leftover records are dropped.
    Adding or removing a record changes ``num_records`` and so the whole permutation:
    the guarantee is for replace-one adjacency only (as the ledger's events say), over
    the records the loader kept (CelebA-Hair: those with exactly one hair attribute).
    """
    m = num_records // num_partitions
    if m < 1:
        raise ValueError(f"more teachers ({num_partitions}) than records ({num_records}): "
                         f"each partition would be empty; use at most {num_records} teachers")
    order = np.random.default_rng(seed).permutation(num_records)
    return order[:num_partitions * m].reshape(num_partitions, m).astype(np.int64)


def check_partitions(partitions, *, num_records: int, num_teachers: int) -> np.ndarray:
    """Validates explicit teacher partitions; returns them as int64 [num_teachers, m].

    Each row lists one teacher's record indices into a data set of ``num_records``
    records.  The teacher ensemble's privacy rests on the rows being **disjoint** (one
    record moves one teacher), so a record in two rows is refused, as are indices out of
    range, ragged or empty rows and a row count other than ``num_teachers``.
    """
    array = np.asarray(partitions)
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"partitions must be a 2-D array [teachers, records per teacher], "
                         f"got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"partitions must hold integer record indices, got dtype "
                         f"{array.dtype}")
    if array.shape[0] != num_teachers:
        raise ValueError(f"partitions has {array.shape[0]} rows but the run has "
                         f"{num_teachers} teachers; give one row per teacher")
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= num_records:
        raise ValueError(f"partition indices must be in [0, {num_records}), got values from "
                         f"{low} to {high}")
    flat = np.sort(array, axis=None)
    repeated = flat[1:][flat[1:] == flat[:-1]]
    if repeated.size:
        raise ValueError(f"partitions are not disjoint: record {int(repeated[0])} (and "
                         f"{np.unique(repeated).size - 1} more) is in more than one "
                         f"partition; one record must move only one teacher")
    return np.ascontiguousarray(array, dtype=np.int64)


def partition_class_counts(labels: np.ndarray, parts: np.ndarray, *,
                           num_classes: int) -> np.ndarray:
    """Per-partition class histogram: int64 [num_partitions, num_classes]."""
    labels = check_labels(labels, num_classes)
    parts = np.asarray(parts)
    return np.stack([np.bincount(labels[row], minlength=num_classes) for row in parts]
                    ).astype(np.int64)


def check_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Validate 1-D integer labels in [0, num_classes); return them as an array."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise ValueError(f"labels must be a 1-D integer array, got dtype "
                         f"{labels.dtype} with shape {labels.shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels span [{labels.min()}, {labels.max()}], outside "
                         f"[0, {num_classes}); pass the right num_classes")
    return labels
