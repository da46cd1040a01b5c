"""Step-for-step parity of dclens with the authors' TF1 DataLens code.

:func:`run_side_by_side` builds the authors' ``DCGAN`` (their ``model.py``, loaded by
:mod:`dclens.parity.tf1_compat`) and a :class:`dclens.datalens.train.DataLens` on one small shared
configuration, gives both **the same everything**, runs their ``train_together`` for a
few generator steps and then dclens for as many, and compares them step by step.

What is shared, and how:

* **Data and partitions**: a class-balanced subset of the real Fashion-MNIST training set
  (``teachers * records`` images, the same number of each class, in data-set order), fed to
  their ``DCGAN`` in place of its file loader; their ``evenly_partition_dataset`` splits it
  (with equal class counts it never wraps, so the partitions are disjoint) and the same
  partitions, as record indices, go to dclens (``DataLens(partitions=...)``).
* **Initial weights**: dclens' initial teachers and generator are copied into their
  variables by name right after their ``global_variables_initializer`` (:data:`TEACHER_NAMES`,
  :data:`GENERATOR_NAMES`).
* **Random draws**: their code draws everything from numpy's global RNG; while it runs,
  ``np.random.uniform`` (z), ``randint`` (query labels), ``rand`` (stochastic-sign uniforms,
  one per coordinate; made float32-exact) and ``normal`` (the DP noise: their
  ``np.random.normal(votes, sigma)`` returns votes + sigma * n with n standard normal,
  float32-exact, from the harness' own generator) are recorded, and dclens replays them
  through :class:`ReplayDraws` (the documented :mod:`dclens.datalens.draws` hook; the per-coordinate
  uniforms are restricted to dclens' top-k with :func:`dclens.datalens.topagg.uniforms_in_topk_order`).
* **The fake batch of the teachers' step**: dclens runs with the authors' rendering
  (``fake_rendering=teacher_labels``).

Compared after every generator step (their values are read at the same points of their
loop: after the teachers' ``save_d``, in ``aggregate_results``, after the generator's
optimizer step): each teacher's discriminator loss on its batch after its updates, every
teacher weight, the image gradients, the vote sums (their value is the mean their
``np.random.normal`` receives), the noisy thresholded update, every generator weight and
epsilon (their ``compute_eps_from_delta`` over their RDP counter vs our ledger, classic
conversion).  :data:`TOLERANCES` states the float32 tolerances; the report says for every
quantity whether it is within them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import tempfile
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from dclens import data
from dclens.datalens import topagg
from dclens.datalens.config import (Aggregation, BudgetConfig, DataLensConfig, FakeRendering,
                           TopAggConfig, TrainConfig)
from dclens.parity import tf1_compat
from dclens.datalens.train import DataLens

#: dclens teacher weight name -> the authors' variable (inside ``teacher<i>/``).
TEACHER_NAMES = {
    "conv0/kernel": "d_h0_conv/w", "conv0/bias": "d_h0_conv/biases",
    "conv1/kernel": "d_h1_conv/w", "conv1/bias": "d_h1_conv/biases",
    "bn1/gamma": "d_bn1/gamma", "bn1/beta": "d_bn1/beta",
    "dense2/kernel": "d_h2_lin/Matrix", "dense2/bias": "d_h2_lin/bias",
    "bn2/gamma": "d_bn2/gamma", "bn2/beta": "d_bn2/beta",
    "dense3/kernel": "d_h3_lin/Matrix", "dense3/bias": "d_h3_lin/bias",
}
#: dclens generator (Keras layer, weight) -> the authors' variable (inside ``generator/``).
GENERATOR_NAMES = {
    ("g_h0_lin", "kernel"): "g_h0_lin/Matrix", ("g_h0_lin", "bias"): "g_h0_lin/bias",
    ("g_bn0", "gamma"): "g_bn0/gamma", ("g_bn0", "beta"): "g_bn0/beta",
    ("g_h1_lin", "kernel"): "g_h1_lin/Matrix", ("g_h1_lin", "bias"): "g_h1_lin/bias",
    ("g_bn1", "gamma"): "g_bn1/gamma", ("g_bn1", "beta"): "g_bn1/beta",
    ("g_h2_deconv", "kernel"): "g_h2/w", ("g_h2_deconv", "bias"): "g_h2/biases",
    ("g_bn2", "gamma"): "g_bn2/gamma", ("g_bn2", "beta"): "g_bn2/beta",
    ("g_h3_deconv", "kernel"): "g_h3/w", ("g_h3_deconv", "bias"): "g_h3/biases",
}
#: Biases followed by batch normalisation: their gradient is exactly zero in real
#: arithmetic (the normalisation removes any constant), so float32 round-off alone moves
#: them through Adam's normalised step, differently in each implementation.  They have no
#: effect on any output; they are reported but not held to a tolerance.
NORMALISED_AWAY = ("conv1/bias", "dense2/bias", "g_h0_lin/bias", "g_h1_lin/bias",
                   "g_h2_deconv/bias")

#: Float32 tolerances (each step starts both sides from the authors' state, so a step's
#: differences are that step's round-off):
#: * ``teacher_loss``, ``image_gradients``: max |ours - theirs| / max |theirs|; the image
#:   gradients are compared on the same (their trained) teacher weights -- the run's own
#:   image gradients inherit the training's round-off and are reported beside them;
#: * votes from the same gradients and uniforms, and the noisy update from the same vote
#:   sums and noise, must be equal;
#: * weights, in units of Adam's reach in the step (learning_rate x Adam steps, about the
#:   farthest Adam moves a weight): Adam's first steps from a zero state are close to sign
#:   steps, so the few coordinates whose gradient is mostly round-off (near-cancelling
#:   sums) may step the other way in the two implementations: up to 2 learning rates
#:   per Adam step, i.e. 2 reaches.  Held: at most ``adam_outlier_fraction`` of the
#:   weights differ by more than ``adam_outlier`` reach, and none by more than
#:   ``adam_max`` reaches (a wrong learning rate, moment or normalisation moves almost
#:   every weight; measured over 17 runs of the tests' 2-teacher config: 0.007 to 0.98
#:   reach in the pretrain step, with up to 0.3% of the weights beyond 0.01 reach, and 0
#:   in the ordinary steps);
#: * votes and the noisy update must be equal except where the teachers' top-k sets
#:   differ within the two implementations' measured gradient difference (a near tie at
#:   the k-th largest |g|; :func:`explain_vote_differences`);
#: * ``epsilon``: relative.
TOLERANCES = {
    "teacher_loss": 1e-4,
    "image_gradients": 1e-4,
    "adam_outlier": 0.01,
    "adam_outlier_fraction": 0.02,
    "adam_max": 2.0,
    "epsilon": 1e-9,
}


class SideBySideError(RuntimeError):
    """The side-by-side configuration cannot be run as given."""


@dataclasses.dataclass(frozen=True)
class SideBySideConfig:
    """The shared configuration (the authors' flag names where they have one).

    ``records`` per teacher; the batch is min(batch_size, records) and every generator step
    takes the next batch of each partition (with records <= batch_size, one step per epoch,
    so ``steps`` >= 2 covers the pretrain epoch and ordinary epochs).
    """

    teachers: int = 4
    records: int = 15
    steps: int = 5
    batch_size: int = 30
    topk: int = 50
    sigma: float = 40.0
    thresh: float = 0.5
    d_step: int = 2
    pretrain_teacher: int = 3
    max_grad: float = 1e-5
    stochastic: bool = True
    z_dim: int = 10
    learning_rate: float = 1e-3
    beta1: float = 0.5
    delta: float = 1e-5
    seed: int = 0
    data_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("teachers", "records", "steps", "batch_size", "topk", "d_step", "z_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SideBySideError(f"--{name} must be an integer >= 1, got {value!r}")
        if self.teachers * self.records % 10:
            raise SideBySideError(
                f"teachers x records = {self.teachers * self.records} must be a multiple of "
                f"the 10 classes, so that the authors' class-balanced partitioner gets equal "
                f"class counts and cannot wrap around (which would put a record in two "
                f"partitions); change --teachers or --records")
        if self.topk > 784:
            raise SideBySideError(f"--topk must be <= 784 (28x28x1), got {self.topk}")
        if not self.sigma > 0:
            raise SideBySideError(f"--sigma must be > 0, got {self.sigma!r}")

    @property
    def batch(self) -> int:
        return min(self.batch_size, self.records)

    @property
    def steps_per_epoch(self) -> int:
        return self.records // self.batch

    @property
    def epochs(self) -> int:
        return math.ceil(self.steps / self.steps_per_epoch)

    def dclens_config(self) -> DataLensConfig:
        method = (Aggregation.TOPK_STOCHASTIC_SIGN if self.stochastic
                  else Aggregation.TOPK_SIGN)
        return DataLensConfig(
            train=TrainConfig(dataset="fashion_mnist", num_teachers=self.teachers,
                              batch_size=self.batch_size, epochs=self.epochs,
                              d_step=self.d_step, pretrain_teacher=self.pretrain_teacher,
                              z_dim=self.z_dim, learning_rate=self.learning_rate,
                              beta1=self.beta1, teacher_chunk=self.teachers,
                              fake_rendering=FakeRendering.TEACHER_LABELS, seed=self.seed),
            topagg=TopAggConfig(topk=self.topk, sigma=float(self.sigma), thresh=self.thresh,
                                max_grad=self.max_grad, method=method),
            budget=BudgetConfig(max_eps=1e9, delta=self.delta))


# --------------------------------------------------------------------------- data
def balanced_subset(labels: np.ndarray, count: int, num_classes: int = 10) -> np.ndarray:
    """Indices of the first ``count / num_classes`` records of each class, in data order."""
    per_class = count // num_classes
    chosen = []
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)[:per_class]
        if members.size < per_class:
            raise SideBySideError(f"class {c} has only {members.size} records; need "
                                  f"{per_class}")
        chosen.append(members)
    return np.sort(np.concatenate(chosen))


# --------------------------------------------------------------------------- their draws
@dataclasses.dataclass
class TheirStep:
    """What the authors' code drew and computed in one generator step."""

    latent: np.ndarray | None = None
    query_labels: np.ndarray | None = None
    uniforms: list[np.ndarray] = dataclasses.field(default_factory=list)  # per image [T, D]
    noise: list[np.ndarray] = dataclasses.field(default_factory=list)     # per image [D]
    vote_sums: list[np.ndarray] = dataclasses.field(default_factory=list)  # per image [D]
    image_gradients: list[np.ndarray] = dataclasses.field(default_factory=list)  # [T, ...]
    updates: list[np.ndarray] = dataclasses.field(default_factory=list)   # per image
    teacher_weights: dict[str, np.ndarray] | None = None                  # name -> [T, ...]
    teacher_adam: dict[str, tuple[np.ndarray, np.ndarray]] | None = None   # name -> (m, v)
    teacher_loss: np.ndarray | None = None
    generator_weights: dict[str, np.ndarray] | None = None                # "layer/weight"
    generator_adam: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    generator_statistics: dict[str, np.ndarray] | None = None             # BN moving stats
    epsilon: float | None = None


class NumpyDrawRecorder:
    """Wraps numpy's global-RNG functions that the authors' loop calls, recording them.

    Recording starts with :meth:`start` (after their initialisation); each ``uniform`` draw
    of shape [B, z_dim] opens a new step, after ``step_ended`` is called on the previous
    one (call :meth:`finish` after their loop for the last).  ``rand`` returns float32-exact values and
    ``normal(loc, scale)`` returns loc + scale * n with n float32-exact standard normal
    draws of ``rng``, so dclens can replay them without rounding.
    """

    def __init__(self, rng: np.random.Generator, latent_shape: tuple[int, int],
                 step_ended: Callable[[TheirStep], None] = lambda step: None):
        self.rng = rng
        self.latent_shape = latent_shape
        self.step_ended = step_ended
        self.steps: list[TheirStep] = []
        self.active = False

    @property
    def current(self) -> TheirStep:
        if not self.steps:
            raise SideBySideError("the authors' loop drew before its first step")
        return self.steps[-1]

    def start(self) -> None:
        self.active = True

    def finish(self) -> None:
        if self.steps:
            self.step_ended(self.steps[-1])

    @contextlib.contextmanager
    def installed(self):
        random = np.random
        originals = {name: getattr(random, name) for name in ("uniform", "randint", "rand",
                                                              "normal")}

        def uniform(low=0.0, high=1.0, size=None):
            value = originals["uniform"](low, high, size)
            if self.active and tuple(np.shape(value)) == self.latent_shape:
                if self.steps:
                    self.step_ended(self.steps[-1])
                self.steps.append(TheirStep(latent=np.asarray(value, np.float32)))
            return value

        def randint(*args, **kwargs):
            value = originals["randint"](*args, **kwargs)
            if self.active:
                self.current.query_labels = np.asarray(value)
            return value

        def rand(*shape):
            value = np.floor(originals["rand"](*shape) * 2.0 ** 24) / 2.0 ** 24
            if self.active:
                self.current.uniforms.append(value.astype(np.float32))
            return value

        def normal(loc=0.0, scale=1.0, size=None):
            if not self.active:
                return originals["normal"](loc, scale, size)
            loc = np.asarray(loc)
            standard = self.rng.standard_normal(loc.shape).astype(np.float32)
            self.current.vote_sums.append(loc.copy())
            self.current.noise.append(standard)
            return loc + scale * standard.astype(np.float64)

        patched = {"uniform": uniform, "randint": randint, "rand": rand, "normal": normal}
        for name, function in patched.items():
            setattr(random, name, function)
        try:
            yield self
        finally:
            for name, function in originals.items():
                setattr(random, name, function)


class ReplayDraws:
    """dclens' :class:`dclens.datalens.draws.Draws` that replays the authors' recorded draws."""

    def __init__(self, steps: list[TheirStep]):
        self.steps = steps

    def _step(self, step: int) -> TheirStep:
        if step >= len(self.steps):
            raise SideBySideError(f"dclens asked for step {step}'s draws but the authors' "
                                  f"run recorded {len(self.steps)} steps")
        return self.steps[step]

    def latent(self, step: int, shape: tuple[int, int]) -> tf.Tensor:
        return tf.constant(self._step(step).latent.reshape(shape))

    def query_labels(self, step, round_index, batch, num_classes) -> tf.Tensor:
        return tf.constant(self._step(step).query_labels.astype(np.int32))

    def sign_uniforms(self, step, round_index, first_teacher, grads, count) -> tf.Tensor:
        per_image = self._step(step).uniforms                     # B x [T_all, D]
        stacked = np.stack(per_image, axis=1)                     # [T_all, B, D]
        rows = stacked[first_teacher:first_teacher + grads.shape[0]]
        return topagg.uniforms_in_topk_order(grads, tf.constant(rows), count)

    def dp_noise(self, attempt, step, round_index, shape) -> tf.Tensor:
        return tf.constant(np.stack(self._step(step).noise).reshape(shape))


# --------------------------------------------------------------------------- their run
def _their_flags(code: tf1_compat.AuthorsCode, config: SideBySideConfig,
                 workdir: str) -> Any:
    flags = code.flags
    overrides = dict(
        dataset="fashion_mnist", train=True, pretrain=False, epoch=config.epochs,
        batch_size=config.batch_size, batch_teachers=config.teachers, teachers_batch=1,
        topk=config.topk, sigma=float(config.sigma), thresh=config.thresh,
        max_eps=1e9, delta=config.delta, d_step=config.d_step, g_step=1,
        pretrain_teacher=config.pretrain_teacher, max_grad=config.max_grad,
        stochastic=config.stochastic, signsgd=True, z_dim=config.z_dim, y_dim=10,
        learning_rate=config.learning_rate, beta1=config.beta1, shuffle=True,
        checkpoint_dir=workdir, data_dir=workdir, non_private=False, orders=200)
    unknown = sorted(set(overrides) - set(vars(flags)))
    if unknown:
        raise SideBySideError(f"the authors' main.py has no flags {unknown}")
    for name, value in overrides.items():
        setattr(flags, name, value)
    return flags


def _teacher_variable(i: int, name: str) -> str:
    return f"teacher{i}/{TEACHER_NAMES[name]}:0"


def run_authors(code: tf1_compat.AuthorsCode, config: SideBySideConfig,
                images: np.ndarray, one_hot: np.ndarray, lens: DataLens, workdir: str,
                log: io.TextIOBase) -> list[TheirStep]:
    """Their ``train_together`` for ``config.steps`` generator steps, recording every step.

    ``images`` float32 [n, 28, 28, 1], ``one_hot`` [n, 10]: the shared data; ``lens``
    provides the initial weights (copied into their variables).
    """
    flags = _their_flags(code, config, workdir)
    model = code.model

    class SharedDataDCGAN(model.DCGAN):
        """Their DCGAN reading the shared subset instead of its IDX files."""

        def load_fashion_mnist(self):
            return images.astype(np.float64), one_hot.astype(np.float64)

    recorder = NumpyDrawRecorder(np.random.default_rng(config.seed + 1),
                                 (config.batch, config.z_dim),
                                 step_ended=lambda step: generator_snapshot(step))
    # dclens' initial weights, read eagerly (inside their graph, tensors are symbolic).
    split = lens.ensemble.layout.split(tf.constant(lens.bank.weights))
    initial_teachers = {name: split[name].numpy() for name in TEACHER_NAMES}
    initial_generator = {theirs: getattr(lens.generator.get_layer(layer), weight).numpy()
                         for (layer, weight), theirs in GENERATOR_NAMES.items()}
    graph = tf.Graph()
    with graph.as_default(), contextlib.redirect_stdout(log):
        session = tf.compat.v1.Session(graph=graph)
        dcgan = SharedDataDCGAN(
            session, batch_size=flags.batch_size, sample_num=flags.batch_size,
            y_dim=flags.y_dim, z_dim=flags.z_dim, dataset_name=flags.dataset,
            crop=flags.crop, checkpoint_dir=workdir, sample_dir=flags.sample_dir,
            data_dir=workdir, batch_teachers=flags.batch_teachers, pca=flags.pca,
            random_proj=flags.random_proj, thresh=flags.thresh, dp_delta=flags.delta,
            pca_dim=flags.pca_dim, teachers_batch=flags.teachers_batch,
            teacher_dir=os.path.join(workdir, flags.teacher_dir),
            generator_dir=flags.generator_dir, non_private=flags.non_private,
            input_height=flags.input_height, input_width=flags.input_width,
            output_height=flags.output_height, output_width=flags.output_width,
            wgan=flags.wgan, small=flags.small, config=flags)
        variables = {v.name: v for v in tf.compat.v1.global_variables()}

        def initial_assignments() -> None:
            for i in range(config.teachers):
                for name in TEACHER_NAMES:
                    _assign(session, variables, _teacher_variable(i, name),
                            initial_teachers[name][i])
            for theirs, value in initial_generator.items():
                _assign(session, variables, f"generator/{theirs}:0", value)

        code.after_initializer = initial_assignments

        def read(name: str) -> np.ndarray:
            """The value of their variable ``name`` (Adam's slots exist once their loop
            has built its optimizers, hence the lookup at every read)."""
            if name not in variables:
                variables.update({v.name: v for v in graph.get_collection(
                    tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)})
            return np.array(session.run(variables[name]), copy=True)

        def slots(name: str) -> tuple[np.ndarray, np.ndarray]:
            """Adam's (m, v) of variable ``name`` (TF1 slots ``<var>/Adam``, ``/Adam_1``)."""
            stem = name[:-len(":0")]
            return read(f"{stem}/Adam:0"), read(f"{stem}/Adam_1:0")

        def teacher_snapshot() -> None:
            step = recorder.current
            step.teacher_weights = {
                name: np.stack([read(_teacher_variable(i, name))
                                for i in range(config.teachers)])
                for name in TEACHER_NAMES}
            step.teacher_adam = {
                name: tuple(np.stack(moments) for moments in zip(*[
                    slots(_teacher_variable(i, name)) for i in range(config.teachers)]))
                for name in TEACHER_NAMES}
            slot = (len(recorder.steps) - 1) % config.steps_per_epoch
            rows = range(slot * config.batch, (slot + 1) * config.batch)
            step.teacher_loss = np.array([
                session.run(dcgan.teachers_list[i]["d_loss"], feed_dict={
                    dcgan.inputs: dcgan.train_data_list[i][rows], dcgan.z: step.latent,
                    dcgan.y: dcgan.train_label_list[i][rows]})
                for i in range(config.teachers)])

        original_save_d = dcgan.save_d

        def save_d(checkpoint_dir, step, teacher_batch):
            if recorder.active:
                teacher_snapshot()
            else:
                recorder.start()          # the save right after their initialisation
            return original_save_d(checkpoint_dir, step, teacher_batch)

        original_aggregate = dcgan.aggregate_results

        def aggregate_results(output_list, *args, **kwargs):
            recorder.current.image_gradients.append(np.stack(output_list))
            result = original_aggregate(output_list, *args, **kwargs)
            recorder.current.updates.append(np.asarray(result[0]))
            return result

        generator_variables = {name: variables[f"generator/{theirs}:0"]
                               for name, theirs in GENERATOR_NAMES.items()}

        def generator_snapshot(step: TheirStep) -> None:
            """After the step's student update (read when the next step draws its z)."""
            step.generator_weights = {f"{layer}/{weight}": read(variable.name)
                                      for (layer, weight), variable
                                      in generator_variables.items()}
            step.generator_adam = {f"{layer}/{weight}": slots(variable.name)
                                   for (layer, weight), variable
                                   in generator_variables.items()}
            step.generator_statistics = {
                f"{bn}/{stat}": read(f"generator/{bn}/{stat}:0")
                for bn in ("g_bn0", "g_bn1", "g_bn2")
                for stat in ("moving_mean", "moving_variance")}
            index = next(i for i, seen in enumerate(recorder.steps) if seen is step)
            step.epsilon = float(dcgan.dp_eps_list[index])

        dcgan.save_d = save_d
        dcgan.aggregate_results = aggregate_results
        try:
            with session.as_default(), recorder.installed():
                dcgan.train_together(flags)
                recorder.finish()
        except SystemExit as stop:
            raise SideBySideError("the authors' loop stopped early (privacy budget)") from stop
        finally:
            session.close()
    return recorder.steps[:config.steps]


def _assign(session, variables: dict, name: str, value: np.ndarray) -> None:
    if name not in variables:
        raise SideBySideError(f"the authors' graph has no variable {name!r}")
    variable = variables[name]
    if tuple(variable.shape) != tuple(value.shape):
        raise SideBySideError(f"{name}: their shape {tuple(variable.shape)} != dclens' "
                              f"{tuple(value.shape)}")
    session.run(variable.assign(value))


# --------------------------------------------------------------------------- our run
@dataclasses.dataclass
class OurStep:
    teacher_weights: dict[str, np.ndarray]
    teacher_loss: np.ndarray
    image_gradients: np.ndarray       # [T, B, D]
    vote_sum: np.ndarray              # [B, D]
    noisy_update: np.ndarray          # [B, D] in {-1, 0, 1}
    generator_weights: dict[str, np.ndarray]
    epsilon: float
    # dclens' functions applied to the authors' inputs of the same step:
    image_gradients_their_weights: np.ndarray   # their trained teachers, this query
    vote_sum_their_gradients: np.ndarray        # their image gradients and uniforms
    noisy_update_their_votes: np.ndarray        # their vote sums and noise


class _Observer:
    """Reads what a dclens step computed at the points where the authors' values are read,
    and applies dclens' functions to the authors' inputs of the same step."""

    def __init__(self, lens_ref: list, theirs: list[TheirStep]):
        self.lens_ref = lens_ref
        self.theirs = theirs
        self.round: dict[str, Any] = {}

    def round_released(self, step, round_index, images, one_hot, vote_sum, result):
        lens: DataLens = self.lens_ref[0]
        theirs = self.theirs[step]
        weights = tf.constant(lens.bank.weights)
        grads = _flat(lens.ensemble.image_gradients(weights, images, one_hot))
        their_weights = lens.ensemble.layout.join(
            {n: tf.constant(theirs.teacher_weights[n]) for n in TEACHER_NAMES})
        on_their_weights = _flat(lens.ensemble.image_gradients(their_weights, images, one_hot))
        their_grads = np.stack(theirs.image_gradients, axis=1).reshape(grads.shape)
        uniforms = None
        if lens.config.topagg.method is Aggregation.TOPK_STOCHASTIC_SIGN:
            uniforms = topagg.uniforms_in_topk_order(
                tf.constant(their_grads), tf.constant(np.stack(theirs.uniforms, axis=1)),
                lens.config.topagg.topk)
        their_votes = np.rint(np.stack(theirs.vote_sums)).astype(np.int32)
        self.round = dict(
            image_gradients=grads, vote_sum=vote_sum.numpy(),
            noisy_update=result.update.numpy(), teacher_loss=_our_teacher_loss(lens, step),
            image_gradients_their_weights=on_their_weights,
            vote_sum_their_gradients=lens.topagg.vote_sum(tf.constant(their_grads),
                                                          uniforms=uniforms).numpy(),
            noisy_update_their_votes=lens.topagg.release(
                tf.constant(their_votes), noise=tf.constant(np.stack(theirs.noise))
            ).update.numpy())


def _flat(grads: tf.Tensor) -> np.ndarray:
    grads = grads.numpy()
    return grads.reshape(grads.shape[0], grads.shape[1], -1)


def _our_teacher_loss(lens: DataLens, step: int) -> np.ndarray:
    """Each teacher's discriminator loss on this step's real batch and its fake batch."""
    columns = lens._slot_columns()
    records = lens.partitions[:, columns]
    labels = tf.one_hot(lens.labels[records], lens.shape.num_classes)
    z = lens.latent(step)
    fakes = tf.stack([lens.generate(z, labels[i]) for i in range(len(records))])
    weights = tf.constant(lens.bank.weights)
    real = lens.ensemble.logits(weights, tf.constant(lens.images[records]), labels)
    fake = lens.ensemble.logits(weights, fakes, labels)
    return (tf.reduce_mean(tf.nn.softplus(-real), axis=1)
            + tf.reduce_mean(tf.nn.softplus(fake), axis=1)).numpy()


def authors_state(lens: DataLens, theirs: TheirStep, step: int
                  ) -> tuple[dict[str, np.ndarray], Callable[[str], np.ndarray]]:
    """The authors' state after ``theirs`` (teachers, generator, both Adams) as dclens'
    checkpoint arrays (:meth:`DataLens.state_arrays` names), for
    :meth:`DataLens.load_state_arrays`."""
    layout = lens.ensemble.layout
    arrays = {
        "teachers_weights": layout.join({n: tf.constant(theirs.teacher_weights[n])
                                         for n in TEACHER_NAMES}).numpy(),
        "teachers_adam_m": layout.join({n: tf.constant(theirs.teacher_adam[n][0])
                                        for n in TEACHER_NAMES}).numpy(),
        "teachers_adam_v": layout.join({n: tf.constant(theirs.teacher_adam[n][1])
                                        for n in TEACHER_NAMES}).numpy(),
        "teachers_steps": np.array(lens.bank.steps),
    }
    values = {**theirs.generator_weights, **theirs.generator_statistics}
    for i, variable in enumerate(lens.generator.weights):
        arrays[f"generator_{i:03d}"] = values[variable.path]
    lens.student_optimizer.build(lens.generator.trainable_variables)
    for i, variable in enumerate(lens.student_optimizer.variables):
        name = variable.path.split("/", 1)[1]
        if name == "iteration":
            value = np.array(step + 1, variable.dtype)
        elif name == "learning_rate":
            value = variable.numpy()
        else:
            stem, moment = name.rsplit("_", 1)
            layer_weight = next(key for key in theirs.generator_adam
                                if key.replace("/", "_") == stem)
            value = theirs.generator_adam[layer_weight][0 if moment == "momentum" else 1]
        arrays[f"optimizer_{i:03d}"] = np.asarray(value)
    return arrays, arrays.__getitem__


def run_dclens(lens: DataLens, observer: _Observer, steps: int,
               theirs: list[TheirStep] | None = None) -> list[OurStep]:
    """dclens' steps; with ``theirs`` (lockstep), each step from the authors' state after
    their previous step, so that every step compares one step's computation."""
    out = []
    for index in range(steps):
        if theirs is not None and index > 0:
            arrays, load = authors_state(lens, theirs[index - 1], index - 1)
            lens.load_state_arrays(load, list(arrays), index)
        lens.train_step()
        split = lens.ensemble.layout.split(tf.constant(lens.bank.weights))
        out.append(OurStep(
            teacher_weights={name: split[name].numpy() for name in TEACHER_NAMES},
            teacher_loss=observer.round["teacher_loss"],
            image_gradients=observer.round["image_gradients"],
            vote_sum=observer.round["vote_sum"],
            noisy_update=observer.round["noisy_update"],
            generator_weights={f"{layer}/{weight}":
                               getattr(lens.generator.get_layer(layer), weight).numpy()
                               for layer, weight in GENERATOR_NAMES},
            epsilon=lens.ledger.epsilon().epsilon,
            image_gradients_their_weights=observer.round["image_gradients_their_weights"],
            vote_sum_their_gradients=observer.round["vote_sum_their_gradients"],
            noisy_update_their_votes=observer.round["noisy_update_their_votes"]))
    return out


# --------------------------------------------------------------------------- comparison
def difference(ours: np.ndarray, theirs: np.ndarray) -> dict[str, float]:
    """max |ours - theirs| and that over max |theirs| (0 when both are all zero)."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if ours.shape != theirs.shape:
        raise SideBySideError(f"shapes differ: ours {ours.shape}, theirs {theirs.shape}")
    absolute = float(np.max(np.abs(ours - theirs))) if ours.size else 0.0
    scale = float(np.max(np.abs(theirs))) if theirs.size else 0.0
    return {"max_abs": absolute, "max_rel": absolute / scale if scale > 0 else absolute}


def explain_vote_differences(our_grads: np.ndarray, their_grads: np.ndarray,
                             our_votes: np.ndarray, their_votes: np.ndarray,
                             topk: int) -> dict[str, int]:
    """Which vote-sum differences a near tie at the top-k boundary explains.

    For each (teacher, image) whose top-k coordinate sets differ (ours: ``tf.math.top_k``
    order; theirs: ``np.argpartition``), the swap is *explained* when every coordinate in
    the symmetric difference has |g| within twice that pair's measured gradient
    difference of the authors' k-th largest |g|.  A vote-sum difference at coordinate c
    of image j is explained when c is an explained swap of some teacher for image j.

    Args: gradients [T, B, D]; vote sums [B, D].
    """
    swapped_pairs = 0
    explained = np.zeros(our_votes.shape, bool)
    for t in range(our_grads.shape[0]):
        for j in range(our_grads.shape[1]):
            a, b = our_grads[t, j], their_grads[t, j]
            magnitude = np.abs(b)
            set_a = set(np.argsort(-np.abs(a), kind="stable")[:topk].tolist())
            set_b = set(np.argpartition(magnitude, -topk)[-topk:].tolist())
            if set_a == set_b:
                continue
            swapped_pairs += 1
            swapped = np.array(sorted(set_a ^ set_b))
            kth = np.sort(magnitude)[-topk]
            tolerance = 2.0 * float(np.max(np.abs(a - b)))
            near = np.abs(magnitude[swapped] - kth) <= tolerance
            explained[j, swapped[near]] = True
    mismatch = our_votes != their_votes
    return {"pairs_with_different_topk": swapped_pairs,
            "vote_sum_mismatches": int(mismatch.sum()),
            "vote_sum_mismatches_unexplained": int((mismatch & ~explained).sum())}


def compare_step(index: int, ours: OurStep, theirs: TheirStep,
                 config: SideBySideConfig) -> dict[str, Any]:
    """One step's differences and whether each is within :data:`TOLERANCES`."""
    epoch = index // config.steps_per_epoch
    adam_steps = (config.pretrain_teacher if epoch == 0 and config.pretrain_teacher > 0
                  else config.d_step)
    teacher = {name: difference(ours.teacher_weights[name], theirs.teacher_weights[name])
               for name in TEACHER_NAMES}
    generator = {name: difference(ours.generator_weights[name],
                                  theirs.generator_weights[name])
                 for name in ours.generator_weights}
    their_grads = np.stack(theirs.image_gradients, axis=1).reshape(ours.image_gradients.shape)
    their_votes = np.rint(np.stack(theirs.vote_sums)).astype(np.int64).reshape(
        ours.vote_sum.shape)
    their_update = np.rint(np.stack(theirs.updates) / config.learning_rate).reshape(
        ours.noisy_update.shape)
    votes = explain_vote_differences(ours.image_gradients, their_grads, ours.vote_sum,
                                     their_votes, config.topk)
    update_mismatch = ours.noisy_update != their_update
    vote_mismatch = ours.vote_sum != their_votes
    epsilon_rel = abs(ours.epsilon - theirs.epsilon) / theirs.epsilon

    def movement(ours_w: dict[str, np.ndarray], theirs_w: dict[str, np.ndarray],
                 steps: int) -> dict[str, float]:
        """Largest difference, and the fraction beyond adam_outlier, in Adam reaches."""
        reach = config.learning_rate * steps
        gaps = np.concatenate([np.abs(np.asarray(ours_w[n], np.float64) - theirs_w[n]).ravel()
                               for n in ours_w if n not in NORMALISED_AWAY]) / reach
        return {"max": float(gaps.max()),
                "outlier_fraction": float(np.mean(gaps > TOLERANCES["adam_outlier"]))}

    def within(moved: dict[str, float]) -> bool:
        return (moved["max"] <= TOLERANCES["adam_max"]
                and moved["outlier_fraction"] <= TOLERANCES["adam_outlier_fraction"])

    same_input = {
        "image_gradients": difference(ours.image_gradients_their_weights, their_grads),
        "vote_sum_mismatches": int(np.sum(ours.vote_sum_their_gradients != their_votes)),
        "noisy_update_mismatches": int(np.sum(ours.noisy_update_their_votes
                                              != their_update)),
    }
    row = {
        "step": index,
        "epoch": epoch,
        "same_inputs": same_input,
        "teacher_adam_steps": adam_steps,
        "teacher_loss": difference(ours.teacher_loss, theirs.teacher_loss),
        "teacher_weights": teacher,
        "teacher_movement": movement(ours.teacher_weights, theirs.teacher_weights,
                                     adam_steps),
        "image_gradients": difference(ours.image_gradients, their_grads),
        "votes": votes,
        "vote_sum_abs_total": int(np.abs(their_votes).sum()),
        "noisy_update_mismatches": int(update_mismatch.sum()),
        "noisy_update_passed": float(np.mean(np.abs(ours.noisy_update))),
        "generator_weights": generator,
        "generator_movement": movement(ours.generator_weights, theirs.generator_weights, 1),
        "epsilon": {"ours": ours.epsilon, "theirs": theirs.epsilon, "rel": epsilon_rel},
    }
    same_update = not update_mismatch.any()
    row["checks"] = {
        "teacher_loss": row["teacher_loss"]["max_rel"] <= TOLERANCES["teacher_loss"],
        "teacher_weights": within(row["teacher_movement"]),
        "image_gradients": (same_input["image_gradients"]["max_rel"]
                            <= TOLERANCES["image_gradients"]),
        "votes_same_gradients": same_input["vote_sum_mismatches"] == 0,
        "noisy_update_same_votes": same_input["noisy_update_mismatches"] == 0,
        "votes": votes["vote_sum_mismatches_unexplained"] == 0,
        # The same noise on the same sums: an update may differ only where the sums do.
        "noisy_update": not (update_mismatch & ~vote_mismatch).any(),
        # With different updates the generators legitimately differ; compared otherwise.
        "generator_weights": within(row["generator_movement"]) if same_update else True,
        "epsilon": epsilon_rel <= TOLERANCES["epsilon"],
    }
    row["generator_compared"] = same_update
    row["agree"] = all(row["checks"].values())
    return row


# --------------------------------------------------------------------------- the harness
def run_side_by_side(config: SideBySideConfig, authors_repo: str | os.PathLike, *,
                     perturb: str | None = None, free_running: bool = False,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs both implementations on ``config``; returns the report (see module docstring).

    ``perturb``: ``"noise"`` or ``"weights"`` changes one input of dclens only (the DP
    noise of one coordinate, or one initial teacher weight) -- to show the harness flags a
    disagreement.  ``free_running``: dclens runs from its own state after the first step
    instead of the authors' (lockstep, the default): shows how the two trajectories
    separate through float32 round-off (not held to the tolerances).
    """
    started = time.perf_counter()
    repo = tf1_compat.check_repo(authors_repo)
    full = data.load_dataset("fashion_mnist", config.data_dir)
    subset = balanced_subset(full.labels, config.teachers * config.records)
    images, labels = full.images[subset], full.labels[subset]
    one_hot = np.eye(10, dtype=np.float32)[labels]
    dataset = data.LabeledImages(images, labels, full.spec, f"{full.source} (subset)")
    with tempfile.TemporaryDirectory(prefix="dclens-side-by-side-") as workdir, \
            tf1_compat.load_authors_code(repo) as code:
        partitions = _their_partitions(code, labels, one_hot, config.teachers)
        lens_ref: list = []
        draws = ReplayDraws([])
        observer = _Observer(lens_ref, draws.steps)
        lens = DataLens(config.dclens_config(), dataset, root_seed=config.seed,
                        partitions=partitions, draws=draws, observer=observer,
                        ensemble="reference")
        lens_ref.append(lens)
        their_log = io.StringIO()
        log(f"side by side: {config.teachers} teachers x {config.records} records, "
            f"{config.steps} steps, k={config.topk}, sigma={config.sigma}, "
            f"beta={config.thresh}, stochastic={config.stochastic}")
        log("running the authors' train_together ...")
        theirs = run_authors(code, config, images, one_hot, lens, workdir, their_log)
        if len(theirs) < config.steps:
            raise SideBySideError(f"the authors' run recorded {len(theirs)} of "
                                  f"{config.steps} steps")
        draws.steps.extend(theirs)
        if perturb == "noise":
            draws.steps[0] = dataclasses.replace(theirs[0], noise=[
                n + (1000.0 if j == 0 else 0.0) for j, n in enumerate(theirs[0].noise)])
        elif perturb == "weights":
            weights = lens.bank.weights.copy()
            weights[0, 0] += 0.05
            lens.bank.assign("weights", weights)
        elif perturb is not None:
            raise SideBySideError(f"unknown perturbation {perturb!r}; use noise or weights")
        log("running dclens ...")
        ours = run_dclens(lens, observer, config.steps,
                          theirs=None if free_running else theirs)
    rows = [compare_step(i, o, t, config) for i, (o, t) in enumerate(zip(ours, theirs))]
    for row in rows:
        log(format_row(row))
    return {
        "config": dataclasses.asdict(config),
        "authors_repo": str(repo),
        "tolerances": TOLERANCES,
        "mode": "free_running" if free_running else "lockstep",
        "not_held_to_tolerance": list(NORMALISED_AWAY),
        "perturbation": perturb,
        "steps": rows,
        # Free-running trajectories separate by round-off: reported, not judged.
        "agree": None if free_running else all(row["agree"] for row in rows),
        "seconds": time.perf_counter() - started,
    }


def _their_partitions(code: tf1_compat.AuthorsCode, labels: np.ndarray,
                      one_hot: np.ndarray, teachers: int) -> np.ndarray:
    """Their ``evenly_partition_dataset`` applied to record indices."""
    generator = code.model.evenly_partition_dataset(np.arange(len(labels)),
                                                    one_hot.astype(np.float64), teachers)
    with contextlib.redirect_stdout(io.StringIO()):
        parts = [next(generator)[0] for _ in range(teachers)]
    return np.stack(parts).astype(np.int64)


def format_row(row: dict[str, Any]) -> str:
    """One line per step: the largest differences and the verdict."""
    failed = [name for name, ok in row["checks"].items() if not ok]
    votes = row["votes"]
    return (f"step {row['step']} (epoch {row['epoch']}): loss {row['teacher_loss']['max_rel']:.1e}"
            f"  teachers {row['teacher_movement']['max']:.1e} reach"
            f" ({row['teacher_movement']['outlier_fraction']:.0e} beyond 0.01)"
            f"  image grads {row['same_inputs']['image_gradients']['max_rel']:.1e}"
            f" (run: {row['image_gradients']['max_rel']:.1e})"
            f"  votes differ {votes['vote_sum_mismatches']}"
            f" ({votes['vote_sum_mismatches_unexplained']} unexplained)"
            f"  update differs {row['noisy_update_mismatches']}"
            f"  generator {row['generator_movement']['max']:.1e} reach"
            f"{'' if row['generator_compared'] else ' (not compared)'}"
            f"  eps {row['epsilon']['ours']:.6f}/{row['epsilon']['theirs']:.6f}  "
            + ("AGREE" if row["agree"] else f"DISAGREE ({', '.join(failed)})"))
