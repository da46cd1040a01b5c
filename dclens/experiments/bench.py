"""Seconds per generator step of named configurations, by phase (``scripts/bench.py``).

A benchmark builds a :class:`dclens.datalens.train.DataLens` on synthetic data of the right shapes
(uniform random images, labels cycling through the classes; the cost of a step does not
depend on the pixel values), runs ``warmup`` generator steps, then times ``steps`` more,
each split into the phases of :mod:`dclens.common.profiling`.  Teachers are trained with
``d_step`` Adam steps every step (``pretrain_teacher`` is set to 0: the paper's 10 first-
epoch steps are a one-off, not the steady state).

A paper-scale ensemble may take minutes per step here, so a benchmark can measure fewer
teachers (``measure_teachers``) and extrapolate *linearly* to the configuration's count:
the phases whose work is per teacher (teacher training, image gradients, voting, teacher
state I/O) are scaled by N / N_measured, the others (generator forwards, noise, student
update, the rest) are kept.  Such results are labelled ``"extrapolated"`` in the output,
with the measured per-teacher seconds they come from.

FLOPs are the paper algorithm's, counted from the architecture (docs/design.md): a
teacher train step is 3 forward passes' worth (forward, input and weight gradients) on the
2B real and fake images, an image-gradient pass 2 forward passes' worth on B images, with
the discriminator as written (label maps concatenated; the fast path skips some of these
multiply-adds, so it reaches more than the achieved rate shown).  One multiply-add = 2 FLOP.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from dclens.datalens import teacher_bank
from dclens import data
from dclens.datalens import networks, teacher_conv, teachers
from dclens.datalens.config import Aggregation, ConvPath, DataLensConfig, preset
from dclens.common.profiling import BACKGROUND_IO, PHASES, PhaseTimer
from dclens.datalens.build import default_bank_ram_bytes, image_shape_of, physical_memory_bytes
from dclens.datalens.train import BudgetExhausted, DataLens, TeacherPlacement

#: Phases whose work is proportional to the number of teachers.
PER_TEACHER_PHASES = ("teacher_training", "image_gradients", "voting", "teacher_io",
                      BACKGROUND_IO)
GIB = 2 ** 30
#: The epsilon budget of a benchmark that names its aggregation: a timing, not a private run.
LIFTED_BUDGET_EPS = 1e6


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """A named benchmark: a paper preset with a teacher count and partition size.

    ``partition_size`` is the records per teacher of the real data set (Fashion-MNIST: 60000
    training images; CelebA-gender train split: 162770), which fixes the batch
    B = min(30, partition size).
    """

    name: str
    preset: str
    num_teachers: int
    partition_size: int
    description: str


SPECS = {spec.name: spec for spec in (
    BenchSpec("fmnist-eps1-4000", "fashion_mnist-eps1", 4000, 60000 // 4000,
              "paper config: Fashion-MNIST eps=1, 4000 teachers, B=15"),
    BenchSpec("fmnist-200", "fashion_mnist-eps1", 200, 60000 // 200,
              "Fashion-MNIST eps=1 mechanism with 200 teachers, B=30"),
    BenchSpec("celeba-gender-64x64", "celebA-gender-eps1", 60, 162770 // 60,
              "CelebA-gender 64x64x3 with a reduced ensemble of 60 teachers, B=30"),
    BenchSpec("celeba-gender-4000", "celebA-gender-eps1", 4000, 162770 // 4000,
              "CelebA-gender 64x64x3 with 4000 teachers, B=30"),
    BenchSpec("celeba-gender-6000", "celebA-gender-eps1", 6000, 162770 // 6000,
              "paper config: CelebA-gender eps=1, 6000 teachers, B=27"),
)}


# --------------------------------------------------------------------------- FLOPs
def teacher_forward_macs(shape: networks.ImageShape) -> int:
    """Multiply-adds of one teacher discriminator forward pass on one image (as written,
    label maps included; biases, batch norm and activations not counted)."""
    entries = dict(networks.discriminator_weight_shapes(shape))
    h1, w1 = -(-shape.height // 2), -(-shape.width // 2)
    h2, w2 = -(-h1 // 2), -(-w1 // 2)
    conv0, conv1 = entries["conv0/kernel"], entries["conv1/kernel"]
    return (h1 * w1 * int(np.prod(conv0)) + h2 * w2 * int(np.prod(conv1))
            + int(np.prod(entries["dense2/kernel"])) + int(np.prod(entries["dense3/kernel"])))


def generator_forward_macs(shape: networks.ImageShape, z_dim: int) -> int:
    """Multiply-adds of one generator forward pass on one image (dense and transposed
    convolutions; a 5x5 stride-2 transposed convolution costs 25 Cin Cout per input pixel)."""
    k, gf, gfc = shape.num_classes, networks.GENERATOR_FILTERS, networks.GENERATOR_DENSE
    h4, w4 = shape.height // 4, shape.width // 4
    return ((z_dim + k) * gfc + (gfc + k) * 2 * gf * h4 * w4
            + h4 * w4 * (2 * gf + k) * 25 * 2 * gf
            + 4 * h4 * w4 * (2 * gf + k) * 25 * shape.channels)


def step_flops(shape: networks.ImageShape, *, num_teachers: int, batch: int, d_step: int,
               g_step: int, z_dim: int) -> dict[str, float]:
    """FLOPs of one generator step of the paper algorithm, by part."""
    teacher = teacher_forward_macs(shape)
    gen = generator_forward_macs(shape, z_dim)
    return {
        "teacher_training": 2.0 * num_teachers * d_step * 3 * 2 * batch * teacher,
        "image_gradients": 2.0 * num_teachers * g_step * 2 * batch * teacher,
        # teacher fakes for K classes, the query batches, the student's forward + backward
        "generator": 2.0 * gen * batch * (shape.num_classes + g_step + 3 * g_step),
    }


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``run`` after one untimed call (tracing,
    caches)."""
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> dict[str, float]:
    """float32 GFLOP/s of an n x n x n tf.linalg.matmul (median and best of ``repeats``)."""
    rng = np.random.default_rng(0)
    a = tf.constant(rng.standard_normal((n, n), np.float32))
    b = tf.constant(rng.standard_normal((n, n), np.float32))
    matmul = tf.function(tf.linalg.matmul)
    matmul(a, b).numpy()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        matmul(a, b).numpy()
        seconds.append(time.perf_counter() - started)
    flop = 2.0 * n ** 3
    return {"n": n, "median_gflops": flop / statistics.median(seconds) / 1e9,
            "best_gflops": flop / min(seconds) / 1e9}


