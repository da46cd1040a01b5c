"""Building a DataLens run's parts from its config: the training data, the teacher
partitions, the teacher ensemble and its bank's place in RAM or on disk, and the TopAgg
mechanism.  Shared by the in-process run (:mod:`dclens.datalens.train`) and the shard
workers (:mod:`dclens.datalens.shard_worker`), so neither imports the other."""

from __future__ import annotations

import os

import numpy as np

from dclens.datalens import teacher_bank
from dclens import data
from dclens.data import splits
from dclens.datalens import networks, teachers, topagg
from dclens.datalens.config import DataLensConfig
from dclens.datalens.fast_ensemble import FastTeacherEnsemble


def load_training_data(config: DataLensConfig) -> data.LabeledImages:
    """The private training records named by the config: its ``training_records`` of the
    dataset's training split, the first ``max_records`` of them if set."""
    return splits.load_training_records(config.train.dataset, config.train.data_dir,
                                        config.train.training_records,
                                        limit=config.train.max_records)


#: Teacher ensemble implementations (same results within float32 round-off).
ENSEMBLES = {"fast": FastTeacherEnsemble, "reference": teachers.TeacherEnsemble}


#: Disjoint partitions of a shuffled order of the record indices (the default; the
#: authors' ``--noshuffle``): :func:`dclens.data.index_partition`.
contiguous_partition = data.index_partition


def image_shape_of(spec: data.DatasetSpec) -> networks.ImageShape:
    return networks.ImageShape(spec.height, spec.width, spec.channels, spec.num_classes)


def physical_memory_bytes() -> int:
    """Total RAM of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_bank_ram_bytes() -> int:
    """RAM a teacher bank may take by default: half of this machine's."""
    return physical_memory_bytes() // 2


def teacher_width(config: DataLensConfig) -> networks.DiscriminatorWidth:
    """The teachers' discriminator width the config asks for (the authors' by default)."""
    return networks.DiscriminatorWidth(config.train.teacher_filters, config.train.teacher_dense)


def teacher_layout(config: DataLensConfig, shape: networks.ImageShape) -> teachers.ParamLayout:
    """Where each weight of one of the config's teachers sits in its parameter row."""
    return teachers.ParamLayout.for_shape(shape, teacher_width(config))


def bank_location(config: DataLensConfig, directory: str, *,
                  ram_budget: int | None = None) -> str | None:
    """Where a run's teacher bank should live: None (RAM) if its weights and Adam moments
    fit in ``ram_budget`` bytes (default :func:`default_bank_ram_bytes`), else
    ``directory`` (disk-backed, streamed chunk by chunk; the folder is created by the
    bank, which then keeps as many teachers in RAM as the budget allows)."""
    spec = data.dataset_spec(config.train.dataset)
    layout = teacher_layout(config, image_shape_of(spec))
    budget = default_bank_ram_bytes() if ram_budget is None else ram_budget
    return None if teacher_bank.bank_bytes(layout, config.train.num_teachers) <= budget \
        else directory


def run_partitions(config: DataLensConfig, labels: np.ndarray, num_classes: int
                   ) -> np.ndarray:
    """The config's teacher partitions, int [num_teachers, m] indices into the records
    (index partition by default, class-balanced with ``balanced_partition``)."""
    train_cfg = config.train
    if train_cfg.balanced_partition:
        return data.partition(labels, train_cfg.num_teachers, num_classes=num_classes,
                              seed=train_cfg.partition_seed)
    return contiguous_partition(len(labels), train_cfg.num_teachers,
                                seed=train_cfg.partition_seed)


def build_ensemble(config: DataLensConfig, shape: networks.ImageShape, ensemble: str):
    """The teacher ensemble implementation named ``ensemble`` (see :data:`ENSEMBLES`)."""
    if ensemble not in ENSEMBLES:
        raise ValueError(f"unknown ensemble {ensemble!r}; use one of {sorted(ENSEMBLES)}")
    train_cfg = config.train
    options = {"conv_path": train_cfg.conv_path} if ensemble == "fast" else {}
    return ENSEMBLES[ensemble](shape, learning_rate=train_cfg.learning_rate,
                               beta1=train_cfg.beta1, class_guidance=train_cfg.class_guidance,
                               class_guidance_form=train_cfg.class_guidance_form,
                               width=teacher_width(config), **options)


def build_topagg(config: DataLensConfig, shape: networks.ImageShape) -> topagg.TopAgg:
    """The run's aggregation mechanism."""
    return topagg.TopAgg(config.topagg, num_teachers=config.train.num_teachers,
                         allow_no_noise=config.train.non_private, dim=shape.dim)


def resident_rows(layout: teachers.ParamLayout, bank_ram_bytes: int | None) -> int:
    """Teachers whose state fits in ``bank_ram_bytes`` (default
    :func:`default_bank_ram_bytes`): the rows of a disk bank kept in RAM."""
    budget = default_bank_ram_bytes() if bank_ram_bytes is None else bank_ram_bytes
    return budget // teacher_bank.bank_bytes(layout, 1)
