"""The settings of a private classifier run (``scripts/dpsgd.py``), validated on creation."""

from __future__ import annotations

import dataclasses
from typing import Any

from dclens import data
from dclens.data import splits
from dclens.data.splits import TrainingRecords
from dclens.privacy.accounting import Conversion
from dclens.common.field_checks import FieldChecks, is_finite_number
from dclens.dpsgd.mechanisms import Method

#: Where GEP's anchor images come from: ``held_out`` training images (removed from the
#: private set; random labels, as the paper does with its auxiliary data) or ``noise``:
#: uniform-random images drawn from the run's keys, which touch no record at all.
ANCHOR_SOURCES = ("held_out", "noise")

#: The learning rate a method gets when none is given. GM and TopAgg: 2, the middle of the
#: plateau their eps = 1 sweeps found at C = 1 (lr 0.5 / 2 / 4: validation 0.809 / 0.809 /
#: 0.817 for GM, 0.661 / 0.808 / 0.792 for TopAgg; results/dpsgd), where 0.1 trained too
#: slowly (0.68). The others keep 0.1 until they are swept.
DEFAULT_LEARNING_RATES = {Method.GM: 2.0, Method.TOPAGG: 2.0, Method.TOPAGG_DIMENSION: 0.1,
                          Method.GEP: 0.1, Method.BGEP: 0.1}

#: The methods whose default learning rate above was chosen by a sweep (results/dpsgd).
SWEPT_DEFAULTS = frozenset({Method.GM, Method.TOPAGG})


def learning_rate_selection(config: "DpsgdConfig") -> str:
    """How the run's learning rate was chosen, as far as dclens knows (privacy.json's
    ``hyperparameter_selection``): that choice is not covered by the epsilon."""
    rate = config.learning_rate
    if config.method in SWEPT_DEFAULTS and rate == DEFAULT_LEARNING_RATES[config.method]:
        where = ("the records this run treats as private" if config.dataset == "fashion_mnist"
                 else f"Fashion-MNIST, not {config.dataset}")
        return (f"learning_rate {rate:g} is dclens' default for {config.method.value}, chosen "
                f"by the validation accuracy of eps = 1 sweeps on Fashion-MNIST's training "
                f"set ({where}); that selection is NOT covered by this epsilon")
    if rate == DEFAULT_LEARNING_RATES[config.method]:
        return (f"learning_rate {rate:g} is dclens' fixed default for {config.method.value}, "
                f"not tuned on any data")
    return (f"learning_rate {rate:g} was given: how it was chosen is not covered by this "
            f"epsilon unless it was chosen without the private data")


#: Settings a resumed run may change (they do not touch what the ledger means).
CHANGEABLE_ON_RESUME = frozenset({"checkpoint_every", "eval_every"})


class DpsgdConfigError(ValueError):
    """A setting is out of range (the message names it and the fix)."""