# --------------------------------------------------------------------------- memory
def reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS mark of this process (Linux); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as stream:
            stream.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set since the last :func:`reset_peak_rss` (or process start)."""
    try:
        with open("/proc/self/status") as stream:
            for line in stream:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --------------------------------------------------------------------------- running
def synthetic_dataset(dataset: str, records: int, *, seed: int) -> data.LabeledImages:
    """``records`` uniform random images of ``dataset``'s shape, labels cycling classes."""
    spec = data.dataset_spec(dataset)
    rng = np.random.default_rng(seed)
    images = rng.random((records, *spec.image_shape), dtype=np.float32)
    labels = np.arange(records, dtype=np.int64) % spec.num_classes
    return data.LabeledImages(images, labels, spec, source=f"synthetic (seed {seed})")


def bench_config(spec: BenchSpec, *, measured_teachers: int, chunk: int | None,
                 conv_path: str = "auto",
                 aggregation: Aggregation | None = None) -> DataLensConfig:
    """The preset with ``measured_teachers`` teachers, steady-state d_step, given chunk;
    with ``aggregation``, that mechanism instead of the preset's (the paper's Table 6
    compares their cost). The preset's sigma is kept; since a mechanism of larger
    sensitivity (FetchSGD's proven one) may spend the preset's budget in fewer steps than a
    benchmark times, a named aggregation also lifts the budget to
    :data:`LIFTED_BUDGET_EPS` (noise does not change the cost; the output says so)."""
    config = preset(spec.preset)
    train = {"num_teachers": measured_teachers, "pretrain_teacher": 0,
             "balanced_partition": False, "seed": 0, "conv_path": ConvPath(conv_path)}
    if chunk is not None:
        train["teacher_chunk"] = chunk
    config = config.replace(train=train)
    if aggregation is not None:
        config = config.replace(topagg={"method": aggregation},
                                budget={"max_eps": LIFTED_BUDGET_EPS})
    return config


