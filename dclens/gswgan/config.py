"""The settings of a GS-WGAN run (``scripts/gswgan.py``), validated on creation.

Defaults are the paper's (BASELINES.md 1.4): 1000 discriminators, B = 32, 5 critic steps,
lambda_gp 10, drift 1e-3, Adam 1e-4 (0.5, 0.9), z_dim 10, model_dim 64, 2000 warm-start
and 20000 DP iterations, C = 1, delta 1e-5; the budget is epsilon 10 under the provable
iteration-level accounting (sigma calibrated: 2.87).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dclens.accounting import Conversion
from dclens.gswgan.accounting import Accounting

#: Settings a resumed run may change (they do not touch what the ledger means).
CHANGEABLE_ON_RESUME = frozenset({"checkpoint_every", "log_every", "warm_chunk",
                                  "num_samples"})


class GswganConfigError(ValueError):
    """A setting is out of range (the message names it and the fix)."""


@dataclasses.dataclass(frozen=True)
class GswganConfig:
    """One GS-WGAN run.

    Privacy: each of ``iterations`` DP iterations samples one of ``num_discriminators``
    disjoint shards and releases ``batch_size`` sanitized image gradients with noise
    multiplier ``sigma`` (calibrated to ``target_eps`` under ``accounting`` when that is
    given); epsilon is for replacing one training example, at ``delta``.
    """

    dataset: str = "fashion_mnist"
    data_dir: str | None = None
    max_records: int | None = None
    num_discriminators: int = 1000
    target_eps: float | None = 10.0
    sigma: float | None = None
    accounting: Accounting = Accounting.ITERATION
    delta: float = 1e-5
    conversion: Conversion = Conversion.DP_ACCOUNTING
    clip: float = 1.0
    batch_size: int = 32
    critic_iters: int = 5
    lambda_gp: float = 10.0
    drift: float = 1e-3
    learning_rate: float = 1e-4
    beta1: float = 0.5
    beta2: float = 0.9
    z_dim: int = 10
    model_dim: int = 64
    warm_iterations: int = 2000          # per discriminator, non-private
    iterations: int = 20000              # DP iterations
    ema_decay: float = 0.999
    num_samples: int = 60000
    seed: int | None = None              # fixes every draw, DP noise included (not private)
    warm_chunk: int = 4                  # discriminators warmed together (memory / speed)
    checkpoint_every: int = 500          # DP iterations
    log_every: int = 100                 # DP iterations between TensorBoard points

    def __post_init__(self) -> None:
        def fail(name: str, hint: str) -> None:
            raise GswganConfigError(f"{name} = {getattr(self, name)!r}: {hint}")

        for name, kind in (("accounting", Accounting), ("conversion", Conversion)):
            if not isinstance(getattr(self, name), kind):
                try:
                    object.__setattr__(self, name, kind(getattr(self, name)))
                except ValueError:
                    fail(name, f"choose one of {[k.value for k in kind]}")
        if self.dataset not in ("mnist", "fashion_mnist"):
            fail("dataset", "GS-WGAN's networks are for 28x28x1: mnist or fashion_mnist")
        if (self.target_eps is None) == (self.sigma is None):
            raise GswganConfigError(
                f"give exactly one of target_eps ({self.target_eps!r}) and sigma "
                f"({self.sigma!r}): the budget to calibrate sigma to, or sigma itself")
        for name in ("target_eps", "sigma"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                fail(name, "must be a finite number > 0")
        if not 0 < self.delta < 1:
            fail("delta", "must be in (0, 1), e.g. 1e-5")
        for name in ("num_discriminators", "batch_size", "critic_iters", "z_dim",
                     "model_dim", "iterations", "num_samples", "warm_chunk",
                     "checkpoint_every", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                fail(name, "must be an integer >= 1")
        if isinstance(self.warm_iterations, bool) or not isinstance(self.warm_iterations, int) \
                or self.warm_iterations < 0:
            fail("warm_iterations", "must be an integer >= 0 (0: no warm-start)")
        if self.max_records is not None and (not isinstance(self.max_records, int)
                                             or self.max_records < 1):
            fail("max_records", "must be None or an integer >= 1")
        for name in ("clip", "learning_rate"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                fail(name, "must be a finite number > 0")
        for name in ("lambda_gp", "drift"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                fail(name, "must be a finite number >= 0")
        for name in ("beta1", "beta2", "ema_decay"):
            if not 0 <= getattr(self, name) < 1:
                fail(name, "must be in [0, 1)")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            fail("seed", "must be None or an integer >= 0")

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["accounting"] = self.accounting.value
        values["conversion"] = self.conversion.value
        return values

    def check_data(self, records: int) -> int:
        """Records per shard (n // N_D); refuses shards smaller than one batch."""
        per_shard = records // self.num_discriminators
        if per_shard < 1:
            raise GswganConfigError(
                f"num_discriminators = {self.num_discriminators} exceeds the {records} "
                f"training records: every shard would be empty; use at most {records}")
        return per_shard
