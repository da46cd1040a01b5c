"""The downstream classifier of the DataLens evaluation and its training schedules.

The DataLens authors judge synthetic data by training one small CNN on it and testing it
on the real test split (paper Table 1). Their evaluation scripts (``evaluation/
train-classifier-{mnist,fmnist,celebA,hair}.py`` in their repository) all use the same
layer stack, only the input size and the number of classes differ:

    Conv 32 k3 relu -> MaxPool 2 -> Dropout .2 -> Conv 64 k3 relu -> Dropout .25
    -> Flatten -> Dense 64 relu -> Dense classes softmax

trained with plain SGD (no momentum) on categorical cross-entropy:

* MNIST / Fashion-MNIST: lr 2e-3, batch 512, 600 epochs;
* CelebA-Gender / CelebA-Hair (64x64x3): lr 1e-4, batch 256, 250 epochs.

:func:`official_schedule` returns those; :data:`DEFAULT_SCHEDULE` (Adam, tens of epochs)
is what fits on a 2-core CPU. :func:`fit_with_curves` trains a model and measures it on
named monitor sets after every epoch; which epoch to *report* is decided elsewhere
(:mod:`dclens.evaluation.evaluate`) from those curves.

Randomness is explicit: initialisers, dropout and the per-epoch shuffles take seeds derived
from one integer, and no global RNG (``keras.utils.set_random_seed``) is touched.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Mapping

import numpy as np

OPTIMIZERS = ("adam", "sgd")
FEATURE_LAYER = "features"   # the Dense 64 layer: penultimate features (FID)


class ScheduleError(ValueError):
    """A classifier schedule has a value training cannot use."""


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How a classifier is trained.

    Attributes:
      optimizer: ``adam`` or ``sgd`` (plain SGD without momentum, as the authors').
      learning_rate: step size.
      batch_size: examples per gradient step.
      epochs: passes over the training data; accuracy is measured after each one.
    """

    optimizer: str = "adam"
    learning_rate: float = 1e-3
    batch_size: int = 256
    epochs: int = 20

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ScheduleError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                                f"{self.optimizer!r}")
        lr = self.learning_rate
        if (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr)
                or lr <= 0):
            raise ScheduleError(f"learning_rate must be a finite number > 0, got {lr!r}")
        for name in ("batch_size", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScheduleError(f"{name} must be an integer >= 1, got {value!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


#: Sized for a 2-core CPU: 20 epochs of Adam over 100k samples take about five minutes.
DEFAULT_SCHEDULE = Schedule()


def official_schedule(dataset: str) -> Schedule:
    """The authors' schedule for ``dataset`` (see the module docstring)."""
    if dataset.startswith("celebA"):
        return Schedule(optimizer="sgd", learning_rate=1e-4, batch_size=256, epochs=250)
    if dataset in ("mnist", "fashion_mnist"):
        return Schedule(optimizer="sgd", learning_rate=2e-3, batch_size=512, epochs=600)
    raise ScheduleError(f"no official (authors') classifier schedule for dataset "
                        f"{dataset!r}; known: mnist, fashion_mnist, celebA-*")


def build_classifier(image_shape: tuple[int, int, int], num_classes: int, *, seed: int,
                     name: str = "authors_classifier"):
    """The authors' CNN (module docstring) for ``image_shape``, uncompiled.

    Every initialiser and dropout layer gets its own seed derived from ``seed``, so two
    calls with the same seed build identical models. The Dense 64 layer is named
    :data:`FEATURE_LAYER`.
    """
    import keras

    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    sub = np.random.SeedSequence(int(seed)).generate_state(6, np.uint32) >> 1
    glorot = [keras.initializers.GlorotUniform(seed=int(s)) for s in sub[:4]]
    layers = keras.layers
    return keras.Sequential([
        keras.Input(shape=tuple(image_shape)),
        layers.Conv2D(32, 3, activation="relu", kernel_initializer=glorot[0], name="conv1"),
        layers.MaxPooling2D(2, name="pool"),
        layers.Dropout(0.2, seed=int(sub[4]), name="dropout1"),
        layers.Conv2D(64, 3, activation="relu", kernel_initializer=glorot[1], name="conv2"),
        layers.Dropout(0.25, seed=int(sub[5]), name="dropout2"),
        layers.Flatten(name="flatten"),
        layers.Dense(64, activation="relu", kernel_initializer=glorot[2], name=FEATURE_LAYER),
        layers.Dense(num_classes, activation="softmax", kernel_initializer=glorot[3],
                     name="output"),
    ], name=name)


def compile_for(model, schedule: Schedule) -> None:
    """Compiles ``model`` with the schedule's optimizer and cross-entropy on int labels."""
    import keras

    optimizer = (keras.optimizers.Adam(schedule.learning_rate) if schedule.optimizer == "adam"
                 else keras.optimizers.SGD(schedule.learning_rate))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])