@dataclasses.dataclass(frozen=True)
class DpsgdConfig:
    """One private classifier run.

    Privacy: every step Poisson-samples the private examples with rate q = batch_size / n
    and releases the method's Gaussian mechanism(s) with noise multiplier ``sigma``
    (calibrated to ``target_eps`` when that is given); epsilon is for adding or removing
    one private example, at ``delta``. ``validation`` (and for GEP ``anchors``) training
    images are held out of the private set first and used without privacy: the guarantee
    covers the other n.
    """

    method: Method = Method.GM
    dataset: str = "fashion_mnist"
    data_dir: str | None = None
    max_records: int | None = None       # train on the first N training records only
    training_records: TrainingRecords = TrainingRecords.ALL   # :mod:`dclens.data.splits`
    target_eps: float | None = 1.0       # calibrate sigma to spend this in ``epochs``
    sigma: float | None = None           # or give sigma (then target_eps must be None)
    delta: float = 1e-5
    conversion: Conversion = Conversion.DP_ACCOUNTING
    batch_size: int = 512                # expected (Poisson) batch size
    epochs: float = 15.0                 # steps = round(epochs * n / batch_size)
    learning_rate: float | None = None   # None: the method's (DEFAULT_LEARNING_RATES)
    momentum: float = 0.0
    #: Step decay: the rate is multiplied by ``lr_decay`` at each of these fractions of
    #: the planned steps (GEP's code: (0.5, 0.75) with 0.1; its paper: (0.5,)).
    lr_milestones: tuple[float, ...] = ()
    lr_decay: float = 0.1
    clip: float = 1.0                    # C (GM, TopAgg)
    topk: float = 0.8                    # NormTopK fraction (TopAgg variants)
    clip_embedding: float = 5.0          # GEP S1
    clip_residual: float = 2.0           # GEP S2
    num_bases: int = 500                 # GEP: k in total (the paper's MNIST value)
    num_groups: int = 3                  # GEP: contiguous parameter groups
    anchors: int = 2000                  # GEP: anchor images (random labels)
    anchor_source: str = "held_out"      # GEP: held_out training images, or noise images
    validation: int = 5000               # held-out images for choosing the epoch
    activation: str = "relu"
    seed: int | None = None              # fixes every draw, DP noise included (not private)
    checkpoint_every: int = 200          # steps
    eval_every: int = 0                  # steps between evaluations; 0: once per epoch

    def __post_init__(self) -> None:
        check = FieldChecks(self, DpsgdConfigError)
        check.enum("method", Method)
        if self.learning_rate is None:
            object.__setattr__(self, "learning_rate", DEFAULT_LEARNING_RATES[self.method])
        check.enum("conversion", Conversion)
        check.enum("training_records", TrainingRecords)
        if self.dataset not in ("mnist", "fashion_mnist"):
            check.fail("dataset", "private classifiers run on mnist or fashion_mnist")
        check.budget()
        check.ints(("batch_size", "num_bases", "num_groups", "checkpoint_every"), 1)
        check.ints(("anchors", "validation", "eval_every"), 0)
        check.optional_int("max_records", 1)
        check.positive(("epochs", "learning_rate", "clip", "clip_embedding",
                        "clip_residual"))
        check.fraction(("momentum",))
        self._check_schedule(check)
        if not (isinstance(self.topk, (int, float)) and 0 < self.topk <= 1):
            check.fail("topk",
                       "is a fraction of the squared norm (or of the coordinates): (0, 1]")
        if self.activation not in ("relu", "tanh"):
            check.fail("activation", "choose relu or tanh")
        if self.anchor_source not in ANCHOR_SOURCES:
            check.fail("anchor_source", f"choose one of {list(ANCHOR_SOURCES)}")
        if self.method.is_gep and self.anchors < 1:
            check.fail("anchors", "GEP needs anchor images (held out, random labels): >= 1")
        check.optional_int("seed", 0)

    def _check_schedule(self, check: FieldChecks) -> None:
        milestones = self.lr_milestones
        if not isinstance(milestones, (tuple, list)):
            check.fail("lr_milestones", "give fractions of the planned steps, e.g. 0.5 0.75")
        milestones = tuple(milestones)
        if not all(is_finite_number(m) and 0 < m < 1 for m in milestones) or \
                any(b <= a for a, b in zip(milestones, milestones[1:])):
            check.fail("lr_milestones",
                       "must be increasing fractions of the planned steps in (0, 1), "
                       "e.g. 0.5 0.75")
        object.__setattr__(self, "lr_milestones", tuple(float(m) for m in milestones))
        if not (is_finite_number(self.lr_decay) and 0 < self.lr_decay <= 1):
            check.fail("lr_decay", "is the factor applied at each milestone: (0, 1]")

    def learning_rate_at(self, step: int, total_steps: int) -> float:
        """The SGD step size of step ``step`` (0-based) of ``total_steps``:
        ``learning_rate * lr_decay ** m``, m the milestones with ``step >= f * total_steps``.
        Post-processing of the released gradients: no effect on the privacy spent."""
        passed = sum(1 for fraction in self.lr_milestones if step >= fraction * total_steps)
        return self.learning_rate * self.lr_decay ** passed

    @property
    def held_out(self) -> int:
        """Training images held out of the private set (validation, GEP's held-out
        anchors; noise anchors take none)."""
        return self.validation + (self.anchors if self.holds_out_anchors else 0)

    @property
    def holds_out_anchors(self) -> bool:
        return self.method.is_gep and self.anchor_source == "held_out"

    @property
    def releases(self) -> int:
        """Gaussian mechanisms released per step on the same sample (GEP: 2)."""
        return 2 if self.method is Method.GEP else 1

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["method"] = self.method.value
        values["conversion"] = self.conversion.value
        values["training_records"] = self.training_records.value
        values["lr_milestones"] = list(self.lr_milestones)
        return values

    def check_data(self, records: int) -> None:
        """Refuses a split that leaves fewer private examples than one batch."""
        private = records - self.held_out
        if private < self.batch_size:
            raise DpsgdConfigError(
                f"{records} training records minus {self.held_out} held out leaves {private} "
                f"private examples, fewer than batch_size = {self.batch_size}; lower "
                f"--validation/--anchors/--batch_size or raise --max_records")


def dataset_records(config: DpsgdConfig) -> data.LabeledImages:
    """The records the run reads: the config's ``training_records`` of the training split
    (the first ``max_records`` of them if given)."""
    return splits.load_training_records(config.dataset, config.data_dir,
                                        config.training_records, limit=config.max_records)
