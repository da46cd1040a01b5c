"""The shared configuration of a side-by-side run (the authors' flag names where they
have one) and the class-balanced subset both sides train on."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dclens.datalens.config import (Aggregation, BudgetConfig, DataLensConfig, FakeRendering,
                                    TopAggConfig, TrainConfig)


class SideBySideError(RuntimeError):
    """The side-by-side configuration cannot be run as given."""


@dataclasses.dataclass(frozen=True)
class SideBySideConfig:
    """The shared configuration (the authors' flag names where they have one).

    ``records`` per teacher; the batch is min(batch_size, records) and every generator step
    takes the next batch of each partition (with records <= batch_size, one step per epoch,
    so ``steps`` >= 2 covers the pretrain epoch and ordinary epochs).

    ``stochastic`` and ``threshold`` choose the aggregation (:attr:`method`): with
    ``threshold`` the authors' ``--signsgd`` (their ``signsgd_aggregate``: the noisy vote
    sum thresholded at +-thresh x teachers), without it their ``--signsgd_nothresh``
    (``signsgd_aggregate_no_thresh``: the noisy vote sum / topk, ``thresh`` unused); the
    sign is stochastic or deterministic as their ``--stochastic`` says.
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
    threshold: bool = True
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
        for name in ("stochastic", "threshold"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise SideBySideError(f"{name} must be True or False, got {value!r}")

    @property
    def batch(self) -> int:
        return min(self.batch_size, self.records)

    @property
    def steps_per_epoch(self) -> int:
        return self.records // self.batch

    @property
    def epochs(self) -> int:
        return math.ceil(self.steps / self.steps_per_epoch)

    @property
    def method(self) -> Aggregation:
        """dclens' aggregation for the authors' ``--stochastic`` and ``--signsgd`` (with
        ``threshold``) or ``--signsgd_nothresh`` (without)."""
        if self.threshold:
            return (Aggregation.TOPK_STOCHASTIC_SIGN if self.stochastic
                    else Aggregation.TOPK_SIGN)
        return Aggregation.NO_THRESHOLD if self.stochastic else Aggregation.NO_THRESHOLD_SIGN

    def dclens_config(self) -> DataLensConfig:
        method = self.method
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
