"""The authors' side of a side-by-side run: their ``train_together`` on the shared data,
with dclens' initial weights copied in and every numpy draw recorded step by step
(:class:`NumpyDrawRecorder`)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from dclens.datalens.train import DataLens
from dclens.parity import tf1_compat
from dclens.parity.config import SideBySideConfig, SideBySideError


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


@contextlib.contextmanager
def seeded_global_numpy(seed: int):
    """numpy's global RNG seeded with ``seed`` inside the block, its state restored after.

    The authors' loop draws from numpy's global RNG (z, query labels, the stochastic-sign
    uniforms, their shuffles); seeding it makes a side-by-side report a function of its
    configuration, so a run can be repeated exactly.  Unseeded, every run compared the
    two implementations on different draws, and the rare draw whose round-off lands
    near a tolerance made the comparison pass or fail by chance.
    """
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def their_flags(code: tf1_compat.AuthorsCode, config: SideBySideConfig,
                workdir: str) -> Any:
    """Their ``main.py`` flags set to ``config`` (their defaults for everything else)."""
    flags = code.flags
    overrides = dict(
        dataset="fashion_mnist", train=True, pretrain=False, epoch=config.epochs,
        batch_size=config.batch_size, batch_teachers=config.teachers, teachers_batch=1,
        topk=config.topk, sigma=float(config.sigma), thresh=config.thresh,
        max_eps=1e9, delta=config.delta, d_step=config.d_step, g_step=1,
        pretrain_teacher=config.pretrain_teacher, max_grad=config.max_grad,
        # Their aggregate_results tries --signsgd first: --signsgd_nothresh needs it off.
        stochastic=config.stochastic, signsgd=config.threshold,
        signsgd_nothresh=not config.threshold, z_dim=config.z_dim, y_dim=10,
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
    flags = their_flags(code, config, workdir)
    recorder = NumpyDrawRecorder(np.random.default_rng(config.seed + 1),
                                 (config.batch, config.z_dim),
                                 step_ended=lambda step: their_run.generator_snapshot(step))
    initial = _initial_weights(lens)    # read eagerly: inside their graph, symbolic
    graph = tf.Graph()
    with graph.as_default(), contextlib.redirect_stdout(log), \
            seeded_global_numpy(config.seed + 2):
        session = tf.compat.v1.Session(graph=graph)
        their_run = _TheirRun(code, config, flags, session, graph, recorder, workdir,
                              images, one_hot)
        their_run.start_from(*initial)
        try:
            with session.as_default(), recorder.installed():
                their_run.dcgan.train_together(flags)
                recorder.finish()
        except SystemExit as stop:
            raise SideBySideError("the authors' loop stopped early (privacy budget)") from stop
        finally:
            session.close()
    return recorder.steps[:config.steps]


def build_their_dcgan(code: tf1_compat.AuthorsCode, flags, session, workdir: str,
                      images: np.ndarray, one_hot: np.ndarray):
    """Their ``DCGAN`` (in the session's default graph) reading the shared data
    (``images`` float [n, 28, 28, 1], ``one_hot`` [n, 10]) instead of its IDX files;
    everything else is their constructor, given their flags."""

    class SharedDataDCGAN(code.model.DCGAN):
        """Their DCGAN reading the shared subset instead of its IDX files."""

        def load_fashion_mnist(self):
            return images.astype(np.float64), one_hot.astype(np.float64)

    return SharedDataDCGAN(
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


def _initial_weights(lens: DataLens) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """dclens' initial teacher weights {name: [T, ...]} and generator weights {their
    variable name: array}, as numpy."""
    split = lens.ensemble.layout.split(tf.constant(lens.bank.weights))
    teachers = {name: split[name].numpy() for name in TEACHER_NAMES}
    generator = {theirs: getattr(lens.generator.get_layer(layer), weight).numpy()
                 for (layer, weight), theirs in GENERATOR_NAMES.items()}
    return teachers, generator


class _TheirRun:
    """Their DCGAN in its own graph, reading the shared data, its teachers and generator
    started from dclens' initial weights, and read back after every step: the teachers
    when their loop saves them, the generator when the next step draws its z."""

    def __init__(self, code: tf1_compat.AuthorsCode, config: SideBySideConfig, flags,
                 session, graph, recorder: NumpyDrawRecorder, workdir: str,
                 images: np.ndarray, one_hot: np.ndarray):
        self.code, self.config, self.session, self.graph = code, config, session, graph
        self.recorder = recorder

        self.dcgan = build_their_dcgan(code, flags, session, workdir, images, one_hot)
        self.variables = {v.name: v for v in tf.compat.v1.global_variables()}
        self.generator_variables = {name: self.variables[f"generator/{theirs}:0"]
                                    for name, theirs in GENERATOR_NAMES.items()}
        self._save_d, self._aggregate = self.dcgan.save_d, self.dcgan.aggregate_results
        self.dcgan.save_d = self.save_d
        self.dcgan.aggregate_results = self.aggregate_results

    def start_from(self, teachers: dict[str, np.ndarray],
                   generator: dict[str, np.ndarray]) -> None:
        """Their variables get dclens' initial weights right after their initializer runs."""

        def initial_assignments() -> None:
            for i in range(self.config.teachers):
                for name in TEACHER_NAMES:
                    _assign(self.session, self.variables, _teacher_variable(i, name),
                            teachers[name][i])
            for theirs, value in generator.items():
                _assign(self.session, self.variables, f"generator/{theirs}:0", value)

        self.code.after_initializer = initial_assignments

    def read(self, name: str) -> np.ndarray:
        """The value of their variable ``name`` (Adam's slots exist once their loop has
        built its optimizers, hence the lookup at every read)."""
        if name not in self.variables:
            self.variables.update({v.name: v for v in self.graph.get_collection(
                tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)})
        return np.array(self.session.run(self.variables[name]), copy=True)

    def slots(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Adam's (m, v) of variable ``name`` (TF1 slots ``<var>/Adam``, ``/Adam_1``)."""
        stem = name[:-len(":0")]
        return self.read(f"{stem}/Adam:0"), self.read(f"{stem}/Adam_1:0")

    def teacher_snapshot(self) -> None:
        config, dcgan, step = self.config, self.dcgan, self.recorder.current
        step.teacher_weights = {
            name: np.stack([self.read(_teacher_variable(i, name))
                            for i in range(config.teachers)])
            for name in TEACHER_NAMES}
        step.teacher_adam = {
            name: tuple(np.stack(moments) for moments in zip(*[
                self.slots(_teacher_variable(i, name)) for i in range(config.teachers)]))
            for name in TEACHER_NAMES}
        slot = (len(self.recorder.steps) - 1) % config.steps_per_epoch
        rows = range(slot * config.batch, (slot + 1) * config.batch)
        step.teacher_loss = np.array([
            self.session.run(dcgan.teachers_list[i]["d_loss"], feed_dict={
                dcgan.inputs: dcgan.train_data_list[i][rows], dcgan.z: step.latent,
                dcgan.y: dcgan.train_label_list[i][rows]})
            for i in range(config.teachers)])

    def save_d(self, checkpoint_dir, step, teacher_batch):
        """Their teacher save: the end of a step's teacher training (the first one, right
        after their initialisation, starts the recording)."""
        if self.recorder.active:
            self.teacher_snapshot()
        else:
            self.recorder.start()
        return self._save_d(checkpoint_dir, step, teacher_batch)

    def aggregate_results(self, output_list, *args, **kwargs):
        self.recorder.current.image_gradients.append(np.stack(output_list))
        result = self._aggregate(output_list, *args, **kwargs)
        self.recorder.current.updates.append(np.asarray(result[0]))
        return result

    def generator_snapshot(self, step: TheirStep) -> None:
        """After the step's student update (read when the next step draws its z)."""
        step.generator_weights = {f"{layer}/{weight}": self.read(variable.name)
                                  for (layer, weight), variable
                                  in self.generator_variables.items()}
        step.generator_adam = {f"{layer}/{weight}": self.slots(variable.name)
                               for (layer, weight), variable
                               in self.generator_variables.items()}
        step.generator_statistics = {
            f"{bn}/{stat}": self.read(f"generator/{bn}/{stat}:0")
            for bn in ("g_bn0", "g_bn1", "g_bn2")
            for stat in ("moving_mean", "moving_variance")}
        index = next(i for i, seen in enumerate(self.recorder.steps) if seen is step)
        step.epsilon = float(self.dcgan.dp_eps_list[index])


def _assign(session, variables: dict, name: str, value: np.ndarray) -> None:
    if name not in variables:
        raise SideBySideError(f"the authors' graph has no variable {name!r}")
    variable = variables[name]
    if tuple(variable.shape) != tuple(value.shape):
        raise SideBySideError(f"{name}: their shape {tuple(variable.shape)} != dclens' "
                              f"{tuple(value.shape)}")
    session.run(variable.assign(value))


def their_partitions(code: tf1_compat.AuthorsCode, labels: np.ndarray,
                      one_hot: np.ndarray, teachers: int) -> np.ndarray:
    """Their ``evenly_partition_dataset`` applied to record indices."""
    generator = code.model.evenly_partition_dataset(np.arange(len(labels)),
                                                    one_hot.astype(np.float64), teachers)
    with contextlib.redirect_stdout(io.StringIO()):
        parts = [next(generator)[0] for _ in range(teachers)]
    return np.stack(parts).astype(np.int64)
