"""DPImageBench's downstream-accuracy protocol, to place dclens in the field's table.

DPImageBench (Gong et al., CCS 2025; code 2019ChenGong/DPImageBench at 565f8d7, facts in
docs/evaluation.md) scores a synthesizer of 28x28 images with ``eval.mode=val``:

1. The real training split is cut into 55,000 records the synthesizer trains on and
   5,000 *validation* records it never sees.
2. It generates 60,000 samples; a fixed shuffle (numpy ``default_rng(0)``) of them puts the
   first 55,000 in the classifier's training set.
3. Each classifier (ResNet-110, WRN-40-4, ResNeXt-29) trains 50 epochs: Adam lr 0.01,
   divided by 5 every 20 epochs, batch 256, inputs scaled to [-1, 1], an exponential
   moving average of the weights (decay min(0.9999, (1 + n) / (10 + n)) after update n).
4. After every epoch the averaged weights are measured on the validation records and the
   real test set; a classifier's accuracy is its test accuracy at the epoch of best
   validation accuracy (ties: the later epoch).  The reported number is the mean over the
   classifiers.  (dclens also measures each classifier on some of its own training
   samples, a diagnostic that selects nothing: ``train_accuracy``.)

Here, with dclens' data-independent splits (:mod:`dclens.data.splits`), the validation
records are the **last** :data:`VALIDATION_RECORDS` of the training split (records
55,000-59,999 of Fashion-MNIST, part of the tuning split): a run trained on the private
records (``--training_records private``, records 0-49,999) never read them, as
DPImageBench's synthesizers never read theirs.  A run trained on any of them is refused:
its validation accuracy would be measured on its own training data.  Differences, stated
in every record: the synthesizer trained on 50,000 records, not 55,000; the validation
records are an index range, not ``torch.random_split``'s; Keras' Adam adds its epsilon to
the uncorrected second moment and Keras' batch normalisation keeps the biased batch
variance in its moving average (torch the unbiased); initial weights and shuffles come
from dclens' seeds.

The selection reads the validation records without noise (as DPImageBench's reported
numbers do; its code also computes a Laplace-noised selection that it logs but does not
report), so the reported accuracy is not itself differentially private with respect to
the 5,000 validation records -- they are outside the synthesizer's guarantee, which is
the benchmark's design.

All three classifiers are built (:mod:`dclens.evaluation.dpimagebench_networks`); the
protocol runs the ResNet alone unless told otherwise (``classifiers``), because on a small
CPU all three are far out of reach (a 28x28 image's forward pass is 0.39 GFLOP through
ResNet-110, 2.0 through WRN-40-4, 8.2 through ResNeXt-29; 55,000 x 50 of them);
``--dpimagebench_depth 20`` is the stated subset that fits, and every record names the
classifiers that ran.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import numpy as np

from dclens import data
from dclens.data import splits
from dclens.evaluation import dpimagebench_networks as networks
from dclens.evaluation import epoch_state
from dclens.evaluation.synthetic_input import EvaluationError, train_split_name

#: The last records of the training split, held out as the validation set.
VALIDATION_RECORDS = 5_000
#: DPImageBench's classifiers; its reported accuracy is the mean over all three.
CLASSIFIERS = ("resnet", "wrn", "resnext")
#: Each classifier's architecture fields of :class:`DPImageBenchProtocol` (a record and a
#: cache key carry only those of the classifiers that run).
ARCHITECTURE_FIELDS = {"resnet": ("resnet_depth",),
                       "wrn": ("wrn_depth", "wrn_widen", "wrn_dropout"),
                       "resnext": ("resnext_depth", "resnext_cardinality", "resnext_widen")}
ADAM_EPSILON = 1e-8        # torch's default
#: How many of its own training samples each classifier is also measured on after every
#: epoch (the ``train_accuracy`` curve: did it learn its samples, beside do they transfer).
OWN_SAMPLES_MEASURED = 5_000


def validation_range(total: int) -> range:
    """The validation records' indices in a training split of ``total`` records."""
    if total <= VALIDATION_RECORDS:
        raise EvaluationError(f"the training split has {total} records; DPImageBench's "
                              f"protocol holds out the last {VALIDATION_RECORDS}")
    return range(total - VALIDATION_RECORDS, total)


