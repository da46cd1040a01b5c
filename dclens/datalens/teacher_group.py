"""A contiguous group of a DataLens run's teachers: their data, bank and ensemble.

Teachers [first, first + count) of a run of ``total`` teachers: their partitions (rows of
the run's partition array), their weights and Adam state (:class:`dclens.datalens.teacher_bank.
TeacherBank`, initialised exactly as those rows of the whole run's bank), and the two
things the student loop asks of them:

* :meth:`TeacherGroup.train` -- step 2 of a generator step for these teachers, fused with
  the first round's votes when a query is given;
* :meth:`TeacherGroup.vote` -- the summed TopAgg votes (int32 [B, D]) of these teachers.

An in-process run is one group of all its teachers.  Because the vote sum is a sum over
teachers and every draw is keyed by the run's (global) teacher indices -- the teachers'
initial weights by teacher, the stochastic sign's uniforms by the global first teacher of
each chunk -- groups that split the run at multiples of ``teacher_chunk`` give, summed,
bit for bit the votes of the whole run (tests/test_teacher_group.py).  That is what a
sharded run needs; the group knows nothing of where it runs.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import tensorflow as tf

from dclens.datalens import mismatch, teacher_bank
from dclens.datalens import teachers, topagg as topagg_lib
from dclens.datalens.bank_stream import ChunkStream
from dclens.datalens.config import DataLensConfig
from dclens.datalens.draws import Draws
from dclens.common.profiling import PhaseTimer


class ClassGridFakes:
    """Teachers' fake batches from the class grid (``FakeRendering.CLASS_GRID``).

    ``grid`` is G(z_j, c) for every class c, [K, B, H, W, C]; teacher i's fake image j is
    entry (y_ij, j), y_ij the label of its j-th real record.  Called as
    ``fakes(first_teacher, real_labels [T, B])`` -> [T, B, H, W, C].  The grid depends on
    the generator and z only, so it is what a shard worker is sent (not per-teacher fakes).
    """

    def __init__(self, grid):
        self.grid = grid

    def __call__(self, first_teacher: int, real_labels: np.ndarray) -> tf.Tensor:
        del first_teacher
        position = np.broadcast_to(np.arange(real_labels.shape[1]), real_labels.shape)
        return tf.gather_nd(self.grid, tf.stack([real_labels, position], axis=-1))


@dataclasses.dataclass(frozen=True)
class GroupMembers:
    """Which teachers a group holds and their records.

    Attributes:
      images, labels: the private training records (float32 NHWC, int64) the partitions
        index into.
      partitions: this group's rows of the run's partition array, int [count, m].
      first, total: the group's first teacher and the run's number of teachers.
    """

    images: np.ndarray
    labels: np.ndarray
    partitions: np.ndarray
    first: int
    total: int


@dataclasses.dataclass(frozen=True)
class VoteParts:
    """The run's pieces every group shares: how a teacher trains and how it votes.

    Attributes:
      ensemble: the teacher ensemble implementation (fast or reference).
      topagg: the run's :class:`dclens.datalens.topagg.TopAgg` (the vote rule).
      draws: the run's random draws (stochastic-sign uniforms).
      one_hot: labels -> float32 one-hot.
      layout: the teachers' parameter layout.
    """

    ensemble: object
    topagg: topagg_lib.TopAgg
    draws: Draws
    one_hot: Callable[[tf.Tensor], tf.Tensor]
    layout: teachers.ParamLayout


@dataclasses.dataclass(frozen=True)
class BankPlacement:
    """Where a group's bank lives: ``seed`` (the run's teacher-initialisation seed) decides
    its bits; the rest only where they are kept (``directory`` None: RAM; with a
    directory, ``resident_rows`` rows stay in RAM, and ``direct_io`` moves the others past
    the page cache: :class:`dclens.datalens.teacher_bank.TeacherBank`) and whether the
    chunk stream reads ahead in a background thread (``overlap_io``)."""

    seed: int
    directory: str | None = None
    resident_rows: int = 0
    overlap_io: bool = True
    direct_io: bool | None = None


class TeacherGroup:
    """Teachers [first, first + count) of a run (module docstring), with the run's
    ``config``, their :class:`GroupMembers`, the shared :class:`VoteParts`, where their
    bank lives (:class:`BankPlacement`) and the ``timer`` their phases add seconds to."""

    def __init__(self, config: DataLensConfig, members: GroupMembers, parts: VoteParts,
                 bank: BankPlacement, timer: PhaseTimer):
        self.config, self.images, self.labels = config, members.images, members.labels
        self.partitions = members.partitions
        self.first, self.total = members.first, members.total
        self.ensemble, self.topagg = parts.ensemble, parts.topagg
        self.draws, self.one_hot = parts.draws, parts.one_hot
        self.timer, self.overlap_io = timer, bank.overlap_io
        self.bank = teacher_bank.TeacherBank.create(
            parts.layout, len(members.partitions), seed=bank.seed, directory=bank.directory,
            resident_rows=bank.resident_rows, first_teacher=members.first,
            total_teachers=members.total, direct_io=bank.direct_io,
            shared_init=config.train.shared_teacher_init)
        self.dim = int(np.prod(members.images.shape[1:]))

    def _stream(self, *, with_adam: bool) -> ChunkStream:
        return ChunkStream(self.bank, self.config.train.teacher_chunk, with_adam=with_adam,
                           timer=self.timer, overlap=self.overlap_io)

    def _chunk_votes(self, weights: tf.Tensor, start: int, images: tf.Tensor,
                     labels: tf.Tensor, step: int, round_index: int) -> tf.Tensor:
        """Summed votes int32 [B, D] of the chunk whose first (group) teacher is ``start``."""
        with self.timer.phase("image_gradients"):
            grads = self.ensemble.image_gradients(weights, images, labels)
        with self.timer.phase("voting"):
            uniforms = None
            count = self.topagg.uniform_count(self.dim)
            if count:
                flat = tf.reshape(grads, (grads.shape[0], grads.shape[1], -1))
                uniforms = self.draws.sign_uniforms(step, round_index, self.first + start,
                                                    flat, count)
            return self.topagg.vote_sum(grads, uniforms=uniforms)

    def train(self, *, step: int, num_steps: int, columns: slice,
              chunk_fakes: Callable[[int, np.ndarray], tf.Tensor],
              query: tuple[tf.Tensor, tf.Tensor] | None = None
              ) -> tuple[np.ndarray, tf.Tensor | None]:
        """``num_steps`` Adam steps of every teacher of the group on its real batch
        (partition ``columns``) and fake batch (``chunk_fakes(first teacher of the chunk
        in the run, real labels [T, B])``; with ``mismatch_negatives`` m, its last m slots
        are the teacher's own records under wrong labels, :mod:`dclens.datalens.mismatch`),
        fused with round 0's votes on ``query``.

        Returns (every teacher's loss, the group's summed votes on ``query`` or None).
        """
        losses, total = [], None
        with self._stream(with_adam=True) as stream:
            for chunk in stream:
                records = self.partitions[chunk.start:chunk.stop, columns]
                real = tf.constant(self.images[records])
                real_labels = self.labels[records]
                fake, fake_labels = mismatch.with_mismatched_reals(
                    real, real_labels, chunk_fakes(self.first + chunk.start, real_labels),
                    self.config.train.mismatch_negatives, step=step,
                    num_classes=self.ensemble.shape.num_classes)
                labels = self.one_hot(real_labels)
                fake_one_hot = labels if fake_labels is real_labels else self.one_hot(
                    fake_labels)
                with self.timer.phase("teacher_training"):
                    if getattr(self.ensemble, "can_train_in_place", None) and \
                            self.ensemble.can_train_in_place(chunk.state):
                        # the chunk's arrays are overwritten: no copy of the state in or out
                        loss = self.ensemble.train_in_place(chunk.state, real, labels, fake,
                                                            fake_one_hot, num_steps=num_steps)
                        state = chunk.state._replace(
                            steps=np.asarray(chunk.state.steps) + num_steps)
                    else:
                        state, loss = self.ensemble.train(chunk.state, real, labels, fake,
                                                          fake_one_hot, num_steps=num_steps)
                    losses.append(np.asarray(loss))
                stream.write_back(chunk, state)
                if query is not None:
                    votes = self._chunk_votes(state.weights, chunk.start, *query, step, 0)
                    total = votes if total is None else total + votes
        return np.concatenate(losses), total

    def vote(self, images: tf.Tensor, labels: tf.Tensor, *, step: int,
             round_index: int) -> tf.Tensor:
        """Summed votes of the group's teachers for a fake batch (int32 [B, D])."""
        total = None
        with self._stream(with_adam=False) as stream:
            for chunk in stream:
                # the chunk's arrays stay valid until the next iteration: no copy needed
                votes = self._chunk_votes(chunk.state.weights, chunk.start, images, labels,
                                          step, round_index)
                total = votes if total is None else total + votes
        return total