def predict_probabilities(model, images: np.ndarray, batch_size: int = 1000) -> np.ndarray:
    """Softmax outputs [N, classes] (float64) of a classifier, in inference mode."""
    return run_in_batches(model, images, batch_size)


def run_in_batches(model, images: np.ndarray, batch_size: int = 1000) -> np.ndarray:
    """``model(images, training=False)`` in eager chunks, as float64 numpy.

    Eager calls avoid Keras' ``predict`` retracing a function for every new input size.
    """
    outputs = [np.asarray(model(images[start:start + batch_size], training=False), np.float64)
               for start in range(0, len(images), batch_size)]
    if not outputs:
        return np.zeros((0, *model.output_shape[1:]))
    return np.concatenate(outputs)


def accuracy(model, images: np.ndarray, labels: np.ndarray, batch_size: int = 1000) -> float:
    """Fraction of ``images`` whose arg-max prediction equals ``labels``."""
    if len(labels) == 0:
        return float("nan")
    predicted = predict_probabilities(model, images, batch_size).argmax(axis=1)
    return float(np.mean(predicted == labels))


def _heartbeat(log: Callable[[str], None], epoch: int, epochs: int, every: float = 15.0):
    """A Keras callback that logs progress inside an epoch at most every ``every`` seconds
    (batches done, time left in the epoch), so a long epoch never looks like a hang."""
    import keras  # pylint: disable=import-outside-toplevel

    class Heartbeat(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.started = self.last = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if now - self.last < every:
                return
            self.last = now
            total = self.params.get("steps") or 0
            done = batch + 1
            left = (now - self.started) / done * (total - done) if total else float("nan")
            log(f"  epoch {epoch}/{epochs}: batch {done}/{total}, ~{left:.0f} s left in "
                "this epoch")

    return Heartbeat()


def fit_with_curves(model, images: np.ndarray, labels: np.ndarray, *, schedule: Schedule,
                    seed: int, monitors: Mapping[str, tuple[np.ndarray, np.ndarray]],
                    log: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Trains a compiled ``model`` and measures it on every monitor set after each epoch.

    Args:
      model: a compiled Keras classifier (:func:`build_classifier` + :func:`compile_for`).
      images, labels: the training set (float32 NHWC, int labels).
      schedule: batch size and epochs (the optimizer is the compiled one).
      seed: seed of the per-epoch shuffles (numpy, independent of any global RNG).
      monitors: name -> (images, labels) measured after every epoch, e.g. ``{"val": ...,
        "test": ...}``. They are only measured, never trained on.
      log: called with one line per epoch (None = silent).

    Returns:
      ``{"epoch": [1..E], "loss": [...], "train_accuracy": [...], "seconds": [...],
      "<name>_accuracy": [...] for each monitor}``; train_accuracy is Keras' running
      accuracy over the epoch (with dropout active).
    """
    if len(labels) == 0:
        raise ValueError("cannot train a classifier on 0 examples")
    rng = np.random.default_rng(seed)
    curves: dict[str, list[float]] = {"epoch": [], "loss": [], "train_accuracy": [],
                                      "seconds": []}
    for name in monitors:
        curves[f"{name}_accuracy"] = []
    for epoch in range(1, schedule.epochs + 1):
        started = time.perf_counter()
        order = rng.permutation(len(labels))
        callbacks = [] if log is None else [_heartbeat(log, epoch, schedule.epochs)]
        history = model.fit(images[order], labels[order], batch_size=schedule.batch_size,
                            epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        curves["epoch"].append(epoch)
        curves["loss"].append(float(history.history["loss"][-1]))
        curves["train_accuracy"].append(float(history.history["accuracy"][-1]))
        for name, (x, y) in monitors.items():
            curves[f"{name}_accuracy"].append(accuracy(model, x, y))
        curves["seconds"].append(time.perf_counter() - started)
        if log is not None:
            measured = " ".join(f"{name} {curves[f'{name}_accuracy'][-1]:.4f}"
                                for name in monitors)
            log(f"epoch {epoch}/{schedule.epochs}: loss {curves['loss'][-1]:.4f} "
                f"train {curves['train_accuracy'][-1]:.4f} {measured} "
                f"({curves['seconds'][-1]:.1f} s)")
    return curves
