"""How much class evidence the teachers carry: each teacher's logits read as a classifier.

A teacher D_i(x, y) scores an image *with* a label.  Scoring the same image under every
label and taking the arg-max makes it a classifier; its accuracy on real held-out records
says whether the teacher's output depends on the label the right way.  For a batch of B
records with labels y_b, shift c scores the batch with labels (y_b + c) mod K (the batch's
label histogram moved round the classes, so every shift's batch-norm statistics -- the
teachers always normalise by the batch -- see as many labels); the prediction is the shift
with the largest logit, right when it is 0.  Reported (``ClassSignal``):

* ``teacher_accuracy``: per teacher, the share of records whose arg-max is their label
  (chance 1/K);
* ``ensemble_accuracy``: the same for the teachers' summed logits (no privacy mechanism:
  what the ensemble knows before TopAgg compresses each teacher's gradient to signs);
* ``pairwise``: how often D_i(x, y) > D_i(x, y + c), over teachers, records and c != 0.

This diagnoses issue 39's lever 5 (why do most samples miss their class?).  It reads the
teachers' weights, which no mechanism releases: it is only for screening runs, whose
records (the tuning split) carry no guarantee, and it scores the tuning holdout.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import numpy as np
import tensorflow as tf

from dclens.common import export
from dclens.data import splits
from dclens.datalens import build, networks
from dclens.datalens.config import DataLensConfig, TrainingRecords
from dclens.runs.checkpoint import CheckpointStore


class ClassSignalError(ValueError):
    """A run this diagnostic cannot (or must not) read."""


@dataclasses.dataclass(frozen=True)
class ClassSignal:
    """The teachers read as classifiers (module docstring)."""

    teacher_accuracy: np.ndarray      # [T]
    ensemble_accuracy: float
    pairwise: float
    records: int
    num_classes: int

    def to_dict(self) -> dict:
        accuracy = self.teacher_accuracy
        return {"teachers": int(accuracy.size), "records": self.records,
                "chance": 1.0 / self.num_classes,
                "teacher_accuracy_mean": float(accuracy.mean()),
                "teacher_accuracy_sd": float(accuracy.std()),
                "teacher_accuracy_max": float(accuracy.max()),
                "ensemble_accuracy": self.ensemble_accuracy, "pairwise": self.pairwise}


def shifted_logits(ensemble, weights: np.ndarray, images: np.ndarray, labels: np.ndarray,
                   *, batch_size: int, teacher_chunk: int = 25) -> np.ndarray:
    """Logits [T, N, K]: entry [i, n, c] is D_i(x_n, (y_n + c) mod K), each batch of
    ``batch_size`` records scored together (the last partial batch is dropped: N is the
    largest multiple of ``batch_size`` <= len(images))."""
    k = int(ensemble.shape.num_classes)
    n = (len(images) // batch_size) * batch_size
    if n == 0:
        raise ClassSignalError(f"need at least batch_size={batch_size} records, got "
                               f"{len(images)}")

    @tf.function(reduce_retracing=True)
    def every_shift(w, x, y):
        t = tf.shape(w)[0]
        tiled = tf.broadcast_to(x[None], tf.concat([[t], tf.shape(x)], 0))
        out = []
        for c in range(k):
            one_hot = tf.one_hot((y + c) % k, k)
            out.append(ensemble.logits(w, tiled, tf.broadcast_to(
                one_hot[None], tf.stack([t, tf.shape(x)[0], k]))))
        return tf.stack(out, axis=-1)

    out = np.zeros((len(weights), n, k), np.float32)
    for first in range(0, len(weights), teacher_chunk):
        w = tf.constant(weights[first:first + teacher_chunk], tf.float32)
        for start in range(0, n, batch_size):
            rows = slice(start, start + batch_size)
            out[first:first + teacher_chunk, rows] = every_shift(
                w, tf.constant(images[rows], tf.float32),
                tf.constant(labels[rows], tf.int32)).numpy()
    return out


def class_signal(logits: np.ndarray) -> ClassSignal:
    """:class:`ClassSignal` of shifted logits [T, N, K] (:func:`shifted_logits`)."""
    right = logits.argmax(axis=-1) == 0                                 # [T, N]
    ensemble_right = logits.sum(axis=0).argmax(axis=-1) == 0            # [N]
    pairwise = logits[..., :1] > logits[..., 1:]
    return ClassSignal(teacher_accuracy=right.mean(axis=1),
                       ensemble_accuracy=float(ensemble_right.mean()),
                       pairwise=float(pairwise.mean()), records=int(logits.shape[1]),
                       num_classes=int(logits.shape[2]))


def run_class_signal(run_dir: str, *, records: int = 300,
                     log: Callable[[str], None] = print) -> dict:
    """The class signal of a screening run's teachers at its latest checkpoint, on the
    first ``records`` records of the tuning holdout; written to
    ``<run_dir>/teacher_classes.json`` (atomically) and returned."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as stream:
            saved = json.load(stream)
        config = DataLensConfig.from_dict(saved["config"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ClassSignalError(f"{path}: not a DataLens run's config ({error}); give the "
                               f"folder of a run of scripts/main.py or reproduce.py") from error
    if config.train.training_records is not TrainingRecords.TUNING:
        raise ClassSignalError(
            f"{run_dir} trained on training_records="
            f"{config.train.training_records.value!r}: its teachers' outputs are not "
            f"released by any mechanism, so this diagnostic reads only screening runs "
            f"(--training_records tuning)")
    checkpoint = CheckpointStore(os.path.join(run_dir, "checkpoints")).latest()
    if checkpoint is None:
        raise ClassSignalError(f"{run_dir} has no checkpoint (its teachers are saved only "
                               f"there): run it with --checkpoint_every N")
    weights = checkpoint.load_array("teachers_weights", mmap=True)
    holdout = splits.load_tuning_holdout(config.train.dataset, config.train.data_dir,
                                         limit=records)
    shape = networks.ImageShape(*holdout.images.shape[1:], holdout.spec.num_classes)
    ensemble = build.build_ensemble(config, shape, "fast")
    batch = min(config.train.batch_size, int(saved.get("partition_size") or
                                             config.train.batch_size))
    log(f"{len(weights)} teachers of {run_dir} (step {checkpoint.step}) scoring "
        f"{len(holdout)} tuning-holdout records under each of {shape.num_classes} labels, "
        f"batches of {batch}")
    signal = class_signal(shifted_logits(ensemble, np.asarray(weights),
                                         holdout.images.astype(np.float32),
                                         holdout.labels, batch_size=batch))
    record = {**signal.to_dict(), "step": checkpoint.step, "batch": batch,
              "class_guidance": config.train.class_guidance}
    export.write_json(os.path.join(run_dir, "teacher_classes.json"), record)
    return record