def check_unseen(generator_records: splits.TrainingRecords | str, total: int) -> None:
    """Refuses a synthesizer that trained on any validation record."""
    trained = splits.record_range(total, generator_records)
    held = validation_range(total)
    overlap = range(max(trained.start, held.start), min(trained.stop, held.stop))
    if len(overlap):
        raise EvaluationError(
            f"DPImageBench's protocol selects the classifier on the training records "
            f"{held.start}-{held.stop - 1}, but these samples come from a run trained on "
            f"{splits.TrainingRecords.parse(generator_records).value!r} records, "
            f"{overlap.start}-{overlap.stop - 1} among them: the selection would see the "
            f"synthesizer's own training data. Evaluate a run trained with "
            f"--training_records private")


@dataclasses.dataclass(frozen=True)
class DPImageBenchProtocol:
    """DPImageBench's settings (defaults: theirs for 28x28 images) and what the synthesizer
    trained on (``generator_records``: must not include the validation records)."""

    generator_records: splits.TrainingRecords = splits.TrainingRecords.PRIVATE
    classifiers: tuple[str, ...] = ("resnet",)
    resnet_depth: int = 110
    wrn_depth: int = 40
    wrn_widen: int = 4
    wrn_dropout: float = 0.3
    resnext_depth: int = 29
    resnext_cardinality: int = 8
    resnext_widen: int = 4
    generated_samples: int = 60_000
    train_samples: int = 55_000
    epochs: int = 50
    batch_size: int = 256
    learning_rate: float = 0.01
    lr_step_epochs: int = 20
    lr_gamma: float = 0.2
    ema_decay: float = 0.9999

    def __post_init__(self) -> None:
        object.__setattr__(self, "generator_records",
                           splits.TrainingRecords.parse(self.generator_records))
        object.__setattr__(self, "classifiers", tuple(self.classifiers))
        for name in ("generated_samples", "train_samples", "epochs", "batch_size",
                     "lr_step_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EvaluationError(f"{name} must be an integer >= 1, got {value!r}")
        networks.check_resnet_depth(self.resnet_depth)
        networks.check_wrn(self.wrn_depth, self.wrn_widen, self.wrn_dropout)
        networks.check_resnext(self.resnext_depth, self.resnext_cardinality,
                               self.resnext_widen)
        if self.train_samples > self.generated_samples:
            raise EvaluationError(f"train_samples ({self.train_samples}) exceeds "
                                  f"generated_samples ({self.generated_samples})")
        unknown = [c for c in self.classifiers if c not in CLASSIFIERS]
        if not self.classifiers or unknown or len(set(self.classifiers)) != len(
                self.classifiers):
            raise EvaluationError(f"classifiers must be distinct names among "
                                  f"{list(CLASSIFIERS)}, got {list(self.classifiers)}")
        for name in ("learning_rate", "lr_gamma"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise EvaluationError(f"{name} must be > 0, got {value!r}")
        if not 0 <= self.ema_decay < 1:
            raise EvaluationError(f"ema_decay must be in [0, 1), got {self.ema_decay!r}")

    @property
    def follows_dpimagebench(self) -> bool:
        """Their split, schedule and selection (everything but which classifiers run and
        their architectures, which every record names)."""
        theirs = DPImageBenchProtocol()
        return dataclasses.replace(self, classifiers=("resnet",),
                                   generator_records=splits.TrainingRecords.PRIVATE,
                                   **theirs.architectures) == theirs

    @property
    def runs_all_dpimagebench_classifiers(self) -> bool:
        """All three of DPImageBench's classifiers, each at its architecture."""
        return (set(self.classifiers) == set(CLASSIFIERS)
                and self.architectures == DPImageBenchProtocol().architectures)

    @property
    def architectures(self) -> dict:
        """Every classifier's architecture fields (:data:`ARCHITECTURE_FIELDS`) by name."""
        return {name: getattr(self, name)
                for fields in ARCHITECTURE_FIELDS.values() for name in fields}

    def learning_rate_at(self, epoch: int) -> float:
        """The step schedule's rate in (0-based) ``epoch``."""
        return self.learning_rate * self.lr_gamma ** (epoch // self.lr_step_epochs)

    def to_dict(self) -> dict:
        """The settings, with the architecture fields of the classifiers that run only
        (so a ResNet-only record keeps the key it had before the others were built)."""
        values = dataclasses.asdict(self)
        values["generator_records"] = self.generator_records.value
        values["classifiers"] = list(self.classifiers)
        for classifier, fields in ARCHITECTURE_FIELDS.items():
            if classifier not in self.classifiers:
                for name in fields:
                    del values[name]
        return values

    def classifier_settings(self, classifier: str) -> dict:
        """What one classifier's training depends on: the shared settings and its own
        architecture (a ResNet's are the ResNet-only protocol's :meth:`to_dict`), so its
        resume state serves any list of classifiers that includes it."""
        return dataclasses.replace(self, classifiers=(classifier,)).to_dict()


def classifier_name(protocol: DPImageBenchProtocol, classifier: str) -> str:
    """The classifier with its whole architecture, as records and state files name it
    (a setting other than DPImageBench's that the usual name does not carry is added:
    ``-drop0.1``, ``-widen2``; so is a learning rate other than theirs, ``-lr0.001``, so
    a run at another rate keeps its own state file beside theirs)."""
    theirs = DPImageBenchProtocol()
    if classifier == "resnet":
        name = f"resnet{protocol.resnet_depth}"
    elif classifier == "wrn":
        name = f"wrn{protocol.wrn_depth}-{protocol.wrn_widen}"
        if protocol.wrn_dropout != theirs.wrn_dropout:
            name += f"-drop{protocol.wrn_dropout:g}"
    else:
        name = (f"resnext{protocol.resnext_depth}-{protocol.resnext_cardinality}x"
                f"{networks.RESNEXT_GROUP_WIDTH}d")
        if protocol.resnext_widen != theirs.resnext_widen:
            name += f"-widen{protocol.resnext_widen}"
    if protocol.learning_rate != theirs.learning_rate:
        name += f"-lr{protocol.learning_rate:g}"
    return name


def classifier_seeds(classifier: str, seed: int) -> np.ndarray:
    """Two independent keys (initial weights, minibatch order) for ``classifier`` from the
    evaluation's ``seed``: each classifier its own (DPImageBench's networks see different
    shuffles too); the ResNet's are the ones it had when it was the only classifier."""
    entropy = seed if classifier == "resnet" else [seed, CLASSIFIERS.index(classifier)]
    return np.random.SeedSequence(entropy).generate_state(2, np.uint32) >> 1


def build_classifier(classifier: str, protocol: DPImageBenchProtocol,
                     image_shape: tuple[int, int, int], num_classes: int, *, seed: int):
    """``classifier``'s network with the protocol's architecture (a Keras model, images in
    [-1, 1] to logits)."""
    if classifier == "resnet":
        return networks.build_resnet(image_shape, num_classes, depth=protocol.resnet_depth,
                                     seed=seed)
    if classifier == "wrn":
        return networks.build_wide_resnet(image_shape, num_classes,
                                          depth=protocol.wrn_depth,
                                          widen=protocol.wrn_widen,
                                          dropout=protocol.wrn_dropout, seed=seed)
    if classifier == "resnext":
        return networks.build_resnext(image_shape, num_classes,
                                      depth=protocol.resnext_depth,
                                      cardinality=protocol.resnext_cardinality,
                                      widen=protocol.resnext_widen, seed=seed)
    raise EvaluationError(f"unknown classifier {classifier!r}; DPImageBench's are "
                          f"{list(CLASSIFIERS)}")


def ema_decay_at(decay: float, update: int) -> float:
    """DPImageBench's (and TF's ``num_updates``) warm-up: min(decay, (1+n)/(10+n))."""
    return min(decay, (1 + update) / (10 + update))


# --------------------------------------------------------------------------- training

class _Trainer:
    """One classifier, Adam on the mean cross-entropy, and the weights' moving average."""

    def __init__(self, model, protocol: DPImageBenchProtocol):
        import keras
        import tensorflow as tf

        self.tf, self.model, self.protocol = tf, model, protocol
        self.trainable = model.trainable_variables
        self.optimizer = keras.optimizers.Adam(protocol.learning_rate, epsilon=ADAM_EPSILON)
        self.optimizer.build(self.trainable)
        self.average = [tf.Variable(v, trainable=False) for v in self.trainable]
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._step = tf.function(self._step_impl, reduce_retracing=True)
        self._predict = tf.function(lambda x: model(x, training=False),
                                    reduce_retracing=True)

    @property
    def state(self) -> list:
        """Every variable a resumed run needs, in a fixed order."""
        return [*self.model.variables, *self.average, *self.optimizer.variables, self.updates]

    def _step_impl(self, x, y):
        tf = self.tf
        with tf.GradientTape() as tape:
            logits = self.model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable),
                                           self.trainable))
        self.updates.assign_add(1)
        n = tf.cast(self.updates, tf.float32)
        decay = tf.minimum(self.protocol.ema_decay, (1.0 + n) / (10.0 + n))
        for average, variable in zip(self.average, self.trainable):
            average.assign_sub((1.0 - decay) * (average - variable))
        return loss

    def train_epoch(self, images: np.ndarray, labels: np.ndarray, epoch: int,
                    rng: np.random.Generator) -> float:
        self.optimizer.learning_rate = self.protocol.learning_rate_at(epoch)
        order = rng.permutation(len(images))
        losses = []
        for start in range(0, len(order), self.protocol.batch_size):
            rows = order[start:start + self.protocol.batch_size]
            losses.append(float(self._step(self.tf.constant(images[rows]),
                                           self.tf.constant(labels[rows]))))
        return float(np.mean(losses))

    def averaged_accuracy(self, sets: list[tuple[np.ndarray, np.ndarray]]) -> list[float]:
        """Accuracies of the *averaged* weights (inference mode) on each (images, labels)."""
        current = [v.numpy() for v in self.trainable]
        for variable, average in zip(self.trainable, self.average):
            variable.assign(average)
        try:
            return [epoch_state.accuracy(self._predict, images, labels)
                    for images, labels in sets]
        finally:
            for variable, value in zip(self.trainable, current):
                variable.assign(value)


