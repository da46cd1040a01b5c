"""What a DataLens run writes for people to use: its samples (``samples.npz``, the
authors' pickles, ``samples.png``), a re-sampling of a trained run into a new sample set,
and the per-step released votes of ``--save_vote``.

Everything here is post-processing of the released generator or the released updates,
except ``--save_raw_votes``' noise-free vote sums, which :class:`VoteWriter` marks PRIVATE.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import numpy as np

from dclens import data
from dclens.common import export
from dclens.common.rng import SeedTree, entropy_seed
from dclens.datalens import networks  # noqa: F401  (registers the generator's custom layer)
from dclens.datalens.build import image_shape_of
from dclens.datalens.config import DataLensConfig, SaveVotes
from dclens.datalens.sample import generator_function, sample_generator
from dclens.privacy import accounting
from dclens.runs.rundir import RunDirError, RunPaths, flatten, sample_set_folder

__all__ = ["VoteWriter", "new_sample_set", "sample_run", "write_sample_outputs"]

#: Samples per class row of ``samples.png`` and the TensorBoard grid.
GRID_COLUMNS = 10


RAW_VOTES_MARKER = "PRIVATE-raw-votes.txt"


class VoteWriter:
    """Writes every TopAgg round of a step to ``<run>/votes/step-<n>.npz`` (atomically).

    ``update`` float32 [rounds, B, D]: the released noisy (thresholded) update -- public.
    With ``SaveVotes.RAW_SUMS`` also ``vote_sum`` int/float [rounds, B, D]: the noise-free
    sums, a function of the private data; the run directory then holds
    :data:`RAW_VOTES_MARKER` saying it must not be published.
    """

    def __init__(self, root: str, kind: SaveVotes):
        self.folder = RunPaths(root).votes
        self.kind = kind
        self.rounds: dict[int, list] = {}
        os.makedirs(self.folder, exist_ok=True)
        if kind is SaveVotes.RAW_SUMS:
            export.atomic_write(os.path.join(root, RAW_VOTES_MARKER), lambda s: s.write(
                "This run directory holds raw, noise-free vote sums (votes/*.npz "
                "'vote_sum'): a function of the private training data without any noise.\n"
                "Do not publish it; the released updates ('update') alone are public.\n"),
                mode="w")

    def round_released(self, step, round_index, images, one_hot, vote_sum, result) -> None:
        entry = {"update": result.update.numpy().astype(np.float32)}
        if self.kind is SaveVotes.RAW_SUMS:
            entry["vote_sum"] = vote_sum.numpy()
        self.rounds.setdefault(step, []).append(entry)

    def flush_all(self) -> None:
        """Writes every step with released rounds (e.g. a step stopped by the budget after
        its first round)."""
        for step in sorted(self.rounds):
            self.flush(step)

    def flush(self, step: int) -> None:
        rounds = self.rounds.pop(step, [])
        if not rounds:
            return
        arrays = {name: np.stack([r[name] for r in rounds]) for name in rounds[0]}
        export.atomic_write(os.path.join(self.folder, f"step-{step + 1:06d}.npz"),
                            lambda s: np.savez(s, **arrays))


def class_grid(generate, shape, z_dim: int, seeds: SeedTree) -> np.ndarray:
    """A [K*H', 10*W', C] grid: row c shows GRID_COLUMNS samples of class c (fixed latents)."""
    labels = np.repeat(np.arange(shape.num_classes), GRID_COLUMNS)
    images, _ = sample_generator(generate, shape, z_dim, len(labels), seeds=seeds,
                                 seed_path=(1,), batch=len(labels), labels=labels)
    return export.image_grid(images, shape.num_classes, GRID_COLUMNS)


def write_sample_outputs(generate, shape, config: DataLensConfig, output_dir: str,
                         seeds: SeedTree, *, epsilon: float | None, batch: int,
                         log: Callable[[str], None] = print) -> dict[str, str]:
    """samples.npz, the authors' pickles and samples.png for a trained generator."""

    count = config.train.num_samples
    images, labels = sample_generator(generate, shape, config.train.z_dim, count,
                                      seeds=seeds, seed_path=(0,), batch=batch)
    run_paths = RunPaths(output_dir)
    paths = {"samples": run_paths.samples}
    export.write_samples_npz(paths["samples"], images, labels)
    pickles = export.write_authors_pickles(
        output_dir, images, labels, num_classes=shape.num_classes,
        epsilon=None if config.train.non_private else (epsilon or 0.0))
    paths["authors_pickles"] = pickles[0]
    stale = export.set_aside_other_pickle_sets(output_dir, pickles)
    if stale:
        log(f"moved {len(stale)} pickles of an earlier budget ({stale[0]} ..) to "
            f"{os.path.join(output_dir, 'superseded')}: they are not this run's samples")
    spec = data.dataset_spec(config.train.dataset)
    title = accounting.guarantee_label(epsilon, config.budget.delta,
                                       non_private=config.train.non_private,
                                       proven=config.accounting_proven,
                                       seeded=config.train.seed is not None)
    paths["grid"] = run_paths.grid
    export.write_grid_png(paths["grid"], class_grid(generate, shape, config.train.z_dim, seeds),
                          title=f"{spec.name} samples ({title})",
                          row_labels=list(spec.class_names))
    log(f"wrote {count} samples to {paths['samples']}, the authors' layout "
        f"{os.path.basename(pickles[0])}..{os.path.basename(pickles[-1])}, grid {paths['grid']}")
    return paths


