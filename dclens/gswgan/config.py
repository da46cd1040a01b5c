"""The settings of a GS-WGAN run (``scripts/gswgan.py``), validated on creation.

Defaults are the paper's (its App. C.1 and the released code's source/config.py): 1000
discriminators, B = 32, 5 critic steps, lambda_gp 10, drift 1e-3, Adam 1e-4 (0.5, 0.9),
z_dim 10, model_dim 64, 2000 warm-start and 20000 DP iterations, C = 1, delta 1e-5; the
budget is epsilon 10 under the provable iteration-level accounting (sigma calibrated: 2.87).
One default is not the released code's: the DP phase's critic steps are discarded after each
iteration (``critic_updates``), which the proof needs (:mod:`dclens.gswgan.accounting`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dclens.data.splits import TrainingRecords
from dclens.privacy.accounting import Conversion
from dclens.common.field_checks import FieldChecks
from dclens.gswgan.accounting import Accounting, CriticUpdates

#: Settings a resumed run may change (they do not touch what the ledger means).
CHANGEABLE_ON_RESUME = frozenset({"checkpoint_every", "log_every", "warm_chunk",
                                  "num_samples"})


#: Settings added with a default that differs from what earlier runs did, and the value a
#: saved config without them had (:func:`dclens.runs.rundir.differences_except`): runs made
#: before ``critic_updates`` existed kept the DP phase's critic updates.
IMPLIED_BY_OLDER_RUNS = {"critic_updates": "keep"}


class GswganConfigError(ValueError):
    """A setting is out of range (the message names it and the fix)."""


@dataclasses.dataclass(frozen=True)
class GswganConfig:
    """One GS-WGAN run.

    Privacy: each of ``iterations`` DP iterations samples one of ``num_discriminators``
    disjoint shards and releases ``batch_size`` sanitized image gradients with noise
    multiplier ``sigma`` (calibrated to ``target_eps`` under ``accounting`` when that is
    given); epsilon is for replacing one training example, at ``delta``, and proven only
    for the iteration accounting with ``critic_updates`` = discard.
    """

    dataset: str = "fashion_mnist"
    data_dir: str | None = None
    max_records: int | None = None
    training_records: TrainingRecords = TrainingRecords.ALL   # :mod:`dclens.data.splits`
    num_discriminators: int = 1000
    target_eps: float | None = 10.0
    sigma: float | None = None
    accounting: Accounting = Accounting.ITERATION
    critic_updates: CriticUpdates = CriticUpdates.DISCARD
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
        check = FieldChecks(self, GswganConfigError)
        check.enum("accounting", Accounting)
        check.enum("critic_updates", CriticUpdates)
        check.enum("training_records", TrainingRecords)
        check.enum("conversion", Conversion)
        if self.conversion is Conversion.PLD:
            check.fail("conversion", "GS-WGAN samples one discriminator without replacement "
                       "(replace-one adjacency), for which dp_accounting has no privacy "
                       "loss distribution; use 'dp_accounting' (RDP, proven)")
        if self.dataset not in ("mnist", "fashion_mnist"):
            check.fail("dataset", "GS-WGAN's networks are for 28x28x1: mnist or fashion_mnist")
        check.budget()
        check.ints(("num_discriminators", "batch_size", "critic_iters", "z_dim", "model_dim",
                    "iterations", "num_samples", "warm_chunk", "checkpoint_every",
                    "log_every"), 1)
        check.ints(("warm_iterations",), 0, "must be an integer >= 0 (0: no warm-start)")
        check.optional_int("max_records", 1)
        check.positive(("clip", "learning_rate"))
        check.positive(("lambda_gp", "drift"), allow_zero=True)
        check.fraction(("beta1", "beta2", "ema_decay"))
        check.optional_int("seed", 0)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["accounting"] = self.accounting.value
        values["critic_updates"] = self.critic_updates.value
        values["training_records"] = self.training_records.value
        values["conversion"] = self.conversion.value
        return values

    def check_data(self, records: int) -> int:
        """Records per shard (n // N_D); refuses empty shards (a shard smaller than one
        batch gives batches drawn with replacement, :func:`dclens.gswgan.train.real_batches`)."""
        per_shard = records // self.num_discriminators
        if per_shard < 1:
            raise GswganConfigError(
                f"num_discriminators = {self.num_discriminators} exceeds the {records} "
                f"training records: every shard would be empty; use at most {records}")
        return per_shard
