"""All N teacher discriminators as stacked weights, trained and queried in chunks.

Every teacher has its own weights and its own Adam state (never shared: sharing Adam's
moments between teachers would make one teacher's update depend on another teacher's data
and break the one-teacher sensitivity of TopAgg).  They live in a :class:`TeacherBank`:
three float32 arrays [N, P] (weights, Adam's first and second moments; P parameters per
teacher) and the per-teacher Adam step counts.  The bank keeps them in RAM or in ``.npy``
files streamed chunk by chunk (optionally with the first teachers held in RAM), so only
one chunk of teachers is ever materialised as TensorFlow tensors.

:class:`TeacherEnsemble` is the math: the teacher discriminator of
:mod:`dclens.datalens.networks` evaluated for a chunk of T teachers at once, with a leading teacher
axis on weights and data.  Convolutions are im2col + batched matmul over the teacher axis;
batch normalisation always uses the statistics of the batch it is given, per teacher (as
in the authors' code, for training and for gradient queries).  Its results equal a plain
Keras discriminator with the same weights (tests/test_teachers.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from typing import Iterator, NamedTuple

import numpy as np
import tensorflow as tf

from dclens.datalens import networks

ADAM_BETA2 = 0.999
ADAM_EPSILON = 1e-8   # TF1's default, as in the authors' code


@dataclasses.dataclass(frozen=True)
class ParamLayout:
    """Where each named weight of one teacher sits in its flat parameter vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def for_shape(cls, shape: networks.ImageShape) -> "ParamLayout":
        entries = networks.discriminator_weight_shapes(shape)
        return cls(tuple(n for n, _ in entries), tuple(s for _, s in entries))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def split(self, flat: tf.Tensor) -> dict[str, tf.Tensor]:
        """[T, P] -> {name: [T, *shape]}."""
        parts = tf.split(flat, self.sizes, axis=1)
        return {name: tf.reshape(part, (-1, *shape))
                for name, shape, part in zip(self.names, self.shapes, parts)}

    def join(self, params: dict[str, tf.Tensor]) -> tf.Tensor:
        """{name: [T, *shape]} -> [T, P]."""
        return tf.concat([tf.reshape(params[name], (tf.shape(params[name])[0], -1))
                          for name in self.names], axis=1)


def initial_teacher_weights(layout: ParamLayout, num_teachers: int,
                            rng: np.random.Generator) -> np.ndarray:
    """[num_teachers, P] float32: DCGAN initialisation, independent for every teacher.

    Convolution kernels ~ N(0, 0.02) truncated at two standard deviations, dense kernels
    ~ N(0, 0.02), biases 0, batch-norm gamma 1 and beta 0.
    """
    columns = []
    for name, size in zip(layout.names, layout.sizes):
        if name.endswith("/kernel"):
            values = rng.standard_normal((num_teachers, size), dtype=np.float32)
            if name.startswith("conv"):
                outside = np.abs(values) > 2.0
                while outside.any():
                    values[outside] = rng.standard_normal(int(outside.sum()), dtype=np.float32)
                    outside = np.abs(values) > 2.0
            columns.append(values * np.float32(networks.INIT_STDDEV))
        elif name.endswith("/gamma"):
            columns.append(np.ones((num_teachers, size), np.float32))
        else:
            columns.append(np.zeros((num_teachers, size), np.float32))
    return np.concatenate(columns, axis=1)


class BankSpaceError(OSError):
    """The disk has no room for a disk-backed teacher bank (checked before any step)."""


class _RowFile:
    """Positional row I/O on one ``.npy`` file (``os.preadv``/``os.pwritev``).

    Streaming rows through explicit reads and writes instead of the memory map keeps the
    mapped pages out of the process's resident set: a bank larger than RAM is read and
    written one chunk at a time through the page cache, never all mapped at once.
    """

    def __init__(self, array: np.memmap):
        self.path = array.filename
        self.offset = int(array.offset)
        self.row_bytes = int(array.strides[0])
        self.fd = os.open(self.path, os.O_RDWR)

    def read(self, start: int, out: np.ndarray) -> None:
        view, position = memoryview(out).cast("B"), self.offset + start * self.row_bytes
        while len(view):
            count = os.preadv(self.fd, [view], position)
            if count <= 0:
                raise OSError(f"short read from {self.path} at byte {position}")
            view, position = view[count:], position + count

    def write(self, start: int, rows: np.ndarray) -> None:
        view = memoryview(np.ascontiguousarray(rows)).cast("B")
        position = self.offset + start * self.row_bytes
        while len(view):
            count = os.pwritev(self.fd, [view], position)
            view, position = view[count:], position + count

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except (OSError, AttributeError):
            pass