def scaled(images: np.ndarray) -> np.ndarray:
    """[0, 1] pixels as DPImageBench feeds them: x * 2 - 1, float32."""
    return (np.asarray(images, np.float32) * 2.0 - 1.0).astype(np.float32)


def check_images(spec: data.DatasetSpec) -> None:
    """The protocol here is DPImageBench's for 28x28 grey images (MNIST, Fashion-MNIST)."""
    if tuple(spec.image_shape) != (28, 28, 1):
        raise EvaluationError(f"DPImageBench's protocol is implemented for 28x28x1 images "
                              f"(mnist, fashion_mnist); {spec.name} images are "
                              f"{tuple(spec.image_shape)}")


def classifier_training_rows(count: int, protocol: DPImageBenchProtocol) -> np.ndarray:
    """Indices of the synthetic samples a classifier trains on: the first
    ``train_samples`` of numpy ``default_rng(0)``'s permutation of the first
    ``generated_samples`` (DPImageBench's fixed shuffle)."""
    if count < protocol.generated_samples:
        raise EvaluationError(
            f"DPImageBench's protocol reads {protocol.generated_samples} samples; got "
            f"{count}. Write at least that many (e.g. --num_samples "
            f"{protocol.generated_samples})")
    order = np.random.default_rng(seed=0).permutation(protocol.generated_samples)
    return order[:protocol.train_samples]


