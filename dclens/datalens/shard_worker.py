"""One shard of a DataLens run's teachers, in the process that holds them (a Ray actor's
body, or a plain object for the in-process backend): see :mod:`dclens.datalens.sharded`.

TensorFlow is imported quietly first thing: in a Ray actor this module is what the
worker process imports, and its stderr reaches the driver's console."""

from __future__ import annotations

from dclens.datalens import teacher_bank
from dclens.common import tf_env

tf_env.import_tensorflow_quietly()

# pylint: disable=wrong-import-position
import dataclasses  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dclens.common.profiling import PhaseTimer  # noqa: E402
from dclens.datalens import build  # noqa: E402
from dclens.datalens.config import DataLensConfig  # noqa: E402
from dclens.datalens.draws import KeyedSignDraws  # noqa: E402
from dclens.datalens.shards import Shard  # noqa: E402
from dclens.datalens.teacher_group import (BankPlacement, ClassGridFakes,  # noqa: E402
                                           GroupMembers, TeacherGroup, VoteParts)
from dclens.runs.checkpoint import CheckpointStore  # noqa: E402
from dclens.runs.rundir import BANK_FOLDER  # noqa: E402

class ShardError(RuntimeError):
    """A shard worker cannot be started or failed; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class ShardSetup:
    """Everything a worker needs to build its shard (small, picklable, no private data:
    the records are read from the worker's own disk)."""

    config: dict
    shard: Shard
    total: int
    bank_seed: int
    checkpoint_dir: str
    ensemble: str = "fast"
    bank_ram_bytes: int | None = None


class ShardWorker:
    """Teachers [first, stop) of a run in one process (a Ray actor's body).

    Built from a :class:`ShardSetup`: loads the training split from this node's disk
    (``data_dir`` of the config; a :class:`dclens.data.DataError` names where the files
    go), partitions it as the whole run does and keeps only its teachers' records.
    """

    def __init__(self, setup: ShardSetup):
        self.setup = setup
        config = DataLensConfig.from_dict(setup.config)
        dataset = build.load_training_data(config)
        shape = build.image_shape_of(dataset.spec)
        partitions = build.run_partitions(config, dataset.labels, shape.num_classes)
        mine = partitions[setup.shard.first:setup.shard.stop]
        # Only this shard's records stay in memory; the partitions index into them.
        self.records = int(mine.size)
        images = np.ascontiguousarray(dataset.images[mine.reshape(-1)])
        labels = np.ascontiguousarray(dataset.labels[mine.reshape(-1)])
        local = np.arange(mine.size, dtype=mine.dtype).reshape(mine.shape)
        del dataset, partitions
        layout = build.teacher_layout(config, shape)
        budget = (build.default_bank_ram_bytes() if setup.bank_ram_bytes is None
                  else setup.bank_ram_bytes)
        in_ram = teacher_bank.bank_bytes(layout, setup.shard.count) <= budget
        self.draws = KeyedSignDraws()
        self.timer = PhaseTimer()
        num_classes = shape.num_classes
        self.group = TeacherGroup(
            config, GroupMembers(images, labels, local, first=setup.shard.first,
                                 total=setup.total),
            VoteParts(ensemble=build.build_ensemble(config, shape, setup.ensemble),
                      topagg=build.build_topagg(config, shape), draws=self.draws,
                      one_hot=lambda y: tf.one_hot(y, num_classes, dtype=tf.float32),
                      layout=layout),
            BankPlacement(setup.bank_seed,
                          directory=None if in_ram else os.path.join(setup.checkpoint_dir,
                                                                     BANK_FOLDER),
                          resident_rows=build.resident_rows(layout, setup.bank_ram_bytes),
                          overlap_io=True),
            self.timer)
        self.store = CheckpointStore(setup.checkpoint_dir, keep=2)
        self.store.remove_partial()

    def info(self) -> dict[str, Any]:
        """Where this shard runs (for logs and error messages)."""
        return {"shard": self.setup.shard.index, "host": socket.gethostname(),
                "pid": os.getpid(), "first": self.setup.shard.first,
                "stop": self.setup.shard.stop, "records": self.records}

    def train(self, step: int, num_steps: int, columns: tuple[int, int], grid: np.ndarray,
              query: tuple[np.ndarray, np.ndarray] | None, keys: dict[int, np.ndarray]
              ) -> tuple[float, int, np.ndarray | None]:
        """:meth:`TeacherGroup.train` with the class grid; returns (sum of the teachers'
        losses, number of teachers, summed votes int32 [B, D] or None)."""
        self.draws.use(keys)
        tensors = None if query is None else (tf.constant(query[0]), tf.constant(query[1]))
        losses, votes = self.group.train(
            step=step, num_steps=num_steps, columns=slice(*columns),
            chunk_fakes=ClassGridFakes(tf.constant(grid)), query=tensors)
        return (float(np.sum(losses, dtype=np.float64)), int(len(losses)),
                None if votes is None else votes.numpy())

    def vote(self, images: np.ndarray, labels: np.ndarray, step: int, round_index: int,
             keys: dict[int, np.ndarray]) -> np.ndarray:
        """The shard's summed votes (int32 [B, D]) for a query batch."""
        self.draws.use(keys)
        return self.group.vote(tf.constant(images), tf.constant(labels), step=step,
                               round_index=round_index).numpy()

    def save(self, step: int) -> str:
        """Writes this shard's teachers as checkpoint ``step`` (atomically); its path."""
        bank = self.group.bank
        shard = self.setup.shard
        saved = self.store.save(
            step, {"weights": bank.weights, "adam_m": bank.adam_m, "adam_v": bank.adam_v,
                   "steps": bank.steps},
            {"shard": shard.index, "first": shard.first, "stop": shard.stop,
             "total": self.setup.total})
        return saved.path

    def load(self, step: int) -> None:
        """Restores this shard's checkpoint ``step`` (written by :meth:`save`)."""
        checkpoint = self.store.at(step)
        shard = self.setup.shard
        if checkpoint is None:
            raise ShardError(
                f"shard {shard.index} (teachers {shard.first}..{shard.stop - 1}) has no "
                f"checkpoint of step {step} in {self.setup.checkpoint_dir} on "
                f"{socket.gethostname()}: every node must see its shard's checkpoints "
                "(same path or a shared file system); resume on the nodes that trained "
                "the run, or --restart")
        saved = (checkpoint.state.get("first"), checkpoint.state.get("stop"),
                 checkpoint.state.get("total"))
        if saved != (shard.first, shard.stop, self.setup.total):
            raise ShardError(
                f"{checkpoint.path} holds teachers {saved[0]}..{saved[1] - 1} of {saved[2]}, "
                f"this shard is {shard.first}..{shard.stop - 1} of {self.setup.total}: the "
                "run was trained with another --shards; resume with the same --shards")
        for field in ("weights", "adam_m", "adam_v", "steps"):
            self.group.bank.assign(field, checkpoint.load_array(field, mmap=True))
