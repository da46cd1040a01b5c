"""A whole DataLens run: data in, private generator, samples and a privacy ledger out.

:func:`train_run` is what ``scripts/main.py --train`` calls; :func:`sample_run` is what it
calls without ``--train``.  Files written in the output directory:

=========================  ====================================================
``config.json``            the resolved configuration (+ how the seed was chosen)
``privacy.json``           the ledger: delta, conversion, epsilon after every step,
                           queries, sigma, k; rewritten after every step
``generator.keras``        the student generator (Keras format)
``samples.npz``            ``x`` float32 [N, H, W, C] in [0, 1], ``y`` int64 [N]
``eps-X.XX.data-i.pkl``    the same samples in the authors' layout (10 files)
``samples.png``            a sample grid, one row per class
``logs/``                  TensorBoard: epsilon, losses, pass fraction, sample grids
=========================  ====================================================
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import Callable

import numpy as np

from dclens import accounting, data, export
from dclens.config import DataLensConfig
from dclens.rng import SeedTree, entropy_seed

NOT_PRIVATE_WARNING = ("*** --non_private: NO differential privacy. This run's generator and "
                       "samples are NOT private; use them for debugging only. ***")
REPRODUCIBLE_NOISE_WARNING = (
    "--seed fixes the DP noise: anyone who knows the seed can reproduce and subtract it. "
    "Use seeded runs for tests and debugging; do not publish their outputs as private.")
GRID_COLUMNS = 10


class RunDirError(RuntimeError):
    """The output directory cannot be used for this run."""


@dataclasses.dataclass(frozen=True)
class RunSummary:
    steps: int
    queries: int
    epsilon: float | None
    stop_reason: str
    output_dir: str
    seconds: float


def _check_output_dir(path: str) -> None:
    """Refuses a directory that holds a run or cannot be written; creates nothing."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunDirError(f"--checkpoint_dir {path!r} exists and is not a directory; "
                          "choose another path")
    existing = [name for name in ("config.json", "privacy.json")
                if os.path.exists(os.path.join(path, name))]
    if existing:
        raise RunDirError(f"--checkpoint_dir {path!r} already holds a run ({', '.join(existing)}); "
                          "choose a new directory (nothing was changed)")
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise RunDirError(f"--checkpoint_dir {path!r} is not writable ({ancestor!r} is not "
                          "writable); choose a writable directory")


def load_training_data(config: DataLensConfig) -> data.LabeledImages:
    """The private training split named by the config (first ``max_records`` if set)."""
    return data.load_dataset(config.train.dataset, config.train.data_dir, split="train",
                             limit=config.train.max_records)


def privacy_record(lens, config: DataLensConfig, curve: list[dict], stop_reason: str | None,
                   seeded: bool) -> dict:
    """The JSON ledger of a run (see module docstring)."""
    record = {
        "private": not config.train.non_private,
        "reproducible_noise": seeded,
        "delta": config.budget.delta,
        "max_eps": config.budget.max_eps,
        "conversion": config.budget.conversion.value,
        "sigma": config.topagg.sigma,
        "topk": config.topagg.topk,
        "noise_multiplier": (config.topagg.noise_multiplier if config.topagg.sigma > 0
                             else None),
        "num_teachers": config.train.num_teachers,
        "queries_per_round": lens.batch,
        "queries": lens.ledger.queries,
        "steps": lens.step,
        "epsilon_per_step": curve,
        "stop_reason": stop_reason,
        "ledger": lens.ledger.state_dict(),
    }
    if config.train.non_private:
        record["warning"] = NOT_PRIVATE_WARNING
    elif lens.ledger.queries:
        record["epsilon"] = lens.ledger.epsilon().to_dict()
        record["epsilon_all_conversions"] = {
            conversion.value: other_conversion(lens.ledger, conversion).epsilon().to_dict()
            for conversion in accounting.Conversion}
    return record


def other_conversion(ledger: accounting.PrivacyLedger,
                     conversion: accounting.Conversion) -> accounting.PrivacyLedger:
    """The same spends, converted with ``conversion`` (default orders of that conversion)."""
    state = dict(ledger.state_dict())
    if conversion is not ledger.conversion:
        state["conversion"] = conversion.value
        state["orders"] = list(accounting.CLASSIC_ORDERS if conversion is
                               accounting.Conversion.CLASSIC else accounting.DP_ACCOUNTING_ORDERS)
    return accounting.PrivacyLedger.from_state_dict(state)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in requirements.txt
        return None
    return tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr)