def train_classifier(classifier: str, synthetic: data.LabeledImages,
                     validation: data.LabeledImages, test: data.LabeledImages,
                     protocol: DPImageBenchProtocol, *, seed: int, state_path=None,
                     log: Callable[[str], None] | None = None) -> dict:
    """One classifier of the protocol: its curves and its selected accuracy.

    After every epoch the averaged weights are measured on the validation records, the
    test set and (``train_accuracy``, a diagnostic DPImageBench's log has too) the first
    :data:`OWN_SAMPLES_MEASURED` of the samples the classifier trains on: a classifier
    that learned its samples but scores chance on real records shows that they do not
    transfer.  Measuring reads no rng and changes no weight, so the trajectory is the
    protocol's.  ``state_path``: an npz saved after every epoch and resumed from (the
    same trajectory).
    """
    check_images(synthetic.spec)
    rows = classifier_training_rows(len(synthetic), protocol)
    images, labels = scaled(synthetic.images[rows]), synthetic.labels[rows].astype(np.int64)
    monitored = [(scaled(validation.images), validation.labels),
                 (scaled(test.images), test.labels),
                 (images[:OWN_SAMPLES_MEASURED], labels[:OWN_SAMPLES_MEASURED])]
    init_seed, shuffle_seed = (int(s) for s in classifier_seeds(classifier, seed))
    model = build_classifier(classifier, protocol, synthetic.spec.image_shape,
                             synthetic.spec.num_classes, seed=init_seed)
    trainer = _Trainer(model, protocol)
    rng = np.random.default_rng(shuffle_seed)
    name = classifier_name(protocol, classifier)
    if log is not None:
        flop = networks.forward_gflop(model)
        work = flop * protocol.epochs * (3 * len(images) + sum(
            len(measured) for measured, _ in monitored)) / 1e3
        log(f"dpimagebench {name}: {flop * 1e3:.0f} MFLOP per image forward, about "
            f"{work:,.0f} TFLOP for {protocol.epochs} epochs (training counted as 3 "
            "forward passes): at 50 GFLOP/s, a 2-core CPU's, about "
            f"{work * 1e3 / 50 / 3600:.1f} h; resumable after every epoch")
    state = epoch_state.EpochState(state_path, {
        "settings": protocol.classifier_settings(classifier), "classifier": name,
        "seed": seed,
        "samples": epoch_state.samples_fingerprint(images, labels),
        "validation": epoch_state.samples_fingerprint(validation.images, validation.labels),
        "test": epoch_state.samples_fingerprint(test.images, test.labels)},
        "a DPImageBench-protocol run")
    curves = {"epoch": [], "val_accuracy": [], "test_accuracy": [], "train_accuracy": [],
              "loss": [], "seconds": []}
    meta = state.resume(trainer.state, rng)
    if meta is not None:
        curves = meta["curves"]
        # A state saved before the train_accuracy curve existed: those epochs unmeasured.
        curves.setdefault("train_accuracy", [None] * len(curves["epoch"]))
        if log is not None:
            log(f"dpimagebench {name}: resumed after epoch {meta['epoch']}")
    for epoch in range(len(curves["epoch"]), protocol.epochs):
        started = time.perf_counter()
        loss = trainer.train_epoch(images, labels, epoch, rng)
        val_accuracy, test_accuracy, train_accuracy = trainer.averaged_accuracy(monitored)
        for key, value in (("epoch", epoch + 1), ("val_accuracy", val_accuracy),
                           ("test_accuracy", test_accuracy),
                           ("train_accuracy", train_accuracy), ("loss", loss),
                           ("seconds", time.perf_counter() - started)):
            curves[key].append(value)
        state.save(epoch + 1, rng, curves, [v.numpy() for v in trainer.state])
        if log is not None:
            log(f"dpimagebench {name} epoch {epoch + 1}/{protocol.epochs}: val "
                f"{val_accuracy:.4f} test {test_accuracy:.4f} own samples "
                f"{train_accuracy:.4f} loss {loss:.4f} ({curves['seconds'][-1]:.0f} s)")
    chosen = select_latest_best(curves["val_accuracy"])
    return {"classifier": name, "accuracy": curves["test_accuracy"][chosen],
            "epoch": chosen + 1, "val_accuracy": curves["val_accuracy"][chosen],
            "best_test_accuracy": max(curves["test_accuracy"]), "seed": seed,
            "curves": curves, "seconds": float(sum(curves["seconds"]))}


