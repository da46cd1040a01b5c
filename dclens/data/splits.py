"""Which training records a run reads: all of them, the private ones, or the tuning split.

Choosing hyper-parameters by looking at what a private run produced leaks the private
data through the choice.  Runs beyond the paper therefore choose on a **tuning split**, the
last :data:`TUNING_RECORDS` records of the training split, which the private runs of such
a configuration never read::

    records [0, n - 10000)          private     what a "plus" run trains on (its guarantee
                                                 covers exactly these records)
    records [n - 10000, n - 2000)   tuning      what a screening run trains on
    records [n - 2000, n)           holdout     what a screening run is scored on, in place
                                                 of the real test set

(n = 60,000 for MNIST and Fashion-MNIST, whose record files are in random class order:
the tuning split of Fashion-MNIST holds 761-831 records of each class, its holdout
178-220.)  The split is by index, fixed and data-independent, so a private run on the
private records is an ordinary run on a smaller dataset: its partition and accounting are
unchanged.  The tuning records are used without privacy; a report of a tuned
configuration says that it was tuned on them.

:attr:`TrainingRecords.ALL` (every record) is the paper's and the default.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from typing import Callable

from dclens import data

#: Records at the end of the training split set aside for tuning (training + holdout).
TUNING_RECORDS = 10_000
#: The last records of the tuning split: a screening run's test set.
TUNING_HOLDOUT_RECORDS = 2_000


class TrainingRecords(str, enum.Enum):
    """Which records of the training split a run trains on (module docstring)."""

    ALL = "all"
    PRIVATE = "private"
    TUNING = "tuning"

    @classmethod
    def parse(cls, value: "str | TrainingRecords") -> "TrainingRecords":
        """``value`` as a member; a clear error naming the choices otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"training records must be one of "
                             f"{[m.value for m in cls]}, got {value!r}") from None


def _check_total(total: int) -> None:
    if total <= TUNING_RECORDS:
        raise ValueError(f"the training split has {total} records; the tuning split sets "
                         f"aside the last {TUNING_RECORDS}, so it needs more (use "
                         f"--training_records all on a dataset this small)")


def record_range(total: int, which: TrainingRecords | str) -> range:
    """The indices, into a training split of ``total`` records, of ``which`` records."""
    which = TrainingRecords.parse(which)
    if which is TrainingRecords.ALL:
        return range(total)
    _check_total(total)
    if which is TrainingRecords.PRIVATE:
        return range(total - TUNING_RECORDS)
    return range(total - TUNING_RECORDS, total - TUNING_HOLDOUT_RECORDS)


def holdout_range(total: int) -> range:
    """The indices of the tuning holdout (a screening run's test set)."""
    _check_total(total)
    return range(total - TUNING_HOLDOUT_RECORDS, total)


def describe(which: TrainingRecords | str, total: int) -> str:
    """One line for reports: which records were read and what that means."""
    which = TrainingRecords.parse(which)
    if which is TrainingRecords.ALL:
        return f"all {total} training records (the paper's)"
    span = record_range(total, which)
    if which is TrainingRecords.PRIVATE:
        return (f"the private records {span.start}-{span.stop - 1} only; records "
                f"{span.stop}-{total - 1} are the tuning split, never read by this run")
    holdout = holdout_range(total)
    return (f"the tuning split's records {span.start}-{span.stop - 1} (a screening run, "
            f"scored on the tuning holdout, records {holdout.start}-{holdout.stop - 1}, "
            "instead of the test set)")


def _rows(images: data.LabeledImages, span: range, what: str) -> data.LabeledImages:
    return dataclasses.replace(images, images=images.images[span.start:span.stop],
                               labels=images.labels[span.start:span.stop],
                               source=f"{images.source} ({what} {span.start}-{span.stop - 1})")


def load_training_records(dataset: str, data_dir: str | os.PathLike | None,
                          which: TrainingRecords | str, *, limit: int | None = None,
                          progress: bool = True) -> data.LabeledImages:
    """The ``which`` records of ``dataset``'s training split, the first ``limit`` of them
    if given.  ``ALL`` is exactly :func:`dclens.data.load_dataset`'s training split."""
    which = TrainingRecords.parse(which)
    if which is TrainingRecords.ALL:
        return data.load_dataset(dataset, data_dir, split="train", limit=limit,
                                 progress=progress)
    full = data.load_dataset(dataset, data_dir, split="train", progress=progress)
    span = record_range(len(full), which)
    if limit is not None:
        span = span[:limit]
    return _rows(full, span, f"{which.value} records")


def load_span(dataset: str, data_dir: str | os.PathLike | None,
              span: "Callable[[int], range]", what: str, *,
              limit: int | None = None) -> data.LabeledImages:
    """The records ``span(total)`` of ``dataset``'s training split (``total`` its size),
    the first ``limit`` of them if given; ``what`` names them in the source."""
    full = data.load_dataset(dataset, data_dir, split="train", progress=False)
    rows = span(len(full))
    if limit is not None:
        rows = rows[:limit]
    return _rows(full, rows, what)


def load_tuning_holdout(dataset: str, data_dir: str | os.PathLike | None, *,
                        limit: int | None = None) -> data.LabeledImages:
    """The tuning holdout of ``dataset``'s training split (a screening run's test set),
    the first ``limit`` of it if given."""
    return load_span(dataset, data_dir, holdout_range, "tuning holdout", limit=limit)