def train_run(config: DataLensConfig, output_dir: str, *, progress: bool = True,
              log: Callable[[str], None] = print) -> RunSummary:
    """Trains DataLens with ``config`` and writes every output into ``output_dir``."""
    import tensorflow as tf

    from dclens.train import BudgetExhausted, DataLens

    started = time.perf_counter()
    _check_output_dir(output_dir)      # before the (slow) data loading
    seeded = config.train.seed is not None
    if config.train.non_private:
        log(NOT_PRIVATE_WARNING)
    elif seeded:
        log("warning: " + REPRODUCIBLE_NOISE_WARNING)
    root_seed = config.train.seed if seeded else entropy_seed()
    dataset = load_training_data(config)
    lens = DataLens(config, dataset, root_seed=root_seed)
    _check_output_dir(output_dir)      # again: another run may have started meanwhile
    os.makedirs(output_dir, exist_ok=True)
    export.write_json(os.path.join(output_dir, "config.json"), {
        "config": config.to_dict(), "dataset_source": dataset.source,
        "records": len(dataset.labels), "partition_size": lens.partition_size,
        "batch": lens.batch, "steps_per_epoch": lens.steps_per_epoch,
        "seed_from_os_entropy": not seeded, "reproducible_noise": seeded,
        "private": not config.train.non_private})
    log(f"{dataset.spec.name}: {len(dataset.labels)} records, {config.train.num_teachers} "
        f"teachers x {lens.partition_size} records, batch {lens.batch}, "
        f"{lens.batch * config.train.g_step} queries per step; output in {output_dir}")

    writer = tf.summary.create_file_writer(os.path.join(output_dir, "logs"))
    total_steps = config.train.epochs * lens.steps_per_epoch
    expected_steps = total_steps
    if not config.train.non_private:
        # Steps the budget allows (g_step rounds of B queries each): the progress bar's end.
        expected_steps = min(total_steps, accounting.max_steps_within(
            sigma=config.topagg.sigma, topk=config.topagg.topk,
            queries_per_step=lens.batch * config.train.g_step, max_eps=config.budget.max_eps,
            delta=config.budget.delta, conversion=config.budget.conversion,
            orders=lens.ledger.orders))
        log(f"the budget epsilon <= {config.budget.max_eps:g} allows {expected_steps} steps "
            f"({config.budget.conversion.value} conversion)")
    bar = _progress(expected_steps, progress)
    curve: list[dict] = []
    stop_reason = "epochs"
    privacy_path = os.path.join(output_dir, "privacy.json")
    grid_every = max(1, min(50, expected_steps // 10))
    while lens.step < total_steps:
        try:
            record = lens.train_step()
        except BudgetExhausted:
            stop_reason = "budget"
            break
        if record.queries:
            curve.append({"step": record.step + 1, "queries": lens.ledger.queries,
                          "epsilon": record.epsilon})
        export.write_json(privacy_path, privacy_record(lens, config, curve, None, seeded))
        with writer.as_default(step=record.step + 1):
            if record.epsilon is not None:
                tf.summary.scalar("privacy/epsilon", record.epsilon)
            tf.summary.scalar("loss/teacher", record.teacher_loss)
            tf.summary.scalar("loss/student", record.student_loss)
            tf.summary.scalar("votes/pass_fraction", record.pass_fraction)
            tf.summary.scalar("time/seconds_per_step", record.seconds)
            if (record.step + 1) % grid_every == 0:
                tf.summary.image("samples/by_class", class_grid(
                    lens.generate, lens.shape, config.train.z_dim, lens.seeds)[None])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(eps=("n/a" if record.epsilon is None else f"{record.epsilon:.4f}"),
                            d_loss=f"{record.teacher_loss:.3f}",
                            g_loss=f"{record.student_loss:.3g}",
                            passed=f"{record.pass_fraction:.3f}")
        if not (math.isfinite(record.teacher_loss) and math.isfinite(record.student_loss)):
            stop_reason = "non-finite loss"
            log(f"step {record.step + 1}: a loss is not finite (teacher {record.teacher_loss}, "
                f"student {record.student_loss}); stopping. The ledger in privacy.json counts "
                f"every query made so far.")
            break
    if bar is not None:
        bar.close()
    writer.flush()

    epsilon = None if config.train.non_private or not lens.ledger.queries \
        else lens.ledger.epsilon().epsilon
    export.write_json(privacy_path, privacy_record(lens, config, curve, stop_reason, seeded))
    lens.generator.save(os.path.join(output_dir, "generator.keras"))
    write_sample_outputs(lens.generate, lens.shape, config, output_dir, lens.seeds,
                         epsilon=epsilon, batch=lens.batch, log=log)
    with writer.as_default(step=lens.step):
        tf.summary.image("samples/by_class", class_grid(
                    lens.generate, lens.shape, config.train.z_dim, lens.seeds)[None])
    writer.flush()
    summary = RunSummary(lens.step, lens.ledger.queries, epsilon, stop_reason, output_dir,
                         time.perf_counter() - started)
    spent = ("NOT PRIVATE (--non_private)" if epsilon is None and config.train.non_private
             else f"epsilon = {epsilon:.4f} at delta = {config.budget.delta:g} "
                  f"({config.budget.conversion.value} conversion)" if epsilon is not None
             else "epsilon = 0 (no query was made)")
    log(f"done: {summary.steps} steps, {summary.queries} TopAgg queries, stopped by "
        f"{stop_reason}; {spent}; {summary.seconds:.0f} s. Outputs in {output_dir}")
    return summary


def class_grid(generate, shape, z_dim: int, seeds: SeedTree) -> np.ndarray:
    """A [K*H', 10*W', C] grid: row c shows GRID_COLUMNS samples of class c (fixed latents)."""
    from dclens.train import sample_generator

    labels = np.repeat(np.arange(shape.num_classes), GRID_COLUMNS)
    images, _ = sample_generator(generate, shape, z_dim, len(labels), seeds=seeds,
                                 seed_path=(1,), batch=len(labels), labels=labels)
    return export.image_grid(images, shape.num_classes, GRID_COLUMNS)


def write_sample_outputs(generate, shape, config: DataLensConfig, output_dir: str,
                         seeds: SeedTree, *, epsilon: float | None, batch: int,
                         log: Callable[[str], None] = print) -> dict[str, str]:
    """samples.npz, the authors' pickles and samples.png for a trained generator."""
    from dclens.train import sample_generator

    count = config.train.num_samples
    images, labels = sample_generator(generate, shape, config.train.z_dim, count,
                                      seeds=seeds, seed_path=(0,), batch=batch)
    paths = {"samples": os.path.join(output_dir, "samples.npz")}
    export.write_samples_npz(paths["samples"], images, labels)
    pickles = export.write_authors_pickles(
        output_dir, images, labels, num_classes=shape.num_classes,
        epsilon=None if config.train.non_private else (epsilon or 0.0))
    paths["authors_pickles"] = pickles[0]
    spec = data.dataset_spec(config.train.dataset)
    title = ("NOT PRIVATE" if config.train.non_private
             else f"epsilon={epsilon:.3f}, delta={config.budget.delta:g}" if epsilon is not None
             else "no query made")
    paths["grid"] = os.path.join(output_dir, "samples.png")
    export.write_grid_png(paths["grid"], class_grid(generate, shape, config.train.z_dim, seeds),
                          title=f"{spec.name} samples ({title})",
                          row_labels=list(spec.class_names))
    log(f"wrote {count} samples to {paths['samples']}, the authors' layout "
        f"{os.path.basename(pickles[0])}..{os.path.basename(pickles[-1])}, grid {paths['grid']}")
    return paths


def sample_run(output_dir: str, *, num_samples: int | None = None, seed: int | None = None,
               log: Callable[[str], None] = print) -> dict[str, str]:
    """Loads a trained run's generator and writes its samples again (``main.py`` w/o --train)."""
    import json

    import keras

    from dclens import networks  # noqa: F401  (registers the custom layer for loading)
    from dclens.train import generator_function, image_shape_of

    config_path = os.path.join(output_dir, "config.json")
    model_path = os.path.join(output_dir, "generator.keras")
    for path in (config_path, model_path):
        if not os.path.exists(path):
            raise RunDirError(f"{path} not found: train a model first (pass --train), or point "
                              "--checkpoint_dir at a finished run")
    with open(config_path) as stream:
        saved = json.load(stream)
    config = DataLensConfig.from_dict(saved["config"])
    if num_samples is not None:
        config = config.replace(train={"num_samples": num_samples})
    epsilon = None
    privacy_path = os.path.join(output_dir, "privacy.json")
    if os.path.exists(privacy_path):
        with open(privacy_path) as stream:
            epsilon = json.load(stream).get("epsilon", {}).get("epsilon")
    generator = keras.models.load_model(model_path)
    shape = image_shape_of(data.dataset_spec(config.train.dataset))
    seeds = SeedTree(seed if seed is not None else entropy_seed())
    return write_sample_outputs(generator_function(generator), shape, config, output_dir, seeds, epsilon=epsilon,
                                batch=saved.get("batch", config.train.batch_size), log=log)