def select_latest_best(val_accuracy) -> int:
    """DPImageBench's choice: the epoch of best validation accuracy, the *latest* of ties
    (their ``>=``).  Reads only the validation curve."""
    curve = np.asarray(list(val_accuracy), np.float64)
    if curve.size == 0 or not np.all(np.isfinite(curve)):
        raise EvaluationError(f"no usable validation curve to select from: {curve.tolist()}")
    return int(curve.size - 1 - np.argmax(curve[::-1]))


def run_dpimagebench(synthetic: data.LabeledImages, test: data.LabeledImages,
                     protocol: DPImageBenchProtocol, *, data_dir=None, seed: int,
                     validation: data.LabeledImages | None = None, state_prefix=None,
                     log: Callable[[str], None] = print) -> dict:
    """The protocol's record: each classifier's entry and their mean accuracy.

    ``validation``: the held-out real records (default: the last
    :data:`VALIDATION_RECORDS` of the training split in ``data_dir``, after checking that
    ``protocol.generator_records`` excludes them).  ``state_prefix``: each classifier
    saves its resume state to ``<state_prefix>-<classifier>.npz``.
    """
    if validation is None:
        validation = load_validation(train_split_name(synthetic.spec.name), data_dir,
                                     protocol)
    entries = {}
    for classifier in protocol.classifiers:
        name = classifier_name(protocol, classifier)
        log(f"dpimagebench {name}: {protocol.train_samples} of {protocol.generated_samples} "
            f"samples, {protocol.epochs} epochs of Adam, selected on {len(validation)} "
            f"held-out real records")
        path = None if state_prefix is None else f"{state_prefix}-{name}.npz"
        entries[name] = train_classifier(classifier, synthetic, validation, test, protocol,
                                         seed=seed, state_path=path, log=log)
    accuracy = float(np.mean([e["accuracy"] for e in entries.values()]))
    names = ", ".join(entries)
    log(f"dpimagebench protocol ({names}): {accuracy:.4f}")
    return {"accuracy": accuracy, "classifiers": entries, "settings": protocol.to_dict(),
            "follows_dpimagebench": protocol.follows_dpimagebench,
            "all_dpimagebench_classifiers": protocol.runs_all_dpimagebench_classifiers,
            "validation": validation.source,
            "description": (f"DPImageBench's eval.mode=val with {names} (theirs: the mean "
                            "of resnet110, wrn40-4, resnext29-8x64d): test accuracy at the "
                            f"epoch of best accuracy on {len(validation)} real training "
                            "records the synthesizer did not train on "
                            f"({protocol.generator_records.value} records)")}


def load_validation(dataset: str, data_dir, protocol: DPImageBenchProtocol
                    ) -> data.LabeledImages:
    """The validation records of ``dataset``'s training split, after :func:`check_unseen`."""
    def span(total: int) -> range:
        check_unseen(protocol.generator_records, total)
        return validation_range(total)
    return splits.load_span(dataset, data_dir, span, "DPImageBench validation records")
