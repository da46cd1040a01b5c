"""A DataLens run's teachers in shard workers: Ray actors, one per contiguous shard.

The teachers of a run split into S contiguous shards of whole chunks
(:func:`dclens.datalens.shards.plan_shards`).  Each shard lives in one :class:`ShardWorker`: it loads
the private training split from *its own node's disk*, partitions it with the run's
(data-independent, seeded) partitioner, keeps only the records of its own partitions, and
holds its teachers' weights and Adam state (a :class:`dclens.datalens.teacher_group.TeacherGroup`,
in RAM or a disk bank as the in-process run would).  The driver
(:class:`ShardedTeachers`) is the rest of :class:`dclens.datalens.train.DataLens`: generator,
ledger, journal, noise.

What crosses between driver and workers, per generator step:

* driver -> worker: the class grid G(z_j, c) [K, B, H, W, C] (float32) for the teachers'
  fake batches, each round's query batch (images [B, H, W, C], one-hot labels [B, K]),
  the step and round, and the stochastic-sign key (int64 [2]) of each of the worker's
  chunks (:meth:`dclens.datalens.draws.SeededDraws.sign_key`).  Nothing private: the generator's
  output and public randomness.
* worker -> driver: the shard's summed votes (int32 [B, D]) per round, and the sum and
  count of its teachers' losses once per step (a private diagnostic that the in-process
  run also computes; it goes to TensorBoard only; per-teacher losses stay in the actor).

**Privacy.**  No record and no single teacher's vote leaves a worker; the driver sees only
sums over a shard's teachers, exactly the partial sums the in-process run adds up.  The
DP noise is drawn once, on the driver, after the round's spend is journaled (as
in-process); workers never see the run's root seed, so they cannot derive the noise.
Replacing one training record changes one teacher, hence one shard's partial sum, hence
the total by at most the mechanism's sensitivity: the accounting is the in-process one.

**Equality.**  Integer vote sums add exactly in any order, every draw is keyed by run-
global teacher indices (the teachers' initial weights by teacher, the sign uniforms by
the first teacher of each chunk), so a sharded run gives bit for bit the in-process run's
votes, generator, samples and epsilon curve (tests/test_sharded.py).

**Faults.**  If a worker dies or fails, :class:`ShardError` is raised before anything of
the current round is released; every spend journaled so far stays in the ledger, and the
same command resumes from the last checkpoint (steps redone draw fresh noise, the lost
spends stay counted: :mod:`dclens.runs.journal`).  Checkpoints are per shard: each worker writes
its own teachers atomically (:class:`dclens.runs.checkpoint.CheckpointStore`, keeping two, so
the driver's latest checkpoint always has its shards' match); the driver commits its own
checkpoint only after every shard has.

Backends: :class:`RayBackend` (one actor per shard, ``ray.init(address)``: a local
cluster by default, ``ray start --head`` / ``--ray_address`` for a real one) and
:class:`InProcessBackend` (the workers in this process, one after the other: the same code
path without Ray, for tests and debugging).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from dclens.common import tf_env
from dclens.common.paths import REPO_ROOT
from dclens.datalens.config import FakeRendering
from dclens.datalens.teacher_group import ClassGridFakes
from dclens.datalens.draws import SeededDraws
from dclens.datalens.shard_worker import ShardError, ShardSetup, ShardWorker
from dclens.runs.rundir import SHARDS_FOLDER, shard_folder
from dclens.datalens.shards import Shard, ShardPlanError, plan_shards
from dclens.common.rng import Stream

__all__ = ["SHARDS_FOLDER", "ShardError", "ShardOptions", "ShardSetup", "ShardWorker",
           "ShardedTeachers", "InProcessBackend", "RayBackend", "ShardPlanError", "launcher"]

@dataclasses.dataclass(frozen=True)
class ShardOptions:
    """How a run's teachers are sharded.

    Attributes:
      shards: number of shards (workers), >= 1.
      checkpoint_dir: the run's checkpoint folder; shard s keeps its checkpoints in
        ``<checkpoint_dir>/shards/shard-<s>`` and, if its teachers do not fit in half its
        node's RAM, its disk bank in ``.../bank``.  On a multi-node cluster the path must
        be writable on every node (a shared file system, or the same path on local disks).
      backend: ``"ray"`` (default) or ``"inprocess"``.
      ray_address: None: start a local Ray cluster (or join the one ``RAY_ADDRESS``
        names); ``"auto"`` or ``host:port``: join that cluster.
      cpus_per_shard: CPUs each actor reserves in Ray's scheduler.
    """

    shards: int
    checkpoint_dir: str
    backend: str = "ray"
    ray_address: str | None = None
    cpus_per_shard: float = 1.0

    def __post_init__(self):
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 1:
            raise ShardPlanError(f"--shards {self.shards!r}: must be an integer >= 1")
        if self.backend not in BACKENDS:
            raise ShardError(f"unknown shard backend {self.backend!r}; use one of "
                             f"{sorted(BACKENDS)}")


class InProcessBackend:
    """Workers as plain objects in this process, called one after the other."""

    name = "inprocess"

    def __init__(self, options: ShardOptions):
        del options

    def start(self, setup: ShardSetup) -> ShardWorker:
        return ShardWorker(setup)

    def submit(self, worker: ShardWorker, method: str, *args) -> Callable[[], Any]:
        return lambda: getattr(worker, method)(*args)

    def gather(self, futures: Sequence[Callable[[], Any]]) -> list:
        return [future() for future in futures]

    def stop(self, workers) -> None:
        del workers


def _ray():
    try:
        import ray  # pylint: disable=import-outside-toplevel
    except ImportError as error:  # pragma: no cover - ray is in requirements.txt
        raise ShardError("--shards needs Ray: pip install -r requirements.txt "
                         "(or pip install ray)") from error
    return ray


def _check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """Fails fast on a ``host:port`` (or ``ray://host:port``) that accepts no connection
    (Ray itself retries for minutes); None and ``auto`` are left to Ray."""
    if address is None or address == "auto":
        return
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ShardError(f"--ray_address {address!r} is not host:port (e.g. 10.0.0.1:6379, "
                         "what `ray start --head` prints), 'auto' or ray://host:port")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise ShardError(
            f"cannot reach the Ray cluster at --ray_address {address!r} ({error}); start "
            "it with `ray start --head` on the head node (and `ray start --address "
            "HEAD:6379` on the others), pass its address, or leave --ray_address out for "
            "a local cluster; nothing was written or spent") from error


class RayBackend:
    """One Ray actor per shard (spread over the cluster's nodes where it has several).

    Actors get the driver's TensorFlow settings (``TF_ENABLE_ONEDNN_OPTS``,
    ``TF_CPP_MIN_LOG_LEVEL``: the convolution path, hence the numbers, depend on them)
    and this checkout on their ``PYTHONPATH``; on a multi-node cluster every node needs
    the checkout at the same path and its own copy of the dataset.
    """

    name = "ray"

    def __init__(self, options: ShardOptions):
        ray = _ray()
        self.ray = ray
        self.started_cluster = False
        if not ray.is_initialized():
            root = str(REPO_ROOT)
            env = {name: os.environ[name] for name in tf_env.CLI_DEFAULTS
                   if name in os.environ}
            env["PYTHONPATH"] = os.pathsep.join(
                [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
            kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env},
                                      "include_dashboard": False, "log_to_driver": True,
                                      "configure_logging": False}
            address = options.ray_address
            _check_reachable(address)
            try:
                if address is None and not os.environ.get("RAY_ADDRESS"):
                    ray.init(num_cpus=max(int(os.cpu_count() or 1),
                                          int(np.ceil(options.shards * options.cpus_per_shard))),
                             **kwargs)
                else:
                    ray.init(address=address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise ShardError(
                    f"cannot reach the Ray cluster at --ray_address "
                    f"{address or os.environ.get('RAY_ADDRESS')!r} ({error}); start it "
                    "with `ray start --head` on the head node (and `ray start --address "
                    "HEAD:6379` on the others), pass its address, or leave --ray_address "
                    "out for a local cluster") from error
            self.started_cluster = True
        self.actor_class = ray.remote(ShardWorker).options(
            num_cpus=options.cpus_per_shard, max_restarts=0, scheduling_strategy="SPREAD")

    def start(self, setup: ShardSetup):
        return self.actor_class.remote(setup)

    def submit(self, worker, method: str, *args):
        return getattr(worker, method).remote(*args)

    def gather(self, futures) -> list:
        return self.ray.get(list(futures))

    def stop(self, workers) -> None:
        for worker in workers:
            try:
                self.ray.kill(worker)
            except Exception:  # pylint: disable=broad-except  # already dead: nothing to stop
                pass
        if self.started_cluster:
            self.ray.shutdown()


BACKENDS = {"ray": RayBackend, "inprocess": InProcessBackend}


def _nbytes(value) -> int:
    """Bytes of the arrays in a (nested) call argument or result."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 8


class ShardedTeachers:
    """The driver's view of a sharded ensemble: :class:`dclens.datalens.teacher_group.TeacherGroup`'s
    ``train`` and ``vote``, summed over the shards, plus per-shard ``save`` / ``load``.

    ``traffic`` counts the array bytes sent to and received from the workers (a measure
    of what crosses the network per step; Ray's framing is not included).
    """

    def __init__(self, plan: list[Shard], workers: list, backend, *, draws, uniform_count: int,
                 teacher_chunk: int):
        self.plan, self.workers, self.backend = plan, workers, backend
        self.draws, self.uniform_count, self.teacher_chunk = draws, uniform_count, teacher_chunk
        self.traffic = {"sent": 0, "received": 0}
        self.infos: list[dict[str, Any]] = []      # where each shard runs (ShardWorker.info)

    @classmethod
    def launch(cls, options: ShardOptions, config, *, bank_seed: int, draws,
               uniform_count: int, ensemble: str = "fast",
               bank_ram_bytes: int | None = None) -> "ShardedTeachers":
        """Plans the shards, starts one worker each and waits until all hold their data."""
        if config.train.fake_rendering is FakeRendering.TEACHER_LABELS:
            raise ShardError("--fake_rendering teacher_labels renders one fake batch per "
                             "distinct label sequence of all teachers' real batches, so the "
                             "driver would need every teacher's labels (private data); a "
                             "sharded run needs --fake_rendering class_grid (the default)")
        if not isinstance(draws, SeededDraws):
            raise ShardError("a sharded run draws from its root seed (SeededDraws); replayed "
                             "draws (side-by-side parity) need the in-process teachers")
        plan = plan_shards(config.train.num_teachers, options.shards,
                           config.train.teacher_chunk)
        backend = BACKENDS[options.backend](options)
        setups = [ShardSetup(config=config.to_dict(), shard=shard,
                             total=config.train.num_teachers, bank_seed=bank_seed,
                             checkpoint_dir=shard_folder(options.checkpoint_dir, shard.index),
                             ensemble=ensemble, bank_ram_bytes=bank_ram_bytes)
                  for shard in plan]
        workers = [backend.start(setup) for setup in setups]
        teachers = cls(plan, workers, backend, draws=draws, uniform_count=uniform_count,
                       teacher_chunk=config.train.teacher_chunk)
        try:
            teachers.infos = teachers._all("info", lambda shard: ())
        except ShardError:
            backend.stop(workers)
            raise
        return teachers

    # ------------------------------------------------------------------ calls
    def _keys(self, shard: Shard, step: int, round_index: int) -> dict[int, np.ndarray]:
        if not self.uniform_count:
            return {}
        return {first: self.draws.sign_key(step, round_index, first)
                for first in range(shard.first, shard.stop, self.teacher_chunk)}

    def _all(self, method: str, arguments: Callable[[Shard], tuple]) -> list:
        """Calls ``method`` on every worker at once; the results in shard order."""
        futures = []
        for shard, worker in zip(self.plan, self.workers):
            args = arguments(shard)
            self.traffic["sent"] += _nbytes(args)
            futures.append(self.backend.submit(worker, method, *args))
        try:
            results = self.backend.gather(futures)
        except ShardError:
            raise
        except Exception as error:  # pylint: disable=broad-except
            raise ShardError(
                f"a shard worker failed in {method!r}: {type(error).__name__}: {error}. "
                "Nothing of this round was released and every spend so far is in the "
                "ledger; run the same command again to resume from the last checkpoint "
                "(a node without the dataset: put the files where the message above says, "
                "on every node)") from error
        self.traffic["received"] += _nbytes(results)
        return results

    @staticmethod
    def _sum(votes: list[np.ndarray]):

        total = votes[0].copy()
        for part in votes[1:]:
            total += part
        return tf.constant(total)

    def train(self, *, step: int, num_steps: int, columns: slice, chunk_fakes,
              query=None):
        """As :meth:`TeacherGroup.train`, except that the losses are one value, the mean
        over all teachers (per-teacher losses stay in the actors): ([mean loss], summed
        votes or None)."""

        if not isinstance(chunk_fakes, ClassGridFakes):
            raise ShardError("a sharded run sends the class grid of fakes to its workers; "
                             "use --fake_rendering class_grid")
        grid = np.asarray(chunk_fakes.grid)
        sent_query = None if query is None else (np.asarray(query[0]), np.asarray(query[1]))
        results = self._all("train", lambda shard: (
            step, num_steps, (columns.start, columns.stop), grid, sent_query,
            self._keys(shard, step, 0)))
        mean = sum(r[0] for r in results) / sum(r[1] for r in results)
        votes = None if query is None else self._sum([r[2] for r in results])
        return np.array([mean]), votes

    def vote(self, images, labels, *, step: int, round_index: int):
        """Summed votes of all shards' teachers (int32 [B, D])."""
        images, labels = np.asarray(images), np.asarray(labels)
        return self._sum(self._all("vote", lambda shard: (
            images, labels, step, round_index, self._keys(shard, step, round_index))))

    def save(self, step: int) -> list[str]:
        """Every shard writes its checkpoint ``step``; returns their paths."""
        return self._all("save", lambda shard: (step,))

    def load(self, step: int) -> None:
        self._all("load", lambda shard: (step,))

    def close(self) -> None:
        self.backend.stop(self.workers)


def launcher(options: ShardOptions, *, ensemble: str = "fast",
             bank_ram_bytes: int | None = None) -> Callable[[Any], "ShardedTeachers"]:
    """``launch(lens)`` for :class:`dclens.datalens.train.DataLens`'s ``launch_teachers``:
    starts the shard workers for that run (its config, root-seed keyed bank seed and
    draws, its mechanism's uniform count)."""
    def launch(lens) -> ShardedTeachers:
        return ShardedTeachers.launch(
            options, lens.config, bank_seed=lens.seeds.integer(Stream.TEACHER_INIT),
            draws=lens.draws, uniform_count=lens.topagg.uniform_count(lens.shape.dim),
            ensemble=ensemble, bank_ram_bytes=bank_ram_bytes)
    return launch
