"""Whole runs side by side: the authors' TF1 DataLens and dclens, each trained from its own
seed to the end of one budget, at one configuration, then sampled.

The lockstep harness (:mod:`dclens.parity.side_by_side`) shows that one dclens step equals
the authors' step given the same state and draws.  Free-running, float32 round-off separates
the two trajectories within a few steps, so whether the two *end up* in the same place is a
question about the distribution of outcomes over seeds: many independent runs per side,
compared by their evaluations (:mod:`dclens.parity.whole_run_study`).

One run of a side (:func:`run_authors_whole`, :func:`run_dclens_whole`):

* **Data**: the class-balanced subset of the real Fashion-MNIST training set
  (:func:`dclens.parity.config.balanced_subset`), split by the authors'
  ``evenly_partition_dataset``; dclens gets the same partitions (record indices).
* **Their side** is their unchanged ``DCGAN.train_together`` (loaded through
  :mod:`dclens.parity.tf1_compat`, their own vote functions), with their own initialisers
  under a TF graph seed and their numpy global seed set to the run's seed (their Fashion-MNIST
  loader, which would fix it to 307, is replaced by the shared subset).  It stops as their
  code stops: at the first step whose epsilon (their RDP counter, their conversion) would
  exceed ``max_eps``, it generates its 100,000 samples, writes them as their ten pickles and
  exits.  Observed, not changed: each step's printed losses, their ``aggregate_results``
  (the share of coordinates that passed), and the teachers' loss after their training
  (:meth:`_TheirObservations.teacher_loss`, an extra evaluation whose time is subtracted from
  the step's).
* **dclens' side** is a :class:`dclens.datalens.train.DataLens` with fresh, seeded draws and
  the default (fast) teacher ensemble, the authors' per-teacher fake batches
  (``fake_rendering=teacher_labels``), run while its ledger allows one more step, then sampled
  with batches of B (as their ``gen_data``).

Both write ``samples.npz`` (the first ``samples`` samples) and the authors' pickle layout
(their own pickles on their side), and ``run.json``: the per-step curves (the share of
coordinates that passed the threshold, the generator's loss before its update, the mean over
teachers of each teacher's loss on its step batch after the step's training), epsilon, and
the seconds per generator step.  These runs draw fresh noise on both sides: their epsilons are
real and equal.  Nothing is replayed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import math
import os
import re
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from dclens import data
from dclens.common import export, machine, provenance, reporting
from dclens.datalens import config as cfg
from dclens.datalens.train import DataLens
from dclens.evaluation import synthetic_input
from dclens.experiments import paper_rows
from dclens.parity import tf1_compat
from dclens.parity.authors_side import build_their_dcgan, their_flags, their_partitions
from dclens.parity.config import SideBySideConfig, SideBySideError, balanced_subset
from dclens.parity.our_side import teacher_loss_on_batch
from dclens.privacy import accounting

#: The two sides of a study, in the order each run index trains them.
SIDES = ("authors", "dclens")

#: What a side's ``run.json`` holds per generator step.
CURVES = ("pass_fraction", "generator_loss", "teacher_loss", "epsilon", "seconds")


@dataclasses.dataclass(frozen=True)
class WholeRunConfig:
    """One configuration for both sides: ``lockstep`` (the harness' settings in the authors'
    flag names; its ``steps`` are the steps the budget allows), ``max_eps`` (both sides stop
    there) and ``samples`` (written to ``samples.npz`` and evaluated)."""

    lockstep: SideBySideConfig
    max_eps: float
    samples: int = 20_000

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_eps) and self.max_eps > 0):
            raise SideBySideError(f"max_eps must be a finite number > 0, got {self.max_eps!r}")
        if not isinstance(self.samples, int) or self.samples < 10:
            raise SideBySideError(f"samples must be an integer >= 10, got {self.samples!r}")
        if self.samples > 100_000:
            raise SideBySideError(f"samples must be <= 100000 (the authors' code writes "
                                  f"100000), got {self.samples}")
        if self.lockstep.batch != self.lockstep.records:
            raise SideBySideError(
                f"whole runs take one batch per partition per step (their epochs are then "
                f"steps): give batch_size = records, got {self.lockstep.batch_size} and "
                f"{self.lockstep.records}")
        planned = planned_steps(self.lockstep, self.max_eps)
        if planned < 1:
            raise SideBySideError(f"max_eps {self.max_eps:g} allows no step at sigma "
                                  f"{self.lockstep.sigma:g}; raise max_eps or sigma")
        if planned != self.lockstep.steps:
            raise SideBySideError(f"max_eps {self.max_eps:g} allows {planned} steps, the "
                                  f"configuration says {self.lockstep.steps}")

    @classmethod
    def with_budget(cls, max_eps: float, samples: int = 20_000, **settings) -> "WholeRunConfig":
        """The configuration whose ``steps`` are those ``max_eps`` allows."""
        probe = SideBySideConfig(**{**settings, "steps": 1})
        steps = planned_steps(probe, max_eps)
        if steps < 1:
            raise SideBySideError(f"max_eps {max_eps:g} allows no step at sigma "
                                  f"{probe.sigma:g}; raise max_eps or sigma")
        return cls(dataclasses.replace(probe, steps=steps), float(max_eps), samples)

    @classmethod
    def noise_matched(cls, teachers: int, *, eps: int = 1, records: int = 15,
                      samples: int = 20_000, data_dir: str | None = None) -> "WholeRunConfig":
        """The paper's Fashion-MNIST configuration at ``eps`` with ``teachers`` instead of
        its 4000: sigma x teachers / 4000 (the paper's noise relative to the vote sum), and
        the budget under which TopAgg runs the paper's steps
        (:func:`dclens.experiments.paper_rows.matched_budget`), as the analysis tables'
        noise-matched reduced scale.  Its epsilon is NOT the paper's."""
        paper = cfg.paper_preset("fashion_mnist", eps)
        sigma = paper.topagg.sigma * teachers / paper.train.num_teachers
        return cls.with_budget(
            paper_rows.matched_budget("fashion_mnist", eps, sigma), samples,
            teachers=teachers, records=records, batch_size=records, topk=paper.topagg.topk,
            sigma=sigma, thresh=paper.topagg.thresh, d_step=paper.train.d_step,
            pretrain_teacher=paper.train.pretrain_teacher, max_grad=paper.topagg.max_grad,
            stochastic=paper.topagg.method is cfg.Aggregation.TOPK_STOCHASTIC_SIGN,
            z_dim=paper.train.z_dim, learning_rate=paper.train.learning_rate,
            beta1=paper.train.beta1, delta=paper.budget.delta, data_dir=data_dir)

    def dclens_config(self) -> cfg.DataLensConfig:
        """dclens' settings: the lockstep ones, stopped by ``max_eps`` (one epoch more than
        the budget's steps, so the budget is what stops the run)."""
        base = self.lockstep.dclens_config()
        return base.replace(train={"epochs": self.their_epochs},
                            budget={"max_eps": self.max_eps})

    @property
    def their_epochs(self) -> int:
        """Their ``--epoch``: one step per epoch, one more than the budget allows, so their
        budget check is what stops their loop."""
        return self.lockstep.steps + 1

    def to_dict(self) -> dict:
        return {"lockstep": dataclasses.asdict(self.lockstep), "max_eps": self.max_eps,
                "samples": self.samples, "steps": self.lockstep.steps}


def planned_steps(config: SideBySideConfig, max_eps: float) -> int:
    """Generator steps TopAgg with ``config``'s sigma and k runs within ``max_eps`` (B queries
    per step, classic conversion at orders 1..200: the authors' accounting and dclens')."""
    return accounting.max_steps_within(
        sigma=config.sigma, topk=config.topk, queries_per_step=config.batch, max_eps=max_eps,
        delta=config.delta, conversion=accounting.Conversion.CLASSIC,
        orders=accounting.classic_orders(200))


def run_seed(root: int, side: str, index: int) -> int:
    """The seed of run ``index`` of ``side``: independent across runs and sides."""
    state = np.random.SeedSequence([root, SIDES.index(side), index]).generate_state(1)
    return int(state[0] >> 1)


@dataclasses.dataclass
class SharedData:
    """The class-balanced subset both sides train on, and the authors' partition of it."""

    dataset: data.LabeledImages
    one_hot: np.ndarray
    partitions: np.ndarray

    @classmethod
    def load(cls, code: tf1_compat.AuthorsCode, config: SideBySideConfig) -> "SharedData":
        full = data.load_dataset("fashion_mnist", config.data_dir)
        subset = balanced_subset(full.labels, config.teachers * config.records)
        labels = full.labels[subset]
        one_hot = np.eye(10, dtype=np.float32)[labels]
        dataset = data.LabeledImages(full.images[subset], labels, full.spec,
                                     f"{full.source} (class-balanced subset)")
        return cls(dataset, one_hot, their_partitions(code, labels, one_hot, config.teachers))


# --------------------------------------------------------------------------- their side
#: Their per-step line (model.py's train_together).
_THEIR_STEP = re.compile(
    r"Epoch: \[\s*(\d+)/\s*\d+\] \[\s*\d+/\s*\d+\] time: ([0-9.]+), d_loss: ([-0-9.einf]+), "
    r"g_loss: ([-0-9.einf]+), g_loss_before: ([-0-9.einf]+), dp_eps: ([-0-9.einf]+)")


class _TheirObservations(io.TextIOBase):
    """Their stdout (kept, as their log) and what their loop computes, per step.

    Their step ends with the line :data:`_THEIR_STEP`; its ``time`` is seconds since their
    loop started, so a step's seconds are the difference of two lines less the time spent in
    :meth:`teacher_loss` (the observer's own evaluation) during that step."""

    def __init__(self, log_path: str, echo: Callable[[str], None]):
        self.log = open(log_path, "w", buffering=1)      # line-buffered: follow it live
        self.echo = echo
        self.buffer = ""
        self.steps: list[dict[str, float]] = []
        self.passed: list[float] = []
        self.teacher_losses: list[float] = []
        self.observer_seconds = 0.0
        self.last_time = 0.0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        self.buffer += text
        *lines, self.buffer = self.buffer.split("\n")
        for line in lines:
            match = _THEIR_STEP.search(line)
            if match:
                self._step_ended(match)
        return len(text)

    def _step_ended(self, match: re.Match) -> None:
        loop_time = float(match.group(2))
        step = {"pass_fraction": float(np.mean(self.passed)) if self.passed else math.nan,
                "generator_loss": float(match.group(5)),
                "teacher_loss": self.teacher_losses[-1] if self.teacher_losses else math.nan,
                "epsilon": float(match.group(6)),
                "seconds": loop_time - self.last_time - self.observer_seconds}
        self.steps.append(step)
        self.last_time, self.observer_seconds, self.passed = loop_time, 0.0, []
        self.echo(_progress_line("authors", len(self.steps), step))

    def aggregated(self, update: np.ndarray) -> None:
        self.passed.append(float(np.mean(np.asarray(update) != 0)))

    def close(self) -> None:
        self.log.close()
        super().close()


def _progress_line(side: str, step: int, values: dict[str, float]) -> str:
    return (f"{side} step {step}: eps {values['epsilon']:.4f}, passed "
            f"{values['pass_fraction']:.3f}, g_loss {values['generator_loss']:.4g}, "
            f"teacher loss {values['teacher_loss']:.4f}, {values['seconds']:.2f} s")


class _TheirHooks:
    """Wraps their ``save_d`` (after a step's teacher training: the teachers' loss) and
    ``aggregate_results`` (each image's released update) to observe, not change, them."""

    def __init__(self, dcgan, session, config: SideBySideConfig,
                 observations: _TheirObservations):
        self.dcgan, self.session, self.config = dcgan, session, config
        self.observations = observations
        self.latent: np.ndarray | None = None
        self.started = False
        self._save_d, self._aggregate = dcgan.save_d, dcgan.aggregate_results
        dcgan.save_d, dcgan.aggregate_results = self.save_d, self.aggregate_results

    def save_d(self, checkpoint_dir, step, teacher_batch):
        if self.started:
            self.teacher_loss()
        self.started = True             # the first save precedes their loop
        return self._save_d(checkpoint_dir, step, teacher_batch)

    def aggregate_results(self, output_list, *args, **kwargs):
        result = self._aggregate(output_list, *args, **kwargs)
        self.observations.aggregated(result[0])
        return result

    def teacher_loss(self) -> None:
        """Mean over teachers of each teacher's loss on its step batch (real records and
        its fakes G(z, its labels)) after the step's training.  One step per epoch: the batch
        is each partition's first B records."""
        started = time.perf_counter()
        dcgan, rows = self.dcgan, range(self.config.batch)
        losses = [self.session.run(dcgan.teachers_list[i]["d_loss"], feed_dict={
            dcgan.inputs: dcgan.train_data_list[i][rows], dcgan.z: self.latent,
            dcgan.y: dcgan.train_label_list[i][rows]}) for i in range(self.config.teachers)]
        self.observations.teacher_losses.append(float(np.mean(losses)))
        self.observations.observer_seconds += time.perf_counter() - started

    @contextlib.contextmanager
    def latent_recorded(self):
        """Keeps the last z their loop drew ([B, z_dim] from ``np.random.uniform``)."""
        original = np.random.uniform
        shape = (self.config.batch, self.config.z_dim)

        def uniform(low=0.0, high=1.0, size=None):
            value = original(low, high, size)
            if size is not None and tuple(np.atleast_1d(size)) == shape:
                self.latent = np.asarray(value, np.float32)
            return value

        np.random.uniform = uniform
        try:
            yield
        finally:
            np.random.uniform = original


def their_session_config() -> tf.compat.v1.ConfigProto:
    """Their session without grappler's graph rewrites.

    Their graph holds every teacher (T discriminators, each with its own optimizer, loss
    and image-gradient ops), and their loop fetches a different set of ops for each
    teacher: about 4T distinct ``session.run`` signatures, each of which makes TensorFlow
    optimise the whole graph once with grappler.  At 200 teachers that first step had not
    finished after 35 minutes on a 2-core CPU (mostly in ``MetaOptimizer::OptimizeGraph``).
    Without grappler their graph runs the ops it defines, in its order: the same
    computation, without the rewrites (fusions, constant folding) that may change float32
    round-off.  Their own ``main.py`` sets only GPU memory growth.
    """
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def run_authors_whole(repo: str | os.PathLike, config: WholeRunConfig, seed: int,
                      out_dir: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """One whole run of the authors' ``train_together``; writes ``out_dir``'s samples and
    log; returns the run's record (see the module docstring)."""
    started = time.perf_counter()
    side = config.lockstep
    os.makedirs(out_dir, exist_ok=True)
    terminal = sys.stdout               # their prints go to authors.log; progress here

    def echo(line: str) -> None:
        with contextlib.redirect_stdout(terminal):
            log(line)

    observations = _TheirObservations(os.path.join(out_dir, "authors.log"), echo)
    with contextlib.closing(observations), tf1_compat.load_authors_code(repo) as code, \
            tempfile.TemporaryDirectory(prefix="dclens-whole-run-") as workdir:
        shared = SharedData.load(code, side)
        flags = their_flags(code, side, workdir)
        flags.max_eps, flags.epoch = config.max_eps, config.their_epochs
        graph = tf.Graph()
        with graph.as_default(), contextlib.redirect_stdout(observations):
            tf.compat.v1.set_random_seed(seed)
            session = tf.compat.v1.Session(graph=graph, config=their_session_config())
            try:
                dcgan = build_their_dcgan(code, flags, session, workdir,
                                          shared.dataset.images, shared.one_hot)
                hooks = _TheirHooks(dcgan, session, side, observations)
                built = time.perf_counter() - started
                np.random.seed(seed % 2 ** 32)
                stopped_by_budget = False
                with session.as_default(), hooks.latent_recorded():
                    try:
                        dcgan.train_together(flags)
                    except SystemExit:
                        stopped_by_budget = True
            finally:
                session.close()
        observations.close()           # authors.log complete before its pickles are read
        if not stopped_by_budget:
            raise SideBySideError(f"the authors' loop ended its {config.their_epochs} epochs "
                                  f"without reaching max_eps {config.max_eps}")
        pickles = sorted(glob.glob(os.path.join(workdir, "eps-*.data-*.pkl")),
                         key=lambda path: int(path.rsplit("-", 1)[1].split(".")[0]))
        theirs = _their_first_samples(pickles, config.samples, out_dir)
        export.write_samples_npz(os.path.join(out_dir, "samples.npz"), theirs.images,
                                 theirs.labels)
    return _record("authors", config, seed, observations.steps, started, built,
                   dcgan_epsilon=[float(e) for e in dcgan.dp_eps_list])


# --------------------------------------------------------------------------- dclens' side
class _OurObservations:
    """dclens' round observer: the teachers' loss after their training (before the
    student's update), timed so that the step's seconds exclude it."""

    def __init__(self, lens_ref: list):
        self.lens_ref = lens_ref
        self.teacher_loss = math.nan
        self.seconds = 0.0

    def round_released(self, step, round_index, images, one_hot, vote_sum, result):
        if round_index == 0:
            started = time.perf_counter()
            self.teacher_loss = float(np.mean(teacher_loss_on_batch(self.lens_ref[0], step)))
            self.seconds += time.perf_counter() - started


def run_dclens_whole(repo: str | os.PathLike, config: WholeRunConfig, seed: int,
                     out_dir: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """One whole dclens run at ``config`` on the authors' partition of the shared data;
    writes ``out_dir``'s samples; returns the run's record."""
    started = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    with tf1_compat.load_authors_code(repo) as code:
        shared = SharedData.load(code, config.lockstep)
    lens_ref: list = []
    lens = DataLens(config.dclens_config(), shared.dataset, root_seed=seed,
                    partitions=shared.partitions)
    lens_ref.append(lens)
    observer = _OurObservations(lens_ref)
    lens.observer = observer
    built = time.perf_counter() - started
    steps = []
    while lens.within_budget():
        observer.seconds = 0.0
        record = lens.train_step()
        step = {"pass_fraction": record.pass_fraction, "generator_loss": record.student_loss,
                "teacher_loss": observer.teacher_loss, "epsilon": record.epsilon,
                "seconds": record.seconds - observer.seconds}
        steps.append(step)
        log(_progress_line("dclens", len(steps), step))
    images, labels = lens.sample(config.samples, seed_path=(0,))
    export.write_samples_npz(os.path.join(out_dir, "samples.npz"), images, labels)
    export.write_authors_pickles(out_dir, images, labels, num_classes=10,
                                 epsilon=steps[-1]["epsilon"],
                                 num_files=max(1, math.ceil(len(images) / 10_000)))
    return _record("dclens", config, seed, steps, started, built)


# --------------------------------------------------------------------------- both
def _their_first_samples(pickles: list[str], samples: int, out_dir: str
                         ) -> data.LabeledImages:
    """Copies their pickles, in order, into ``out_dir`` until they hold ``samples`` rows;
    those rows (each file read once)."""
    if not pickles:
        raise SideBySideError("the authors' run stopped by its budget but wrote no pickles")
    spec = data.dataset_spec("fashion_mnist")
    parts, rows = [], 0
    for path in pickles:
        if rows >= samples:
            break
        target = reporting.copy_once(path, os.path.join(out_dir, os.path.basename(path)),
                                     replace=True)
        parts.append(synthetic_input.read_authors_rows([target], spec))
        rows += len(parts[-1].labels)
    if rows < samples:
        raise SideBySideError(f"the authors' pickles hold {rows} samples, fewer than the "
                              f"{samples} asked for")
    return data.LabeledImages(np.concatenate([p.images for p in parts])[:samples],
                              np.concatenate([p.labels for p in parts])[:samples], spec,
                              parts[0].source)


def _record(side: str, config: WholeRunConfig, seed: int, steps: list[dict], started: float,
            built: float, **extra) -> dict[str, Any]:
    if len(steps) != config.lockstep.steps:
        raise SideBySideError(f"{side} ran {len(steps)} steps; the budget allows "
                              f"{config.lockstep.steps}")
    seconds = [s["seconds"] for s in steps]
    return {"side": side, "seed": seed, "config": config.to_dict(),
            "curves": {name: [s[name] for s in steps] for name in CURVES},
            "epsilon": steps[-1]["epsilon"], "steps": len(steps),
            "seconds_per_step": float(np.mean(seconds)),
            "seconds_per_step_after_first": float(np.mean(seconds[1:])) if len(seconds) > 1
            else float(seconds[0]),
            "setup_seconds": built, "wall_seconds": time.perf_counter() - started,
            "machine": {"cpu": machine.cpu_model_name(),
                        "vector_extensions": machine.cpu_vector_extensions(),
                        "onednn": machine.onednn_enabled()},
            "provenance": provenance.provenance(), **extra}


RUNNERS = {"authors": run_authors_whole, "dclens": run_dclens_whole}
