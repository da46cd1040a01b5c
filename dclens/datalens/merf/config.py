"""The settings of a DP-MERF run (``scripts/merf.py``), validated on creation.

Defaults: D = 10,000 random Fourier features of length scale 8 (images in [0, 1]; the
median distance between two Fashion-MNIST records is about 9), the DataLens generator
(the authors' architecture, so that a DataLens run can start from the fit), 2,000 Adam
steps of 200 generated images (20 per class) at learning rate 1e-3.  These were set before
any run and not tuned; a screening run (``--training_records tuning``) is where to tune
them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dclens.common.field_checks import FieldChecks, is_finite_number
from dclens.data.splits import TrainingRecords
from dclens.datalens.config import GeneratorUpsampling
from dclens.privacy.accounting import Conversion

#: Settings a resumed run may change (they do not touch the release or the ledger).
CHANGEABLE_ON_RESUME = frozenset({"num_samples", "log_every"})


class MerfConfigError(ValueError):
    """A setting is out of range (the message names it and the fix)."""


@dataclasses.dataclass(frozen=True)
class MerfConfig:
    """One DP-MERF run.

    Privacy: one Gaussian mechanism on the class-conditional embedding sum, L2 sensitivity
    2 for replacing one training record (:mod:`dclens.datalens.merf.mechanism`), noise multiplier
    ``sigma`` (or calibrated so that the release alone costs ``target_eps`` at ``delta``
    under ``conversion``) times ``noise_scale``.  ``noise_scale`` < 1 is the
    noise-matched reduced scale of a screening run (on n records, z n / N keeps the
    mean embedding's noise of a run on N records); its epsilon is then larger, and
    privacy.json says which.
    """

    dataset: str = "fashion_mnist"
    data_dir: str | None = None
    max_records: int | None = None
    training_records: TrainingRecords = TrainingRecords.ALL   # :mod:`dclens.data.splits`
    target_eps: float | None = 1.0
    sigma: float | None = None            # the noise multiplier z (std / sensitivity)
    noise_scale: float = 1.0
    delta: float = 1e-5
    conversion: Conversion = Conversion.PLD
    num_features: int = 10_000
    lengthscale: float = 8.0
    fit_steps: int = 2000
    fit_batch: int = 200
    learning_rate: float = 1e-3
    beta1: float = 0.5
    z_dim: int = 50
    generator_filters: int = 64
    generator_dense: int = 1024
    generator_upsampling: GeneratorUpsampling = GeneratorUpsampling.TRANSPOSE
    num_samples: int = 100_000
    seed: int | None = None               # fixes every draw, DP noise included (not private)
    log_every: int = 250                  # fit steps between progress lines

    def __post_init__(self) -> None:
        check = FieldChecks(self, MerfConfigError)
        check.enum("training_records", TrainingRecords)
        check.enum("conversion", Conversion)
        check.enum("generator_upsampling", GeneratorUpsampling)
        if self.dataset not in ("mnist", "fashion_mnist"):
            check.fail("dataset", "dclens' DP-MERF is set up for 28x28x1 images: mnist or "
                       "fashion_mnist")
        check.budget()
        if not (is_finite_number(self.noise_scale) and 0 < self.noise_scale <= 1):
            check.fail("noise_scale", "must be in (0, 1]: a screening run's fraction of the "
                       "noise (1 for a private run)")
        check.ints(("num_features",), 2)
        if self.num_features % 2:
            check.fail("num_features", "must be even (a cosine and a sine per frequency)")
        check.ints(("fit_batch", "z_dim", "generator_filters", "generator_dense",
                    "num_samples", "log_every"), 1)
        check.ints(("fit_steps",), 0, "must be an integer >= 0 (0: release only, no fit)")
        if self.fit_batch % 10:
            check.fail("fit_batch", "must be a multiple of 10: every fit batch holds each "
                       "class equally often")
        check.optional_int("max_records", 1)
        check.positive(("lengthscale", "learning_rate"))
        check.fraction(("beta1",))
        check.optional_int("seed", 0)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        for name in ("training_records", "conversion", "generator_upsampling"):
            values[name] = getattr(self, name).value
        return values
