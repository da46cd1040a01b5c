"""The DataLens training loop (paper Alg. 1) and the outputs of a run.

One *generator step* (the authors' inner iteration; with the paper configs one epoch):

1. z ~ U(-1, 1)^{B x z_dim}.  For the teachers' fake batches the generator renders
   G(z_j, c) for every class c once; teacher i's fake image j is G(z_j, y_ij) with y_ij
   the label of its j-th real record (the authors' choice), so no forward pass is
   repeated per teacher (``fake_rendering=teacher_labels`` renders, as the authors do,
   one batch G(z, y_i) per distinct label sequence instead; see
   :class:`dclens.datalens.config.FakeRendering`).
2. Every teacher takes ``d_step`` Adam steps (``pretrain_teacher`` in the first epoch) on
   its own real batch (B records of its partition) and that fake batch (beyond the paper,
   ``mismatch_negatives`` m: its last m slots hold the teacher's own records under wrong
   labels, :mod:`dclens.datalens.mismatch`).
3. ``g_step`` times: fresh uniformly random labels y, x = G(z, y); before anything is
   computed from the teachers, the ledger checks that B more TopAgg queries stay within
   ``max_eps`` -- if not, training stops (the step is not taken).  The B queries are
   recorded in the ledger *before* the noisy aggregate is released.  Each teacher's image
   gradients are voted (TopAgg) chunk by chunk, noised once, thresholded to g_bar; the
   student takes one Adam step on sum((G(z, y) - stop_gradient(x + lr * g_bar))^2).

B = min(batch_size, partition size).  Every random draw comes from a :class:`SeedTree`.

The generator does not change between steps 2 and 3, so the first round's fake batch is
rendered before the teachers train and each chunk of teachers is queried right after its
own training, while its weights are in memory: the teacher state is streamed once per
generator step instead of twice (the same numbers as training all, then querying all).
The teacher state streams through :class:`dclens.datalens.bank_stream.ChunkStream` (next chunk read
and previous chunk written in a background thread); every phase is timed
(:attr:`DataLens.timer`, see :mod:`dclens.common.profiling`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Protocol

import keras
import numpy as np
import tensorflow as tf

from dclens.datalens import mismatch, teacher_bank
from dclens.privacy import accounting, data_dependent
from dclens import data
from dclens.datalens import networks, teachers, topagg, warm_start
from dclens.datalens.config import DataLensConfig, FakeRendering
from dclens.datalens.draws import Draws, SeededDraws
from dclens.datalens.build import (build_ensemble, build_topagg, image_shape_of,
                                   resident_rows, run_partitions, teacher_layout)
from dclens.datalens.sample import generator_function, sample_generator
from dclens.common.profiling import PhaseTimer
from dclens.common.rng import SeedTree, Stream
from dclens.datalens.teacher_group import (BankPlacement, ClassGridFakes, GroupMembers,
                                           TeacherGroup, VoteParts)

class RoundObserver(Protocol):
    """Told about every released TopAgg round (set as ``DataLens.observer``)."""

    def round_released(self, step: int, round_index: int, images: tf.Tensor,
                       one_hot: tf.Tensor, vote_sum: tf.Tensor,
                       result: topagg.TopAggResult) -> None:
        ...


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
    #: The authors' data-dependent epsilon (analysis only, never spent); None when off.
    epsilon_data_dependent_analysis: float | None = None


@dataclasses.dataclass(frozen=True)
class TeacherPlacement:
    """Where and how a run's teachers are held and computed.  None of it changes a result:
    every choice gives the same votes (the equality tests of tests/test_fast_paths.py,
    tests/test_teacher_group.py and tests/test_sharded.py).

    Attributes:
      ensemble: ``"fast"`` (:class:`dclens.datalens.fast_ensemble.FastTeacherEnsemble`) or
        ``"reference"`` (:class:`dclens.datalens.teachers.TeacherEnsemble`).
      bank_dir: where the teacher bank's files live (None = RAM; see :func:`bank_location`).
      bank_ram_bytes: with ``bank_dir``, the teachers that fit in this many bytes (default
        :func:`default_bank_ram_bytes`) stay in RAM, the others stream from disk.
      overlap_io: stream teacher state in a background thread (False: in line).
      bank_direct_io: move a disk bank's rows with O_DIRECT, past the page cache (None,
        the default: where the file system takes it; False: never; True: required).
      launch_teachers: ``launch_teachers(lens)`` returns teachers held elsewhere (shard
        workers: :func:`dclens.datalens.sharded.launcher`) instead of a
        :class:`TeacherGroup` in this process.
    """

    ensemble: str = "fast"
    bank_dir: str | None = None
    bank_ram_bytes: int | None = None
    overlap_io: bool = True
    bank_direct_io: bool | None = None
    launch_teachers: Callable[["DataLens"], object] | None = None


def check_query_batch(query_batch: int | None, batch: int) -> int:
    """The images voted on per round: ``query_batch``, or ``batch`` (the teachers' batch
    B = min(batch_size, partition size)) when None; a ValueError quoting both when it is
    not an integer in [1, B]."""
    if query_batch is None:
        return batch
    if isinstance(query_batch, bool) or not isinstance(query_batch, (int, np.integer)) \
            or query_batch < 1:
        raise ValueError(f"query_batch must be an integer >= 1, got {query_batch!r}")
    if query_batch > batch:
        raise ValueError(f"query_batch={query_batch} exceeds the step's batch of {batch} "
                         f"(min(batch_size, partition size)): a round renders {batch} images "
                         f"and votes on the first query_batch; use a value <= {batch}")
    return int(query_batch)


class DataLens:
    """The state of a DataLens run: data partitions, teacher bank, student, ledger.

    Args:
      config: the run's hyper-parameters.
      dataset: the private training data.
      root_seed: the run's root seed (``config.train.seed`` or OS entropy).
      placement: where and how the teachers run (:class:`TeacherPlacement`; no effect on
        the results).
      timer: where the seconds of each phase are added (a fresh one if None).
      partitions: explicit teacher partitions, int [num_teachers, m] indices into
        ``dataset`` (e.g. another implementation's, for a side-by-side comparison); they
        must be disjoint (checked, :func:`dclens.data.check_partitions`).  None: the
        config's partitioner.  Teacher i takes its batches from row i in column order.
      draws: where every random draw of the loop comes from (:mod:`dclens.datalens.draws`); None:
        :class:`dclens.datalens.draws.SeededDraws` of ``root_seed``.  Anything else makes the DP
        noise known to its author: not private.

    Attributes set after construction (None by default):
      on_spend: called as ``on_spend(step, round, queries)`` right after a round's queries
        are added to ``self.ledger`` and before its noise is drawn; it must make the spend
        durable (the run's write-ahead :class:`dclens.runs.journal.PrivacyJournal`).  If it
        raises, nothing is released.
      observer: told about every released round, after its release
        (:class:`RoundObserver`): images, labels, the summed votes and the result.
    """

    def __init__(self, config: DataLensConfig, dataset: data.LabeledImages, *,
                 root_seed: int, placement: TeacherPlacement = TeacherPlacement(),
                 timer: PhaseTimer | None = None, partitions: np.ndarray | None = None,
                 draws: Draws | None = None):
        train_cfg = config.train
        self.timer = timer if timer is not None else PhaseTimer()
        self.config = config
        self.root_seed = root_seed
        self.on_spend: Callable[[int, int, int], None] | None = None
        self.observer: RoundObserver | None = None
        self.noise_attempt = 0
        self.shape = image_shape_of(dataset.spec)
        if config.topagg.topk > self.shape.dim:
            raise ValueError(f"topk={config.topagg.topk} is larger than the image dimension "
                             f"{self.shape.dim} of {dataset.spec.name}; use topk <= "
                             f"{self.shape.dim}")
        self.images = dataset.images
        self.labels = dataset.labels
        self.seeds = SeedTree(root_seed)
        self.draws = draws if draws is not None else SeededDraws(self.seeds)
        if partitions is not None:
            self.partitions = data.check_partitions(partitions, num_records=len(dataset.labels),
                                                    num_teachers=train_cfg.num_teachers)
        else:
            self.partitions = run_partitions(config, dataset.labels, self.shape.num_classes)
        self.partition_size = self.partitions.shape[1]
        self.batch = min(train_cfg.batch_size, self.partition_size)
        self.steps_per_epoch = self.partition_size // self.batch
        mismatch.check_count(train_cfg.mismatch_negatives, self.batch)
        self.query_batch = check_query_batch(train_cfg.query_batch, self.batch)
        self.ensemble = build_ensemble(config, self.shape, placement.ensemble)
        self.topagg = build_topagg(config, self.shape)
        if placement.launch_teachers is None:
            layout = teacher_layout(config, self.shape)
            self.teachers = TeacherGroup(
                config,
                GroupMembers(self.images, self.labels, self.partitions, first=0,
                             total=train_cfg.num_teachers),
                VoteParts(ensemble=self.ensemble, topagg=self.topagg, draws=self.draws,
                          one_hot=self.one_hot,
                          layout=layout),
                BankPlacement(self.seeds.integer(Stream.TEACHER_INIT),
                              directory=placement.bank_dir,
                              resident_rows=resident_rows(layout, placement.bank_ram_bytes),
                              overlap_io=placement.overlap_io,
                              direct_io=placement.bank_direct_io),
                self.timer)
        else:
            if partitions is not None or draws is not None:
                raise ValueError("a sharded run takes its partitions and draws from the "
                                 "config and the root seed (each worker partitions its own "
                                 "node's data); explicit partitions or draws need the "
                                 "in-process teachers (no --shards)")
            self.teachers = placement.launch_teachers(self)
        self.generator = networks.build_generator(
            self.shape, train_cfg.z_dim, seed=self.seeds.integer(Stream.GENERATOR_INIT),
            filters=train_cfg.generator_filters, dense=train_cfg.generator_dense,
            upsampling=train_cfg.generator_upsampling.value)
        # A warm start (beyond the paper): the generator fitted to a DP-MERF release of the
        # same records; its spends enter the ledger when the run begins (run.py).
        self.warm_start = (None if train_cfg.warm_start is None else
                           warm_start.open_warm_start(train_cfg.warm_start, train_cfg))
        if self.warm_start is not None:
            warm_start.load_generator(self.generator, self.warm_start)
        self.student_optimizer = keras.optimizers.Adam(
            train_cfg.learning_rate, beta_1=train_cfg.beta1, epsilon=teachers.ADAM_EPSILON)
        self.ledger = accounting.PrivacyLedger(
            delta=config.budget.delta, conversion=config.budget.conversion,
            orders=(accounting.classic_orders(config.budget.max_order)
                    if config.budget.conversion is accounting.Conversion.CLASSIC else None))
        self.step = 0
        # Every render leaves the generator's BN moving statistics alone (generator_function):
        # the authors' per-teacher fake batches are a function of private labels.
        self.generate = generator_function(self.generator)
        # The released generator: the student, or a moving average of its weights
        # (post-processing of the released updates; train.generator_ema).
        self.generator_average = (None if not train_cfg.generator_ema else
                                  [tf.Variable(w, trainable=False, name=f"ema_{i}")
                                   for i, w in enumerate(self.generator.trainable_variables)])
        self.generate_released = (self.generate if self.generator_average is None else
                                  generator_function(self.generator,
                                                     self.generator_average))
        # The data-dependent analysis (never spent): RDP at the authors' orders.
        self.analysis_orders = np.asarray(accounting.classic_orders(config.budget.max_order))
        self.analysis_rdp = (np.zeros(len(self.analysis_orders))
                             if train_cfg.data_dependent_analysis else None)

    # ------------------------------------------------------------------ helpers
    def one_hot(self, labels: tf.Tensor) -> tf.Tensor:
        return tf.one_hot(labels, self.shape.num_classes, dtype=tf.float32)

    def latent(self, step: int) -> tf.Tensor:
        """z ~ U(-1, 1) of a generator step, float32 [B, z_dim]."""
        return self.draws.latent(step, (self.batch, self.config.train.z_dim))

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch

    def within_budget(self) -> bool:
        """Whether one more TopAgg round of Q queries keeps epsilon <= max_eps."""
        if self.config.train.non_private:
            return True
        after = self.ledger.epsilon_after_event(self.topagg.event(self.query_batch))
        return after.epsilon <= self.config.budget.max_eps

    # ------------------------------------------------------------------ teachers
    def _slot_columns(self) -> slice:
        """The partition columns of this step's real batches."""
        slot = self.step % self.steps_per_epoch
        return slice(slot * self.batch, (slot + 1) * self.batch)

    def teacher_fakes(self, z: tf.Tensor) -> tf.Tensor:
        """The fake images of this step's teacher batches (step 1).

        ``class_grid`` (dclens): G(z_j, c) for every class c, [K, B, H, W, C], one batch of
        K*B images; teacher i's fake j is entry (y_ij, j).  ``teacher_labels`` (the
        authors'): G(z, y_i) as one batch of B images for every distinct label sequence
        y_i of the teachers' real batches, [U, B, H, W, C] (batch-norm statistics over
        those B images, as the authors' per-teacher graph computes them).
        """
        if self.config.train.fake_rendering is FakeRendering.TEACHER_LABELS:
            sequences, self._fake_sequence = np.unique(
                self.labels[self.partitions[:, self._slot_columns()]], axis=0,
                return_inverse=True)
            self._fake_sequence = self._fake_sequence.reshape(-1)
            return tf.stack([self.generate(z, self.one_hot(row)) for row in sequences])
        k = self.shape.num_classes
        classes = tf.repeat(tf.range(k), self.batch)
        fakes = self.generate(tf.tile(z, [k, 1]), self.one_hot(classes))
        return tf.reshape(fakes, (k, self.batch, *fakes.shape[1:]))

    def _chunk_fakes(self, fakes: tf.Tensor, start: int, real_labels: np.ndarray
                     ) -> tf.Tensor:
        """``teacher_labels``: teachers' fake batches [T, B, H, W, C] of a chunk from
        :meth:`teacher_fakes` (``class_grid``: :class:`ClassGridFakes`)."""
        return tf.gather(fakes, self._fake_sequence[start:start + len(real_labels)])

    def query(self, z: tf.Tensor, round_index: int) -> tuple[tf.Tensor, tf.Tensor]:
        """A round's rendered batch: (images G(z, y) [B, H, W, C], one-hot y [B, K]); the
        first ``query_batch`` of them are voted on (:meth:`voted`)."""
        labels = self.draws.query_labels(self.step, round_index, self.batch,
                                         self.shape.num_classes)
        one_hot = self.one_hot(labels)
        return self.generate(z, one_hot), one_hot

    def voted(self, rendered: tf.Tensor) -> tf.Tensor:
        """The queried part of a round's rendered batch: all B images (the paper's) or the
        first ``query_batch``.  The whole batch is rendered either way, so the generator's
        batch statistics are over B images in the query and in the student's update."""
        return rendered if self.query_batch == self.batch else rendered[:self.query_batch]

    @property
    def sharded(self) -> bool:
        """Whether the teachers live in shard workers (:mod:`dclens.datalens.sharded`)."""
        return not isinstance(self.teachers, TeacherGroup)

    @property
    def bank(self) -> teacher_bank.TeacherBank:
        """The teachers' weights and Adam state (all of them: one in-process group)."""
        if self.sharded:
            raise AttributeError("the teachers of a sharded run live in its shard workers; "
                                 "their state is in the per-shard checkpoints")
        return self.teachers.bank

    def train_teachers(self, fakes: tf.Tensor,
                       query: tuple[tf.Tensor, tf.Tensor] | None = None
                       ) -> tuple[float, tf.Tensor | None]:
        """Step 2, fused with round 0's votes when ``query`` (images, one-hot) is given.

        Returns (mean teacher loss, summed votes of all teachers for ``query`` after their
        training, or None).
        """
        train_cfg = self.config.train
        num_steps = (train_cfg.pretrain_teacher
                     if self.epoch == 0 and train_cfg.pretrain_teacher > 0 else train_cfg.d_step)
        if self.config.train.fake_rendering is FakeRendering.TEACHER_LABELS:
            chunk_fakes = lambda start, real_labels: self._chunk_fakes(  # noqa: E731
                fakes, start, real_labels)
        else:
            chunk_fakes = ClassGridFakes(fakes)
        losses, total = self.teachers.train(
            step=self.step, num_steps=num_steps, columns=self._slot_columns(),
            chunk_fakes=chunk_fakes, query=query)
        return float(np.mean(losses)), total

    # ------------------------------------------------------------------ student
    def vote(self, images: tf.Tensor, labels: tf.Tensor, round_index: int) -> tf.Tensor:
        """Summed votes of all teachers for a fake batch (int32 [B, D])."""
        return self.teachers.vote(images, labels, step=self.step, round_index=round_index)

    def noise(self, round_index: int, shape: tuple[int, int]) -> tf.Tensor:
        """The DP noise's standard normal draws of (noise_attempt, step, round).

        ``noise_attempt`` is raised when a run resumes after a crash that lost spends, so
        the redone steps draw *fresh* noise: re-using a lost round's noise on a vote sum
        that may differ (e.g. when resumed on another machine) would release the
        difference of the two sums without noise.
        """
        return self.draws.dp_noise(self.noise_attempt, self.step, round_index, shape)

    def student_round(self, z: tf.Tensor, round_index: int,
                      voted: tuple[tf.Tensor, tf.Tensor, tf.Tensor] | None = None
                      ) -> tuple[float, float]:
        """Step 3, one round: query, spend, release, update.  Returns (loss, pass fraction).

        ``voted``: (rendered images [B], their one-hot labels, the vote sum of the queried
        ones) of this round if already computed (round 0, fused with the teachers'
        training).
        """
        if not self.within_budget():
            raise BudgetExhausted()
        if voted is None:
            with self.timer.phase("generator_forward"):
                rendered, one_hot = self.query(z, round_index)
            vote_sum = self.vote(self.voted(rendered), self.voted(one_hot), round_index)
        else:
            rendered, one_hot, vote_sum = voted
        images = self.voted(rendered)
        if not self.config.train.non_private:
            # Recorded (and journaled by on_spend) before the noise is drawn.
            self.ledger.spend(self.topagg.event(self.query_batch))
            if self.on_spend is not None:
                self.on_spend(self.step, round_index, self.query_batch)
        with self.timer.phase("noise"):
            noise = self.noise(round_index, self.topagg.noise_shape(tuple(vote_sum.shape)))
            result = self.topagg.release(vote_sum, noise=noise)
        if self.analysis_rdp is not None:
            noisy = (tf.cast(vote_sum, tf.float32) + self.config.topagg.sigma * noise).numpy()
            for votes in noisy:            # one call per image
                self.analysis_rdp += data_dependent.topagg_call_rdp(
                    votes, sigma=self.config.topagg.sigma, topk=self.config.topagg.topk,
                    orders=self.analysis_orders)
        if self.observer is not None:
            self.observer.round_released(self.step, round_index, images,
                                         self.voted(one_hot), vote_sum, result)
        with self.timer.phase("student_update"):
            target = tf.stop_gradient(
                images + self.config.train.learning_rate * tf.reshape(result.update,
                                                                      images.shape))
            with tf.GradientTape() as tape:
                current = self.voted(self.generator([z, one_hot], training=True))
                loss = tf.reduce_sum(tf.square(current - target))
            weights = self.generator.trainable_weights
            self.student_optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))
            self._update_average()
            loss = float(loss)
        return loss, result.pass_fraction

    def _update_average(self) -> None:
        """w_ema <- d w_ema + (1 - d) w for every trainable weight (train.generator_ema)."""
        if self.generator_average is None:
            return
        decay = self.config.train.generator_ema
        for average, weight in zip(self.generator_average,
                                   self.generator.trainable_variables):
            average.assign(decay * average + (1.0 - decay) * weight)

    def released_generator(self) -> keras.Model:
        """The generator to publish: the student itself, or (train.generator_ema) a copy
        whose trainable weights are the moving average and whose batch-norm statistics are
        the student's."""
        if self.generator_average is None:
            return self.generator
        released = keras.models.clone_model(self.generator)
        released.set_weights(self.generator.get_weights())
        for variable, average in zip(released.trainable_variables, self.generator_average):
            variable.assign(average)
        return released

    # ------------------------------------------------------------------ loop
    def train_step(self) -> StepRecord:
        """One generator step (teachers, then g_step student rounds)."""
        started = time.perf_counter()
        if not self.within_budget():
            raise BudgetExhausted()
        z = self.latent(self.step)
        with self.timer.phase("generator_forward"):
            fakes = self.teacher_fakes(z)
            first_query = self.query(z, 0)
        teacher_loss, first_votes = self.train_teachers(
            fakes, (self.voted(first_query[0]), self.voted(first_query[1])))
        queries_before = self.ledger.queries
        student_losses, passes = [], []
        try:
            for round_index in range(self.config.train.g_step):
                voted = (*first_query, first_votes) if round_index == 0 else None
                loss, passed = self.student_round(z, round_index, voted)
                student_losses.append(loss)
                passes.append(passed)
        finally:
            record = StepRecord(
                step=self.step, epoch=self.epoch,
                queries=self.ledger.queries - queries_before
                if not self.config.train.non_private else self.query_batch * len(passes),
                epsilon=None if self.config.train.non_private else self.ledger.epsilon().epsilon,
                teacher_loss=teacher_loss,
                student_loss=float(np.mean(student_losses)) if student_losses else math.nan,
                pass_fraction=float(np.mean(passes)) if passes else math.nan,
                seconds=time.perf_counter() - started,
                epsilon_data_dependent_analysis=(
                    None if self.analysis_rdp is None else data_dependent.classic_epsilon(
                        self.analysis_rdp, self.analysis_orders, self.config.budget.delta)))
            self.step += 1
        return record

    # ------------------------------------------------------------------ state
    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything a resume needs besides the step, seed and ledger, as named arrays.

        Teachers' weights, Adam moments and step counts; the generator's variables (incl.
        batch-norm statistics) and the student optimizer's variables (incl. its iteration
        counter), in their fixed creation order.
        """
        arrays = {} if self.sharded else {
            "teachers_weights": self.bank.weights, "teachers_adam_m": self.bank.adam_m,
            "teachers_adam_v": self.bank.adam_v, "teachers_steps": self.bank.steps}
        for i, variable in enumerate(self.generator.weights):
            arrays[f"generator_{i:03d}"] = variable.numpy()
        if self.student_optimizer.built:
            for i, variable in enumerate(self.student_optimizer.variables):
                arrays[f"optimizer_{i:03d}"] = variable.numpy()
        for i, variable in enumerate(self.generator_average or ()):
            arrays[f"average_{i:03d}"] = variable.numpy()
        if self.analysis_rdp is not None:
            arrays["analysis_data_dependent_rdp"] = self.analysis_rdp.copy()
        return arrays

    def load_state_arrays(self, load: Callable[[str], np.ndarray], names: list[str],
                          step: int) -> None:
        """Restores :meth:`state_arrays` (``load(name)`` reads one) and sets the step.

        Teacher arrays are copied into the bank in slices, so ``load`` may return memory
        maps (a disk-backed bank larger than RAM is restored without being resident).  A
        sharded run's workers load their own shard's checkpoint of ``step``.
        """
        teacher_arrays = (("teachers_weights", "weights"), ("teachers_adam_m", "adam_m"),
                          ("teachers_adam_v", "adam_v"), ("teachers_steps", "steps"))
        if self.sharded:
            self.teachers.load(step)
            teacher_arrays = ()
        for name, field in teacher_arrays:
            array = load(name)
            target = getattr(self.bank, field)
            if array.shape != target.shape:
                raise ValueError(f"checkpoint {name} has shape {array.shape}, this run needs "
                                 f"{target.shape}")
            self.bank.assign(field, array)
        self._assign("generator", self.generator.weights, load, names)
        optimizer_names = [n for n in names if n.startswith("optimizer_")]
        if optimizer_names:
            self.student_optimizer.build(self.generator.trainable_variables)
            self._assign("optimizer", self.student_optimizer.variables, load, names)
        if self.generator_average is not None:
            self._assign("average", self.generator_average, load, names)
        if self.analysis_rdp is not None and "analysis_data_dependent_rdp" in names:
            self.analysis_rdp = np.array(load("analysis_data_dependent_rdp"), np.float64)
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
        return sample_generator(self.generate_released, self.shape, self.config.train.z_dim,
                                num_samples, seeds=self.seeds, seed_path=seed_path,
                                batch=batch)
