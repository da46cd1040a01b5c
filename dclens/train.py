"""The DataLens training loop (paper Alg. 1) and the outputs of a run.

One *generator step* (the authors' inner iteration; with the paper configs one epoch):

1. z ~ U(-1, 1)^{B x z_dim}.  For the teachers' fake batches the generator renders
   G(z_j, c) for every class c once; teacher i's fake image j is G(z_j, y_ij) with y_ij
   the label of its j-th real record (the authors' choice), so no forward pass is
   repeated per teacher.
2. Every teacher takes ``d_step`` Adam steps (``pretrain_teacher`` in the first epoch) on
   its own real batch (B records of its partition) and that fake batch.
3. ``g_step`` times: fresh uniformly random labels y, x = G(z, y); before anything is
   computed from the teachers, the ledger checks that B more TopAgg queries stay within
   ``max_eps`` -- if not, training stops (the step is not taken).  The B queries are
   recorded in the ledger *before* the noisy aggregate is released.  Each teacher's image
   gradients are voted (TopAgg) chunk by chunk, noised once, thresholded to g_bar; the
   student takes one Adam step on sum((G(z, y) - stop_gradient(x + lr * g_bar))^2).

B = min(batch_size, partition size).  Every random draw comes from a :class:`SeedTree`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

from dclens import accounting, data, networks, teachers, topagg
from dclens.config import DataLensConfig
from dclens.rng import SeedTree, Stream


class BudgetExhausted(Exception):
    """Raised inside the loop when the next TopAgg round would exceed max_eps."""


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one generator step did (all floats are means over teachers / rounds)."""

    step: int
    epoch: int
    queries: int
    epsilon: float | None
    teacher_loss: float
    student_loss: float
    pass_fraction: float
    seconds: float


def contiguous_partition(num_records: int, num_partitions: int, *, seed: int) -> np.ndarray:
    """Disjoint partitions of a shuffled order (the authors' ``--noshuffle``), [N, m]."""
    m = num_records // num_partitions
    if m < 1:
        raise ValueError(f"more teachers ({num_partitions}) than records ({num_records}): "
                         f"each partition would be empty; use at most {num_records} teachers")
    order = np.random.default_rng(seed).permutation(num_records)
    return order[:num_partitions * m].reshape(num_partitions, m).astype(np.int64)


def image_shape_of(spec: data.DatasetSpec) -> networks.ImageShape:
    return networks.ImageShape(spec.height, spec.width, spec.channels, spec.num_classes)