def bank_bytes(layout: ParamLayout, num_teachers: int) -> int:
    """Bytes of a bank: weights and two Adam moments in float32 plus int64 step counts."""
    return num_teachers * (3 * 4 * layout.size + 8)


class TeacherBank:
    """Weights and Adam state of N teachers, stored as [N, P] float32 arrays.

    ``directory=None`` keeps them in RAM.  Otherwise they are ``.npy`` files in
    ``directory`` (weights.npy, adam_m.npy, adam_v.npy, steps.npy), streamed chunk by chunk
    with positional reads and writes (:meth:`read_into`, :meth:`write`; see
    :mod:`dclens.datalens.bank_stream`), so a bank larger than memory never has to be resident, and
    the first ``resident_rows`` teachers are kept in RAM (a tier in front of the files:
    those rows cost no disk traffic per step; :meth:`sync` copies them to the files).  The
    files are preallocated: a disk too small fails at creation (:class:`BankSpaceError`),
    not in the middle of a run.

    ``weights``, ``adam_m``, ``adam_v``: the whole [N, P] arrays, for checkpoints and tests.
    For a bank in RAM or on disk without a resident tier they are the (writable) arrays or
    memory maps themselves; with a resident tier they are synced first and read-only (write
    through :meth:`assign`/:meth:`write`).
    """

    FILES = ("weights", "adam_m", "adam_v", "steps")

    def __init__(self, weights: np.ndarray, adam_m: np.ndarray, adam_v: np.ndarray,
                 steps: np.ndarray, layout: ParamLayout, *, resident_rows: int = 0):
        n, p = weights.shape
        if p != layout.size or adam_m.shape != (n, p) or adam_v.shape != (n, p) \
                or steps.shape != (n,):
            raise ValueError(f"inconsistent teacher bank: weights {weights.shape}, adam_m "
                             f"{adam_m.shape}, adam_v {adam_v.shape}, steps {steps.shape}, "
                             f"layout size {layout.size}")
        self.layout = layout
        self.steps = steps
        self._arrays = (weights, adam_m, adam_v)
        self._files = ([_RowFile(a) for a in self._arrays]
                       if all(isinstance(a, np.memmap) and a.filename for a in self._arrays)
                       else None)
        resident = min(max(int(resident_rows), 0), n) if self._files is not None else 0
        self._resident = tuple(np.empty((resident, p), np.float32) for _ in range(3))
        for which in range(3 if resident else 0):   # positional reads: no mapped pages
            self._files[which].read(0, self._resident[which])
        self._dirty = False

    # ----------------------------------------------------------------- whole arrays
    def _whole(self, which: int) -> np.ndarray:
        if not self.resident_rows:
            return self._arrays[which]
        self.sync()
        view = self._arrays[which].view()
        view.flags.writeable = False
        return view

    @property
    def weights(self) -> np.ndarray:
        return self._whole(0)

    @property
    def adam_m(self) -> np.ndarray:
        return self._whole(1)

    @property
    def adam_v(self) -> np.ndarray:
        return self._whole(2)

    @property
    def num_teachers(self) -> int:
        return self._arrays[0].shape[0]

    @property
    def on_disk(self) -> bool:
        """Whether the arrays are files streamed with positional I/O."""
        return self._files is not None

    @property
    def resident_rows(self) -> int:
        """Rows [0, resident_rows) of a disk bank live in RAM (0 for a bank in RAM)."""
        return len(self._resident[0])

    @classmethod
    def create(cls, layout: ParamLayout, num_teachers: int, *, seed: int,
               directory: str | os.PathLike | None = None, resident_rows: int = 0,
               init_chunk: int = 256, first_teacher: int = 0,
               total_teachers: int | None = None) -> "TeacherBank":
        """A freshly initialised bank (teacher i's initial weights depend on (seed, i)).

        ``first_teacher`` / ``total_teachers``: this bank holds teachers [first_teacher,
        first_teacher + num_teachers) of a run of ``total_teachers`` (default: all of
        them), initialised exactly as those rows of the whole run's bank are (a shard).
        """
        if num_teachers < 1:
            raise ValueError(f"num_teachers must be >= 1, got {num_teachers!r}")
        total = num_teachers if total_teachers is None else total_teachers
        if not 0 <= first_teacher <= total - num_teachers:
            raise ValueError(f"teachers [{first_teacher}, {first_teacher + num_teachers}) "
                             f"are not within a run of {total} teachers")
        shape = (num_teachers, layout.size)
        arrays = {}
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
            reused = sum(os.path.getsize(path) for path in
                         (os.path.join(directory, f"{name}.npy") for name in cls.FILES)
                         if os.path.exists(path))     # a previous bank's files are replaced
            _check_space(directory, bank_bytes(layout, num_teachers) - reused)
        for name in cls.FILES:
            dims = (num_teachers,) if name == "steps" else shape
            dtype = np.int64 if name == "steps" else np.float32
            if directory is None:
                arrays[name] = np.zeros(dims, dtype)
            else:
                path = os.path.join(directory, f"{name}.npy")
                arrays[name] = np.lib.format.open_memmap(path, mode="w+", dtype=dtype,
                                                         shape=dims)
                _preallocate(path, arrays[name])
        seeds = np.random.SeedSequence(seed).spawn(math.ceil(total / init_chunk))
        bank = cls(arrays["weights"], arrays["adam_m"], arrays["adam_v"], arrays["steps"],
                   layout, resident_rows=resident_rows)
        last = first_teacher + num_teachers
        for index in range(first_teacher // init_chunk, math.ceil(last / init_chunk)):
            start = index * init_chunk                  # the whole run's init chunk ...
            stop = min(start + init_chunk, total)
            rows = initial_teacher_weights(layout, stop - start,
                                           np.random.default_rng(seeds[index]))
            keep = slice(max(start, first_teacher) - start, min(stop, last) - start)
            bank._write_rows(0, max(start, first_teacher) - first_teacher, rows[keep])
        return bank

    def chunks(self, chunk_size: int) -> Iterator[tuple[int, int]]:
        """(start, stop) teacher ranges of at most chunk_size teachers."""
        if chunk_size < 1:
            raise ValueError(f"chunk size must be >= 1, got {chunk_size!r}")
        for start in range(0, self.num_teachers, chunk_size):
            yield start, min(start + chunk_size, self.num_teachers)

    # ----------------------------------------------------------------- rows
    def _split(self, start: int, stop: int) -> int:
        """The row where [start, stop) leaves the RAM-resident part."""
        return min(max(self.resident_rows, start), stop)

    def in_ram(self, start: int, stop: int) -> bool:
        """Whether rows [start, stop) are held in RAM (no I/O needed to read them)."""
        return self._files is None or stop <= self.resident_rows

    def row_views(self, start: int, stop: int, *, with_adam: bool = True
                  ) -> "TeacherState":
        """Views (no copy) of rows [start, stop), which must be :meth:`in_ram`; steps is
        a copy.  Adam moments are None unless ``with_adam``."""
        if not self.in_ram(start, stop):
            raise ValueError(f"rows {start}:{stop} are not in RAM")
        source = self._arrays if self._files is None else self._resident
        views = [a[start:stop] for a in source]
        if not with_adam:
            views[1:] = [None, None]
        return TeacherState(*views, np.array(self.steps[start:stop]))

    def _read_rows(self, which: int, start: int, out: np.ndarray) -> None:
        stop = start + len(out)
        if self._files is None:
            np.copyto(out, self._arrays[which][start:stop])
            return
        split = self._split(start, stop)
        if split > start:
            np.copyto(out[:split - start], self._resident[which][start:split])
        if stop > split:
            self._files[which].read(split, out[split - start:])

    def _write_rows(self, which: int, start: int, rows: np.ndarray) -> None:
        stop = start + len(rows)
        if self._files is None:
            target = self._arrays[which][start:stop]
            if not _same_memory(target, rows):      # rows updated in place: nothing to copy
                target[...] = rows
            return
        rows = np.asarray(rows, np.float32)
        split = self._split(start, stop)
        if split > start:
            target = self._resident[which][start:split]
            if not _same_memory(target, rows[:split - start]):
                target[...] = rows[:split - start]
            self._dirty = True
        if stop > split:
            self._files[which].write(split, rows[split - start:])

    def read(self, start: int, stop: int) -> "TeacherState":
        """Rows [start, stop) as tensors (copies)."""
        buffers = TeacherState(*(np.empty((stop - start, self.layout.size), np.float32)
                                 for _ in range(3)), np.empty(stop - start, np.int64))
        return TeacherState(*(tf.constant(a) for a in self.read_into(start, stop, buffers)))

    def read_into(self, start: int, stop: int, buffers: "TeacherState") -> "TeacherState":
        """Copies rows [start, stop) into the leading rows of numpy ``buffers``; returns
        views of exactly stop - start rows."""
        n = stop - start
        out = TeacherState(*(b[:n] for b in buffers))
        for which in range(3):
            self._read_rows(which, start, out[which])
        out.steps[...] = self.steps[start:stop]
        return out

    def read_weights_into(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Copies the weights of rows [start, stop) into ``out`` [stop - start, P]."""
        self._read_rows(0, start, out)
        return out

    def write(self, start: int, stop: int, state: "TeacherState") -> None:
        """Stores rows [start, stop) (tensors or arrays)."""
        for which in range(3):
            rows = np.asarray(state[which])
            if rows.shape != (stop - start, self.layout.size):
                raise ValueError(f"rows {start}:{stop} need shape "
                                 f"{(stop - start, self.layout.size)}, got {rows.shape}")
            self._write_rows(which, start, rows)
        self.steps[start:stop] = np.asarray(state.steps)

    def assign(self, name: str, array: np.ndarray, *, rows_per_copy: int = 64) -> None:
        """Replaces one of FILES with ``array`` (same shape), ``rows_per_copy`` rows at a
        time, so a memory-mapped source is never resident all at once."""
        target = self.steps if name == "steps" else self._arrays[self._index(name)]
        if array.shape != target.shape:
            raise ValueError(f"{name} needs shape {target.shape}, got {array.shape}")
        if name == "steps":
            target[...] = array
            return
        for start in range(0, self.num_teachers, rows_per_copy):
            self._write_rows(self._index(name), start, array[start:start + rows_per_copy])

    @staticmethod
    def _index(name: str) -> int:
        return ("weights", "adam_m", "adam_v").index(name)

    def sync(self) -> None:
        """Copies the RAM-resident rows to the files (no-op if none changed)."""
        if self._dirty:
            for which in range(3):
                self._files[which].write(0, self._resident[which])
            self._dirty = False

    def flush(self) -> None:
        """Makes a disk bank's files complete and durable."""
        if self._files is None:
            return
        self.sync()
        if isinstance(self.steps, np.memmap):
            self.steps.flush()
        for row_file in self._files:
            os.fsync(row_file.fd)


def _check_space(directory: str | os.PathLike, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise BankSpaceError(
            f"a disk-backed teacher bank needs {needed / 1e9:.1f} GB in {directory}, only "
            f"{free / 1e9:.1f} GB are free; free space there, point the bank at a larger "
            f"disk, or use fewer teachers")


def _preallocate(path: str, array: np.memmap) -> None:
    """Reserves the file's blocks now (a memory map would otherwise fail with SIGBUS when
    the disk fills mid-run)."""
    size = int(array.offset) + array.nbytes
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        raise BankSpaceError(f"cannot reserve {size / 1e9:.1f} GB for {path}: {error}"
                             ) from error
    finally:
        os.close(fd)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether b is exactly the array a (same buffer, shape and strides)."""
    return (isinstance(b, np.ndarray) and a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


class TeacherState(NamedTuple):
    """Weights and Adam state of a chunk of T teachers (tensors or arrays)."""

    weights: tf.Tensor   # [T, P]
    adam_m: tf.Tensor    # [T, P]
    adam_v: tf.Tensor    # [T, P]
    steps: tf.Tensor     # [T] int64, Adam steps taken


def _concat_label_maps(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """[T, B, H, W, C] ++ one-hot [T, B, K] broadcast to [T, B, H, W, K]."""
    shape = tf.shape(features)
    maps = tf.broadcast_to(labels[:, :, None, None, :],
                           tf.concat([shape[:4], tf.shape(labels)[2:]], axis=0))
    return tf.concat([features, maps], axis=-1)


def _conv5x5_stride2_same(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """Per-teacher 5x5 stride-2 'SAME' convolution, literally one teacher at a time.

    x [T, B, H, W, Cin], kernel [T, 5, 5, Cin, Cout], bias [T, Cout] -> [T, B, Ho, Wo, Cout]
    with Ho = ceil(H/2).  ``tf.map_fn`` runs one ordinary ``tf.nn.conv2d`` per teacher, so
    teacher t's output depends on teacher t's kernel alone; the kernels it needs (and their
    gradients) exist on every CPU, with or without oneDNN.  This is the plain reference;
    the fast ensemble's convolutions are in :mod:`dclens.datalens.teacher_conv`.
    """
    out = tf.map_fn(lambda pair: tf.nn.conv2d(pair[0], pair[1], strides=2, padding="SAME"),
                    (x, kernel), fn_output_signature=x.dtype)
    return out + bias[:, None, None, None, :]


def _batch_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor) -> tf.Tensor:
    """Per-teacher batch normalisation with the batch's own statistics (axis 0 = teacher)."""
    axes = list(range(1, len(x.shape) - 1))
    mean, variance = tf.nn.moments(x, axes=axes, keepdims=True)
    expand = [slice(None)] + [None] * len(axes) + [slice(None)]
    return ((x - mean) * tf.math.rsqrt(variance + networks.BN_EPSILON) * gamma[tuple(expand)]
            + beta[tuple(expand)])


def _leaky_relu(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.leaky_relu(x, alpha=networks.LEAKY_SLOPE)


class TeacherEnsemble:
    """The teacher discriminator for a chunk of teachers at once (leading teacher axis).

    All methods are pure functions of their arguments: weights come in as a [T, P] tensor
    (a chunk read from a :class:`TeacherBank`) and new state goes out.

    Args:
      shape: image shape and number of classes.
      learning_rate, beta1: the teachers' Adam hyper-parameters (paper: 1e-3, 0.5).
    """

    def __init__(self, shape: networks.ImageShape, *, learning_rate: float, beta1: float):
        self.shape = shape
        self.layout = ParamLayout.for_shape(shape)
        self.learning_rate = float(learning_rate)
        self.beta1 = float(beta1)
        self._train = tf.function(self._train_steps, reduce_retracing=True)
        self._image_gradients = tf.function(self._image_gradients_impl, reduce_retracing=True)

    # ----------------------------------------------------------------- forward pass
    def logits(self, weights: tf.Tensor, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Discriminator logits [T, B] for images [T, B, H, W, C], one-hot labels [T, B, K]."""
        p = self.layout.split(weights)
        labels = tf.cast(labels, images.dtype)
        h = _concat_label_maps(images, labels)
        h = _leaky_relu(_conv5x5_stride2_same(h, p["conv0/kernel"], p["conv0/bias"]))
        h = _concat_label_maps(h, labels)
        h = _conv5x5_stride2_same(h, p["conv1/kernel"], p["conv1/bias"])
        h = _leaky_relu(_batch_norm(h, p["bn1/gamma"], p["bn1/beta"]))
        t, b = tf.shape(h)[0], tf.shape(h)[1]
        h = tf.concat([tf.reshape(h, (t, b, -1)), labels], axis=-1)
        h = tf.linalg.matmul(h, p["dense2/kernel"]) + p["dense2/bias"][:, None, :]
        h = _leaky_relu(_batch_norm(h, p["bn2/gamma"], p["bn2/beta"]))
        h = tf.concat([h, labels], axis=-1)
        logit = tf.linalg.matmul(h, p["dense3/kernel"]) + p["dense3/bias"][:, None, :]
        return logit[..., 0]

    def discriminator_loss(self, weights: tf.Tensor, real: tf.Tensor, real_labels: tf.Tensor,
                           fake: tf.Tensor, fake_labels: tf.Tensor) -> tf.Tensor:
        """Per-teacher GAN loss [T]: mean BCE(D(real), 1) + mean BCE(D(fake), 0).

        Real and fake batches go through the discriminator separately (each with its own
        batch-norm statistics), as in the authors' code.
        """
        real_logits = self.logits(weights, real, real_labels)
        fake_logits = self.logits(weights, fake, fake_labels)
        return (tf.reduce_mean(tf.nn.softplus(-real_logits), axis=1)
                + tf.reduce_mean(tf.nn.softplus(fake_logits), axis=1))

    # ----------------------------------------------------------------- training
    def _adam(self, state: TeacherState, grads: tf.Tensor) -> TeacherState:
        """One Adam step per teacher (Keras/TF formula, bias correction in the step size)."""
        steps = state.steps + 1
        t = tf.cast(steps, tf.float32)[:, None]
        alpha = self.learning_rate * tf.sqrt(1.0 - ADAM_BETA2 ** t) / (1.0 - self.beta1 ** t)
        m = state.adam_m + (grads - state.adam_m) * (1.0 - self.beta1)
        v = state.adam_v + (tf.square(grads) - state.adam_v) * (1.0 - ADAM_BETA2)
        weights = state.weights - alpha * m / (tf.sqrt(v) + ADAM_EPSILON)
        return TeacherState(weights, m, v, steps)

    def _train_steps(self, state: TeacherState, real: tf.Tensor, real_labels: tf.Tensor,
                     fake: tf.Tensor, fake_labels: tf.Tensor, num_steps: int):
        losses = tf.zeros([tf.shape(state.weights)[0]])
        for _ in range(num_steps):
            with tf.GradientTape() as tape:
                tape.watch(state.weights)
                losses = self.discriminator_loss(state.weights, real, real_labels,
                                                 fake, fake_labels)
                total = tf.reduce_sum(losses)
            grads = tape.gradient(total, state.weights)
            state = self._adam(state, grads)
        return state, losses

    def train(self, state: TeacherState, real: tf.Tensor, real_labels: tf.Tensor,
              fake: tf.Tensor, fake_labels: tf.Tensor, *, num_steps: int
              ) -> tuple[TeacherState, tf.Tensor]:
        """``num_steps`` Adam steps of every teacher on the same real and fake batches.

        Args:
          state: the chunk's weights and Adam state.
          real, fake: [T, B, H, W, C] images; real_labels, fake_labels: [T, B, K] one-hot.
        Returns:
          (new state, per-teacher loss [T] of the last step, before its update).
        Summing the teachers' losses before differentiating gives each teacher the gradient
        of its own loss: no parameter is shared between teachers.
        """
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps!r}")
        return self._train(TeacherState(*state), real, real_labels, fake, fake_labels,
                           num_steps)

    # ----------------------------------------------------------------- queries
    def _image_gradients_impl(self, weights: tf.Tensor, images: tf.Tensor,
                              labels: tf.Tensor) -> tf.Tensor:
        t = tf.shape(weights)[0]
        tiled = tf.tile(images[None], tf.stack([t, 1, 1, 1, 1]))
        tiled_labels = tf.tile(tf.cast(labels, images.dtype)[None], tf.stack([t, 1, 1]))
        with tf.GradientTape() as tape:
            tape.watch(tiled)
            logits = self.logits(weights, tiled, tiled_labels)
            generator_loss = tf.reduce_sum(tf.reduce_mean(tf.nn.softplus(-logits), axis=1))
        return -tape.gradient(generator_loss, tiled)

    def image_gradients(self, weights: tf.Tensor, images: tf.Tensor,
                        labels: tf.Tensor) -> tf.Tensor:
        """Every teacher's descent direction for the fake images: [T, B, H, W, C].

        g_i = -d/dx mean_b(-log D_i(x_b)), i.e. minus the gradient of the generator loss
        (BCE of D(x) against "real", averaged over the batch, as the authors do) with
        respect to each image, for the same fake batch ``images`` [B, H, W, C] with one-hot
        ``labels`` [B, K] shown to every teacher of the chunk.
        """
        return self._image_gradients(weights, images, labels)