def new_sample_set(output_dir: str) -> str:
    """Where a re-sampling of a trained run writes: the run directory while it holds no
    samples yet, else the first free ``<run>/samples-<n>`` (n = 2, 3, ...), so samples
    someone may already have evaluated are never overwritten."""
    if not os.path.exists(RunPaths(output_dir).samples):
        return output_dir
    number = 2
    while os.path.exists(sample_set_folder(output_dir, number)):
        number += 1
    return sample_set_folder(output_dir, number)


def sample_run(output_dir: str, *, num_samples: int | None = None, seed: int | None = None,
               expect: dict[str, object] | None = None,
               log: Callable[[str], None] = print) -> dict[str, str]:
    """Loads a trained run's generator and writes a new set of its samples (``main.py``
    without --train) into :func:`new_sample_set` (never over existing samples).

    ``expect``: settings the command line gave ({"train.dataset": ...}); a run trained
    with other values is refused by name (sampling it would label the samples wrongly).
    """
    import keras

    run_paths = RunPaths(output_dir)
    config_path, model_path = run_paths.config, run_paths.generator
    for path in (config_path, model_path):
        if not os.path.exists(path):
            raise RunDirError(f"{path} not found: train a model first (pass --train), or point "
                              "--checkpoint_dir at a finished run")
    with open(config_path) as stream:
        saved = json.load(stream)
    config = DataLensConfig.from_dict(saved["config"])
    trained = flatten(config.to_dict())
    differing = [(name, wanted, trained.get(name)) for name, wanted in (expect or {}).items()
                 if trained.get(name) != wanted]
    if differing:
        raise RunDirError(
            f"{output_dir} holds a run trained with other settings than this command gives: "
            + "; ".join(f"{name}: the run has {saved_value!r}, the command {wanted!r}"
                        for name, wanted, saved_value in differing)
            + "; drop those flags to sample the run as it was trained, or pass --train "
            "with a new --checkpoint_dir to train one (nothing was written)")
    if num_samples is not None:
        config = config.replace(train={"num_samples": num_samples})
    epsilon = None
    privacy_path = run_paths.privacy
    if os.path.exists(privacy_path):
        with open(privacy_path) as stream:
            epsilon = json.load(stream).get("epsilon", {}).get("epsilon")
    generator = keras.models.load_model(model_path)
    shape = image_shape_of(data.dataset_spec(config.train.dataset))
    seeds = SeedTree(seed if seed is not None else entropy_seed())
    target = new_sample_set(output_dir)
    if target != output_dir:
        log(f"{run_paths.samples} exists (it may have been evaluated): this set goes to "
            f"{target}; nothing is overwritten")
        os.makedirs(target)
    return write_sample_outputs(generator_function(generator), shape, config, target, seeds,
                                epsilon=epsilon,
                                batch=saved.get("batch", config.train.batch_size), log=log)