def _median_phases(steps: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({name for step in steps for name in step})
    return {name: statistics.median(step.get(name, 0.0) for step in steps) for name in names}


def _with_totals(phases: dict[str, float], seconds: float) -> dict[str, float]:
    out = dict(phases)
    out["voting_noise"] = phases.get("voting", 0.0) + phases.get("noise", 0.0)
    accounted = sum(phases.get(name, 0.0) for name in PHASES)
    out["other"] = max(seconds - accounted, 0.0)
    return out


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """How a benchmark runs a configuration (what it measures is the spec's).

    Attributes:
      measured_teachers: teachers actually run (default: all of the spec's).
      chunk: teachers per chunk (default: the preset's).
      bank: ``"ram"``, ``"disk"`` or ``"auto"`` (disk if the measured bank exceeds
        ``ram_budget``, default half the RAM).
      bank_dir: folder for a disk bank (default: a temporary folder, removed afterwards).
      ensemble: ``"fast"`` or ``"reference"``.
      overlap_io: stream a disk bank in a background thread.
      bank_direct_io: a disk bank's I/O past the page cache (False: through it; None: past
        it where the file system allows; True: past it or fail).
      ram_budget: the RAM a bank may take before ``"auto"`` puts it on disk.
      bank_ram_bytes: RAM tier of a disk bank (default: half the RAM; 0 = all on disk).
      conv_path: the teachers' path (``auto``, ``fused``, ``grouped``, ``per_teacher``).
      aggregation: the vote mechanism (default: the preset's, the paper's TopAgg).
      peak_gflops: the matmul peak measured in the same run, for the fraction of peak.
    """

    measured_teachers: int | None = None
    chunk: int | None = None
    bank: str = "auto"
    bank_dir: str | None = None
    ensemble: str = "fast"
    overlap_io: bool = True
    bank_direct_io: bool | None = None
    ram_budget: int | None = None
    bank_ram_bytes: int | None = None
    conv_path: str = "auto"
    aggregation: Aggregation | None = None
    peak_gflops: float | None = None


def run_bench(spec: BenchSpec, *, steps: int, warmup: int,
              options: BenchOptions = BenchOptions()) -> dict[str, Any]:
    """Times ``steps`` generator steps of ``spec`` after ``warmup`` ones (see module doc)."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got {steps}, {warmup}")
    measured = options.measured_teachers or spec.num_teachers
    if not 1 <= measured <= spec.num_teachers:
        raise ValueError(f"measured teachers must be in [1, {spec.num_teachers}], "
                         f"got {measured}")
    config = bench_config(spec, measured_teachers=measured, chunk=options.chunk,
                          conv_path=options.conv_path, aggregation=options.aggregation)
    shape = image_shape_of(data.dataset_spec(config.train.dataset))
    layout = teachers.ParamLayout.for_shape(shape)
    needed = teacher_bank.bank_bytes(layout, measured)
    budget = default_bank_ram_bytes() if options.ram_budget is None else options.ram_budget
    on_disk = options.bank == "disk" or (options.bank == "auto" and needed > budget)
    result: dict[str, Any] = {"config": spec.name, "description": spec.description,
                              "preset": spec.preset,
                              "aggregation": config.topagg.method.value,
                              "budget_eps": config.budget.max_eps}
    bank_dir, temporary = options.bank_dir, None
    if on_disk and bank_dir is None:
        temporary = tempfile.TemporaryDirectory(prefix="dclens-bank-", dir=os.getcwd())
        bank_dir = temporary.name
    try:
        reset_peak_rss()
        dataset = synthetic_dataset(config.train.dataset, measured * spec.partition_size,
                                    seed=0)
        timer = PhaseTimer()
        started = time.perf_counter()
        lens = DataLens(config, dataset, root_seed=0, timer=timer,
                        placement=TeacherPlacement(ensemble=options.ensemble,
                                                   overlap_io=options.overlap_io,
                                                   bank_direct_io=options.bank_direct_io,
                                                   bank_dir=bank_dir if on_disk else None,
                                                   bank_ram_bytes=options.bank_ram_bytes))
        setup_seconds = time.perf_counter() - started
        timed = _time_steps(lens, timer, warmup=warmup, steps=steps)
        if not timed.seconds:
            raise RuntimeError(f"{spec.name}: the privacy budget allowed no timed step")
        step_seconds = statistics.median(timed.seconds)
        phases = _with_totals(_median_phases(timed.phases), step_seconds)
        result["measured"] = {
            "num_teachers": measured, "teacher_chunk": config.train.teacher_chunk,
            "batch": lens.batch, "d_step": config.train.d_step, "g_step": config.train.g_step,
            "ensemble": options.ensemble,
            **({"conv": teacher_conv.describe(lens.ensemble.conv_path)}
               if options.ensemble == "fast" else {}),
            "bank": "disk" if on_disk else "ram",
            "bank_gib": needed / GIB, "io_overlapped": options.overlap_io,
            "bank_direct_io": lens.bank.direct_io if on_disk else None,
            "bank_resident_teachers": (lens.bank.resident_rows if on_disk else measured),
            "setup_seconds": setup_seconds, "warmup_steps": warmup,
            "timed_steps": len(timed.seconds), "stopped_by_budget": timed.budget_stop,
            "seconds_per_step_each": timed.seconds, "seconds_per_step_median": step_seconds,
            # CPU seconds of all this process's threads; / (wall x cores) < 1 shows how
            # much of the machine other processes took (or how idle the cores were)
            "cpu_seconds_per_step_median": statistics.median(timed.cpu_seconds),
            "cpu_share_of_machine": statistics.median(timed.cpu_seconds)
            / (step_seconds * (os.cpu_count() or 1)),
            "phases_median_seconds": phases,
            "teacher_train_steps_per_second":
                measured * config.train.d_step / max(phases.get("teacher_training", 0), 1e-9),
            "peak_rss_gib": peak_rss_bytes() / GIB,
        }
        result["measured"].update(_flop_rates(shape, config, lens.batch, measured,
                                              step_seconds, phases, options.peak_gflops))
        if measured != spec.num_teachers:
            result["extrapolated"] = extrapolate(
                phases, step_seconds, measured=measured, target=spec.num_teachers,
                layout=layout, shape=shape, config=config, batch=lens.batch,
                peak_gflops=options.peak_gflops)
        del lens
    finally:
        if temporary is not None:
            temporary.cleanup()
    return result


@dataclasses.dataclass
class _Timed:
    """The timed steps of a benchmark: wall and CPU seconds and per-phase seconds each."""

    seconds: list[float]
    cpu_seconds: list[float]
    phases: list[dict[str, float]]
    budget_stop: bool


def _time_steps(lens: DataLens, timer: PhaseTimer, *, warmup: int, steps: int) -> _Timed:
    """``warmup`` untimed then ``steps`` timed generator steps (fewer if the budget ends)."""
    timed = _Timed([], [], [], False)
    for index in range(warmup + steps):
        timer.take()
        cpu_started = time.process_time()
        try:
            record = lens.train_step()
        except BudgetExhausted:
            timed.budget_stop = True
            break
        phases = timer.take()
        if index >= warmup:
            timed.seconds.append(record.seconds)
            timed.phases.append(phases)
            timed.cpu_seconds.append(time.process_time() - cpu_started)
    return timed


def _flop_rates(shape, config: DataLensConfig, batch: int, num_teachers: int,
                step_seconds: float, phases: dict[str, float],
                peak_gflops: float | None) -> dict[str, float]:
    flops = step_flops(shape, num_teachers=num_teachers, batch=batch,
                       d_step=config.train.d_step, g_step=config.train.g_step,
                       z_dim=config.train.z_dim)
    teacher_flops = flops["teacher_training"] + flops["image_gradients"]
    teacher_seconds = phases.get("teacher_training", 0.0) + phases.get("image_gradients", 0.0)
    out = {"gflop_per_step": sum(flops.values()) / 1e9,
           "achieved_gflops": sum(flops.values()) / step_seconds / 1e9,
           "teacher_compute_gflops": teacher_flops / max(teacher_seconds, 1e-9) / 1e9}
    if peak_gflops:
        add_peak_fractions(out, peak_gflops)
    return out


def add_peak_fractions(rates: dict[str, Any], peak_gflops: float) -> None:
    """Adds the achieved rates as fractions of a measured matmul peak."""
    rates["matmul_peak_gflops_used"] = peak_gflops
    rates["fraction_of_matmul_peak"] = rates["achieved_gflops"] / peak_gflops
    rates["teacher_compute_fraction_of_peak"] = rates["teacher_compute_gflops"] / peak_gflops


def extrapolate(phases: dict[str, float], step_seconds: float, *, measured: int, target: int,
                layout: teachers.ParamLayout, shape: networks.ImageShape,
                config: DataLensConfig, batch: int,
                peak_gflops: float | None) -> dict[str, Any]:
    """Linear extrapolation of a measured step to ``target`` teachers (see module doc)."""
    scale = target / measured
    per_teacher = {name: phases.get(name, 0.0) / measured for name in PER_TEACHER_PHASES}
    out_phases = {name: (value * scale if name in PER_TEACHER_PHASES else value)
                  for name, value in phases.items() if name != "voting_noise"}
    main_phases = [name for name in PHASES if name in out_phases]
    seconds = sum(out_phases[name] for name in main_phases) + out_phases.get("other", 0.0)
    out_phases["voting_noise"] = out_phases.get("voting", 0.0) + out_phases.get("noise", 0.0)
    bank = teacher_bank.bank_bytes(layout, target)
    out = {"label": f"extrapolated linearly from {measured} measured teachers",
           "num_teachers": target, "seconds_per_step": seconds,
           "phases_seconds": out_phases, "per_teacher_seconds_measured": per_teacher,
           "teacher_train_steps_per_second":
               target * config.train.d_step / max(out_phases.get("teacher_training", 0), 1e-9),
           "bank_gib": bank / GIB,
           "bank_fits_in_half_ram": bank <= physical_memory_bytes() // 2,
           "note": ("teacher I/O is extrapolated from the measured bank; a bank larger "
                    "than RAM streams from disk at the disk's speed (see teacher_io of a "
                    "full-size measurement)")}
    out.update(_flop_rates(shape, config, batch, target, seconds, out_phases, peak_gflops))
    return out


def disk_status(directory: str, spec: BenchSpec) -> dict[str, Any]:
    """Whether ``spec``'s full bank fits on the disk holding ``directory``."""
    shape = image_shape_of(data.dataset_spec(preset(spec.preset).train.dataset))
    needed = teacher_bank.bank_file_bytes(teachers.ParamLayout.for_shape(shape),
                                          spec.num_teachers)       # padded rows on disk
    free = shutil.disk_usage(directory).free
    return {"bank_gib": needed / GIB, "disk_free_gib": free / GIB, "fits_on_disk": needed < free}