class DataLens:
    """The state of a DataLens run: data partitions, teacher bank, student, ledger.

    Args:
      config: the run's hyper-parameters.
      dataset: the private training data.
      root_seed: the run's root seed (``config.train.seed`` or OS entropy).
      bank_dir: where the teacher bank is memory-mapped (None = RAM).
      on_spend: called as ``on_spend(step, round, queries)`` right after a round's queries
        are added to ``self.ledger`` and before its noise is drawn; it must make the spend
        durable (the run's write-ahead :class:`dclens.journal.PrivacyJournal`).  If it
        raises, nothing is released.
    """

    def __init__(self, config: DataLensConfig, dataset: data.LabeledImages, *,
                 root_seed: int, bank_dir: str | None = None,
                 on_spend: Callable[[int, int, int], None] | None = None):
        train_cfg = config.train
        self.config = config
        self.root_seed = root_seed
        self.on_spend = on_spend
        self.shape = image_shape_of(dataset.spec)
        if config.topagg.topk > self.shape.dim:
            raise ValueError(f"topk={config.topagg.topk} is larger than the image dimension "
                             f"{self.shape.dim} of {dataset.spec.name}; use topk <= "
                             f"{self.shape.dim}")
        self.images = dataset.images
        self.labels = dataset.labels
        self.seeds = SeedTree(root_seed)
        if train_cfg.balanced_partition:
            self.partitions = data.partition(dataset.labels, train_cfg.num_teachers,
                                             num_classes=self.shape.num_classes,
                                             seed=train_cfg.partition_seed)
        else:
            self.partitions = contiguous_partition(len(dataset.labels), train_cfg.num_teachers,
                                                   seed=train_cfg.partition_seed)
        self.partition_size = self.partitions.shape[1]
        self.batch = min(train_cfg.batch_size, self.partition_size)
        self.steps_per_epoch = self.partition_size // self.batch
        layout = teachers.ParamLayout.for_shape(self.shape)
        self.bank = teachers.TeacherBank.create(
            layout, train_cfg.num_teachers, seed=self.seeds.integer(Stream.TEACHER_INIT),
            directory=bank_dir)
        self.ensemble = teachers.TeacherEnsemble(self.shape, learning_rate=train_cfg.learning_rate,
                                                 beta1=train_cfg.beta1)
        self.generator = networks.build_generator(
            self.shape, train_cfg.z_dim, seed=self.seeds.integer(Stream.GENERATOR_INIT))
        self.student_optimizer = keras.optimizers.Adam(
            train_cfg.learning_rate, beta_1=train_cfg.beta1, epsilon=teachers.ADAM_EPSILON)
        self.topagg = topagg.TopAgg(config.topagg, num_teachers=train_cfg.num_teachers,
                                    allow_no_noise=train_cfg.non_private)
        self.ledger = accounting.PrivacyLedger(
            delta=config.budget.delta, conversion=config.budget.conversion,
            orders=(accounting.classic_orders(config.budget.max_order)
                    if config.budget.conversion is accounting.Conversion.CLASSIC else None))
        self.step = 0
        self.generate = generator_function(self.generator)

    # ------------------------------------------------------------------ helpers
    def one_hot(self, labels: tf.Tensor) -> tf.Tensor:
        return tf.one_hot(labels, self.shape.num_classes, dtype=tf.float32)

    def latent(self, step: int) -> tf.Tensor:
        return tf.random.stateless_uniform((self.batch, self.config.train.z_dim),
                                           seed=self.seeds.tf_seed(Stream.LATENT, step),
                                           minval=-1.0, maxval=1.0)

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch

    def within_budget(self) -> bool:
        """Whether one more TopAgg round of B queries keeps epsilon <= max_eps."""
        if self.config.train.non_private:
            return True
        after = self.ledger.epsilon_after(sigma=self.config.topagg.sigma,
                                          topk=self.config.topagg.topk, queries=self.batch)
        return after.epsilon <= self.config.budget.max_eps

    # ------------------------------------------------------------------ teachers
    def train_teachers(self, z: tf.Tensor) -> float:
        """Step 2: every teacher's discriminator steps; returns the mean teacher loss."""
        train_cfg = self.config.train
        num_steps = (train_cfg.pretrain_teacher
                     if self.epoch == 0 and train_cfg.pretrain_teacher > 0 else train_cfg.d_step)
        k = self.shape.num_classes
        classes = tf.repeat(tf.range(k), self.batch)
        fakes = self.generate(tf.tile(z, [k, 1]), self.one_hot(classes))
        fakes = tf.reshape(fakes, (k, self.batch, *fakes.shape[1:]))
        slot = self.step % self.steps_per_epoch
        columns = slice(slot * self.batch, (slot + 1) * self.batch)
        position = np.arange(self.batch)
        losses = []
        for start, stop in self.bank.chunks(train_cfg.teacher_chunk):
            records = self.partitions[start:stop, columns]
            real = tf.constant(self.images[records])
            real_labels = self.labels[records]
            fake = tf.gather_nd(fakes, tf.stack(
                [real_labels, np.broadcast_to(position, real_labels.shape)], axis=-1))
            labels = self.one_hot(real_labels)
            state, loss = self.ensemble.train(self.bank.read(start, stop), real, labels,
                                              fake, labels, num_steps=num_steps)
            self.bank.write(start, stop, state)
            losses.append(loss.numpy())
        return float(np.mean(np.concatenate(losses)))

    # ------------------------------------------------------------------ student
    def vote(self, images: tf.Tensor, labels: tf.Tensor, round_index: int) -> tf.Tensor:
        """Summed votes of all teachers for a fake batch (int32 [B, D])."""
        total = None
        for start, stop in self.bank.chunks(self.config.train.teacher_chunk):
            grads = self.ensemble.image_gradients(tf.constant(self.bank.weights[start:stop]),
                                                  images, labels)
            votes = self.topagg.vote_sum(grads, seed=self.seeds.tf_seed(
                Stream.STOCHASTIC_SIGN, self.step, round_index, start))
            total = votes if total is None else total + votes
        return total

    def student_round(self, z: tf.Tensor, round_index: int) -> tuple[float, float]:
        """Step 3, one round: query, spend, release, update.  Returns (loss, pass fraction)."""
        if not self.within_budget():
            raise BudgetExhausted()
        labels = tf.random.stateless_uniform(
            (self.batch,), seed=self.seeds.tf_seed(Stream.QUERY_LABELS, self.step, round_index),
            minval=0, maxval=self.shape.num_classes, dtype=tf.int32)
        one_hot = self.one_hot(labels)
        images = self.generate(z, one_hot)
        vote_sum = self.vote(images, one_hot, round_index)
        if not self.config.train.non_private:
            # Recorded (and journaled by on_spend) before the noise is drawn.
            self.ledger.spend(self.topagg.event(self.batch))
            if self.on_spend is not None:
                self.on_spend(self.step, round_index, self.batch)
        result = self.topagg.release(vote_sum, seed=self.seeds.tf_seed(
            Stream.DP_NOISE, self.step, round_index))
        target = tf.stop_gradient(
            images + self.config.train.learning_rate * tf.reshape(result.update, images.shape))
        with tf.GradientTape() as tape:
            current = self.generator([z, one_hot], training=True)
            loss = tf.reduce_sum(tf.square(current - target))
        weights = self.generator.trainable_weights
        self.student_optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))
        return float(loss), result.pass_fraction

    # ------------------------------------------------------------------ loop
    def train_step(self) -> StepRecord:
        """One generator step (teachers, then g_step student rounds)."""
        started = time.perf_counter()
        if not self.within_budget():
            raise BudgetExhausted()
        z = self.latent(self.step)
        teacher_loss = self.train_teachers(z)
        queries_before = self.ledger.queries
        student_losses, passes = [], []
        try:
            for round_index in range(self.config.train.g_step):
                loss, passed = self.student_round(z, round_index)
                student_losses.append(loss)
                passes.append(passed)
        finally:
            record = StepRecord(
                step=self.step, epoch=self.epoch,
                queries=self.ledger.queries - queries_before
                if not self.config.train.non_private else self.batch * len(passes),
                epsilon=None if self.config.train.non_private else self.ledger.epsilon().epsilon,
                teacher_loss=teacher_loss,
                student_loss=float(np.mean(student_losses)) if student_losses else math.nan,
                pass_fraction=float(np.mean(passes)) if passes else math.nan,
                seconds=time.perf_counter() - started)
            self.step += 1
        return record

    # ------------------------------------------------------------------ state
    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything a resume needs besides the step, seed and ledger, as named arrays.

        Teachers' weights, Adam moments and step counts; the generator's variables (incl.
        batch-norm statistics) and the student optimizer's variables (incl. its iteration
        counter), in their fixed creation order.
        """
        arrays = {"teachers_weights": self.bank.weights, "teachers_adam_m": self.bank.adam_m,
                  "teachers_adam_v": self.bank.adam_v, "teachers_steps": self.bank.steps}
        for i, variable in enumerate(self.generator.weights):
            arrays[f"generator_{i:03d}"] = variable.numpy()
        if self.student_optimizer.built:
            for i, variable in enumerate(self.student_optimizer.variables):
                arrays[f"optimizer_{i:03d}"] = variable.numpy()
        return arrays

    def load_state_arrays(self, load: Callable[[str], np.ndarray], names: list[str],
                          step: int) -> None:
        """Restores :meth:`state_arrays` (``load(name)`` reads one) and sets the step."""
        for name, target in (("teachers_weights", self.bank.weights),
                             ("teachers_adam_m", self.bank.adam_m),
                             ("teachers_adam_v", self.bank.adam_v),
                             ("teachers_steps", self.bank.steps)):
            array = load(name)
            if array.shape != target.shape:
                raise ValueError(f"checkpoint {name} has shape {array.shape}, this run needs "
                                 f"{target.shape}")
            target[...] = array
        self._assign("generator", self.generator.weights, load, names)
        optimizer_names = [n for n in names if n.startswith("optimizer_")]
        if optimizer_names:
            self.student_optimizer.build(self.generator.trainable_variables)
            self._assign("optimizer", self.student_optimizer.variables, load, names)
        self.step = step

    @staticmethod
    def _assign(prefix: str, variables, load: Callable[[str], np.ndarray],
                names: list[str]) -> None:
        saved = sorted(n for n in names if n.startswith(prefix + "_"))
        if len(saved) != len(variables):
            raise ValueError(f"checkpoint has {len(saved)} {prefix} variables, this run's "
                             f"{prefix} has {len(variables)}")
        for name, variable in zip(saved, variables):
            value = load(name)
            if tuple(value.shape) != tuple(variable.shape):
                raise ValueError(f"checkpoint {name} has shape {value.shape}, "
                                 f"{variable.path} needs {tuple(variable.shape)}")
            variable.assign(value)

    def sample(self, num_samples: int, *, seed_path: tuple[int, ...] = (),
               batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``num_samples`` images with uniformly random labels: (float32 [N,H,W,C], int64 [N]).

        The generator runs as in training (batch statistics over batches of B images with
        random labels), as the authors sample.
        """
        batch = batch or self.batch
        return sample_generator(self.generate, self.shape, self.config.train.z_dim,
                                num_samples, seeds=self.seeds, seed_path=seed_path,
                                batch=batch)


def generator_function(generator: keras.Model) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """G(z, one-hot y) as a tf.function, with batch statistics (as the authors run G)."""
    return tf.function(lambda z, y: generator([z, y], training=True), reduce_retracing=True)


def sample_generator(generate: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
                     shape: networks.ImageShape, z_dim: int,
                     num_samples: int, *, seeds: SeedTree, seed_path: tuple[int, ...] = (),
                     batch: int = 30, labels: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Samples ``generate`` (see :func:`generator_function`) in batches of ``batch``.

    Labels are uniform over the classes unless given; z ~ U(-1, 1).
    """
    rng = seeds.numpy(Stream.SAMPLES, *seed_path)
    if labels is None:
        labels = rng.integers(0, shape.num_classes, size=num_samples)
    latent = rng.uniform(-1.0, 1.0, size=(num_samples, z_dim)).astype(np.float32)
    images = np.empty((num_samples, shape.height, shape.width, shape.channels), np.float32)
    for start in range(0, num_samples, batch):
        stop = min(start + batch, num_samples)
        y = tf.one_hot(labels[start:stop], shape.num_classes)
        images[start:stop] = generate(tf.constant(latent[start:stop]), y).numpy()
    return images, labels.astype(np.int64)
