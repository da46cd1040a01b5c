"""Hyper-parameters of a DataLens run as frozen, validated values.

Every privacy-relevant number lives here, in one immutable object that is written next
to the run's outputs (``config.json``).  Validation happens at construction, so a bad
value fails before any data is read or any file is written, with a message that quotes
the value and says what to do.

The paper presets (authors' README, docs/design.md) are available through
:func:`paper_preset`; :func:`demo_preset` is the small Fashion-MNIST run that the
command-line tool uses by default on a 2-core machine.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Mapping

from dclens.data.splits import TrainingRecords
from dclens.privacy.accounting import Conversion
from dclens.common.field_checks import is_finite_number, is_int


class GuidanceForm(str, enum.Enum):
    """The class term a guided teacher also descends
    (:func:`dclens.datalens.teachers.class_guidance_loss`)."""

    CROSS_ENTROPY = "cross_entropy"   # its own softmax over the K labels
    MARGIN = "margin"                 # its own logit minus its mean over the K labels


class GeneratorUpsampling(str, enum.Enum):
    """How the student generator doubles its feature maps
    (:func:`dclens.datalens.networks.upsampling_layers`)."""

    TRANSPOSE = "transpose"   # the authors': stride-2 5x5 transposed convolutions
    RESIZE = "resize"         # nearest-neighbour 2x resize, then a 5x5 convolution
    TRANSPOSE4 = "transpose4"  # stride-2 4x4 transposed convolutions (an even overlap)


class ConfigError(ValueError):
    """A hyper-parameter has a value the run cannot use."""


class ConvPath(enum.Enum):
    """How the teachers' convolutions are computed (same math; :mod:`dclens.datalens.teacher_conv`).

    Performance only: no effect on the algorithm, and free to change on resume.
    """

    #: The fastest path that works on this CPU and TensorFlow build.
    AUTO = "auto"
    #: One grouped ``tf.nn.conv2d`` (its gradient needs oneDNN on a CPU).
    GROUPED = "grouped"
    #: One ordinary ``tf.nn.conv2d`` per teacher (works on every CPU).
    PER_TEACHER = "per_teacher"
    #: The whole teacher step (forward, backward, Adam; and the image-gradient query) in
    #: one custom C++ op per chunk (``ops/teacher_step_op.cc``, built by ``make -C ops``).
    FUSED = "fused"


class FakeRendering(enum.Enum):
    """How the teachers' fake batches of a generator step are rendered (paper Alg. 1).

    Both give teacher i fake images G(z_j, y_ij) with y_ij the label of its j-th real
    record; they differ in the batch-norm statistics of the generator, which runs in
    training mode (batch statistics) as in the authors' code.
    """

    #: dclens: G(z_j, c) for every class c once, as one batch of K*B images (statistics
    #: over K*B); cheap and shared by all teachers.
    CLASS_GRID = "class_grid"
    #: The authors': G(z, y_i) as one batch of the B images of each teacher (statistics over
    #: those B); rendered once per distinct label sequence of the step.
    TEACHER_LABELS = "teacher_labels"


class SaveVotes(enum.Enum):
    """What a run writes of every TopAgg round into ``<run>/votes/`` (authors'
    ``--save_vote``)."""

    #: Nothing.
    NONE = "none"
    #: The released, noisy thresholded update of every round: public, like the generator.
    UPDATES = "updates"
    #: The updates and the raw (noise-free) vote sums, which are a function of the private
    #: data without noise: only in a ``--non_private`` run, or with ``--save_raw_votes``,
    #: which marks the run directory private (``PRIVATE-raw-votes.txt``).
    RAW_SUMS = "raw_sums"


class Aggregation(enum.Enum):
    """How the teachers' image gradients are compressed, summed and released.

    The paper's TopAgg and the variants of its ablations (Table 7) and comparisons (Tables
    5-6).  Each mechanism's L2 sensitivity -- the most one teacher can move the summed
    statistic that gets the noise -- is stated here and enforced by construction in
    :mod:`dclens.datalens.topagg` (D = image dimension, k = ``topk``, L = ``klevel``).
    """

    #: The paper's method (authors' ``--signsgd --stochastic``): on its top-k coordinates a
    #: teacher votes +1 with probability (1 + g) / 2 where g is the clipped,
    #: L-inf-normalised gradient coordinate, else -1; threshold at +-beta N.
    #: Sensitivity 2 sqrt(k).
    TOPK_STOCHASTIC_SIGN = "topk_stochastic_sign"
    #: Deterministic sign of the top-k coordinates (authors' ``--signsgd`` alone; Table 7
    #: "- stochastic quantization").  Sensitivity 2 sqrt(k).
    TOPK_SIGN = "topk_sign"
    #: The stochastic sign on all D coordinates (Table 7 "- top-k").  Sensitivity 2 sqrt(D).
    NO_TOPK = "no_topk"
    #: Top-k stochastic sign without the threshold: the released update is the noisy vote
    #: sum divided by k (authors' ``--signsgd_nothresh``).  Sensitivity 2 sqrt(k).  (The
    #: paper's Table 7 "- threshold" column equals its beta = 0 column: ``thresh=0``.)
    NO_THRESHOLD = "no_threshold"
    #: Top-k *deterministic* sign without the threshold (authors' ``--signsgd_nothresh``
    #: without ``--stochastic``, their ``signsgd_aggregate_no_thresh(stochastic=False)``):
    #: on its k largest |g| a teacher votes +1 where g >= 0, else -1 (an exactly-zero
    #: coordinate inside the top-k votes +1, theirs 0: docs/authors.md difference 6); the
    #: released update is (vote sum + N(0, sigma^2 I_D)) / k.  Sensitivity 2 sqrt(k): every
    #: teacher casts exactly k votes of +-1, all of which one record's teacher can flip.
    NO_THRESHOLD_SIGN = "no_threshold_sign"
    #: D2P-Fed (paper Alg. 5-6; authors' ``--klevelsgd --klevel L``): every coordinate
    #: stochastically quantised to L levels {-L/2, ..., L/2 - 1} over [-c, c], no top-k;
    #: summed, noised, thresholded.  Sensitivity (L - 1) sqrt(D).  The paper's random
    #: rotation is commented out in the authors' code (so not in the paper's numbers) and
    #: off by default here; ``klevel_rotation`` turns it on.
    KLEVEL = "klevel"
    #: FetchSGD (paper Alg. 7; authors' ``--sketchsgd``): the teachers' top-k stochastic
    #: signs summed into a count sketch (``sketch_rows`` x ``sketch_columns``), unsketched,
    #: top-k, thresholded.  With the default ``SketchAccounting.PROVEN`` the noise goes on
    #: the sketch, whose sensitivity is computed from its public hashes
    #: (:mod:`dclens.datalens.sketch`; 2 sqrt(k rows) without collisions).
    FETCHSGD = "fetchsgd"


class SketchAccounting(enum.Enum):
    """Where FetchSGD's noise goes and what it is charged."""

    #: Noise on every cell of the summed sketch, charged the sketch's sensitivity (a
    #: bound proven by construction, :class:`dclens.datalens.sketch.CountSketch`).
    PROVEN = "proven"
    #: The authors': noise on the unsketched top-k vector, charged TopAgg's 2 sqrt(k).
    #: Nothing bounds one teacher's effect on that vector by 2 sqrt(k): UNPROVEN, and every
    #: output of such a run says so.
    AUTHORS_UNPROVEN = "authors_unproven"


#: Methods whose teachers vote on their top-k coordinates only.
TOPK_METHODS = frozenset({Aggregation.TOPK_STOCHASTIC_SIGN, Aggregation.TOPK_SIGN,
                          Aggregation.NO_THRESHOLD, Aggregation.NO_THRESHOLD_SIGN})

#: Methods whose teachers vote the deterministic sign of their top-k (no random draws).
DETERMINISTIC_SIGN_METHODS = frozenset({Aggregation.TOPK_SIGN, Aggregation.NO_THRESHOLD_SIGN})

#: Methods that release the noisy vote sum divided by k instead of thresholding it.
UNTHRESHOLDED_METHODS = frozenset({Aggregation.NO_THRESHOLD, Aggregation.NO_THRESHOLD_SIGN})


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclasses.dataclass(frozen=True)
class TopAggConfig:
    """The TopAgg mechanism (paper Alg. 2 + 3).

    Attributes:
      topk: coordinates each teacher votes on, per fake image (k).
      sigma: standard deviation of the Gaussian noise added to every coordinate of the
        summed votes.  One TopAgg call is a Gaussian mechanism with L2 sensitivity
        2*sqrt(k), i.e. noise multiplier sigma / (2*sqrt(k)).
      thresh: beta in the paper; a coordinate's aggregate is +1 where the noisy vote sum is
        >= beta*N, -1 where it is <= -beta*N, else 0 (N = number of teachers); unused by
        :data:`UNTHRESHOLDED_METHODS`, which release the noisy sum / k.
      max_grad: c, the clip bound applied to gradient coordinates before L-inf
        normalisation (1e-5 in every paper run).
      method: see :class:`Aggregation`.
      klevel: L, the number of quantisation levels of ``Aggregation.KLEVEL`` (authors'
        ``--klevel``, default 4).
      sketch_rows, sketch_columns, sketch_seed: the count sketch of ``Aggregation.FETCHSGD``
        (the authors' ``CSVec(d, c=10000, r=20)``); the seed of its public hashes.
      sketch_accounting: :class:`SketchAccounting`.
      klevel_rotation, rotation_seed: D2P-Fed's random rotation (a public orthogonal D x D
        matrix from the seed): teachers quantise R clip(g); the thresholded aggregate is
        rotated back with R^T.
    """

    topk: int = 200
    sigma: float = 5000.0
    thresh: float = 0.9
    max_grad: float = 1e-5
    method: Aggregation = Aggregation.TOPK_STOCHASTIC_SIGN
    klevel: int = 4
    sketch_rows: int = 20
    sketch_columns: int = 10_000
    sketch_seed: int = 0
    sketch_accounting: SketchAccounting = SketchAccounting.PROVEN
    klevel_rotation: bool = False
    rotation_seed: int = 0

    def __post_init__(self) -> None:
        _require(is_int(self.topk) and self.topk >= 1,
                 f"topk must be an integer >= 1, got {self.topk!r}")
        _require(is_finite_number(self.sigma) and self.sigma >= 0,
                 f"sigma must be a finite number >= 0, got {self.sigma!r}")
        _require(is_finite_number(self.thresh) and 0 <= self.thresh < 1,
                 f"thresh must be in [0, 1), got {self.thresh!r}")
        _require(is_finite_number(self.max_grad) and self.max_grad > 0,
                 f"max_grad must be > 0 (the paper uses 1e-5), got {self.max_grad!r}")
        _require(isinstance(self.method, Aggregation),
                 f"method must be an Aggregation, got {self.method!r}")
        _require(is_int(self.klevel) and self.klevel >= 2,
                 f"klevel must be an integer >= 2 (quantisation levels), got {self.klevel!r}")
        for name in ("sketch_rows", "sketch_columns"):
            value = getattr(self, name)
            _require(is_int(value) and value >= 1,
                     f"{name} must be an integer >= 1, got {value!r}")
        _require(isinstance(self.klevel_rotation, bool),
                 f"klevel_rotation must be true or false, got {self.klevel_rotation!r}")
        _require(is_int(self.rotation_seed) and self.rotation_seed >= 0,
                 f"rotation_seed must be an integer >= 0, got {self.rotation_seed!r}")
        _require(is_int(self.sketch_seed) and self.sketch_seed >= 0,
                 f"sketch_seed must be an integer >= 0, got {self.sketch_seed!r}")
        _require(isinstance(self.sketch_accounting, SketchAccounting),
                 f"sketch_accounting must be one of {[a.value for a in SketchAccounting]}, "
                 f"got {self.sketch_accounting!r}")

    @property
    def accounting_proven(self) -> bool:
        """False only for FetchSGD under the authors' (unproven) accounting (the
        aggregation's part; :attr:`DataLensConfig.accounting_proven` adds the partition)."""
        return not (self.method is Aggregation.FETCHSGD
                    and self.sketch_accounting is SketchAccounting.AUTHORS_UNPROVEN)


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
    """The privacy budget: training stops before the step that would exceed ``max_eps``.

    Attributes:
      max_eps: epsilon budget at ``delta``.
      delta: the delta of the (epsilon, delta) guarantee.
      conversion: which RDP -> DP conversion decides the stop and the reported epsilon.
      max_order: the authors' ``--orders``: RDP orders {1.1, 2, ..., max_order - 1} for
        the classic conversion.
    """

    max_eps: float = 1.0
    delta: float = 1e-5
    conversion: Conversion = Conversion.CLASSIC
    max_order: int = 200

    def __post_init__(self) -> None:
        _require(is_finite_number(self.max_eps) and self.max_eps > 0,
                 f"max_eps must be a finite number > 0, got {self.max_eps!r}")
        _require(is_finite_number(self.delta) and 0 < self.delta < 1,
                 f"delta must be in (0, 1), got {self.delta!r}")
        _require(isinstance(self.conversion, Conversion),
                 f"conversion must be a Conversion, got {self.conversion!r}")
        _require(is_int(self.max_order) and self.max_order >= 3,
                 f"orders must be an integer >= 3 (orders are 1.1, 2, ..., orders-1), "
                 f"got {self.max_order!r}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything about the DataLens loop (paper Alg. 1) that is not the mechanism.

    Attributes:
      dataset: the authors' dataset name (``fashion_mnist``, ``mnist``,
        ``celebA-gender-train``, ``celebA-hair-train``, ...).
      data_dir: where the data lies; ``None`` = the dataset's default location.
      num_teachers: N, the number of disjoint partitions and teacher discriminators.
      batch_size: the authors' ``--batch_size``; the batch actually used (teacher real and
        fake batches, and fake images queried per generator step) is
        min(batch_size, partition size).
      epochs: upper bound on passes over the partitions (authors' ``--epoch``); training
        usually stops earlier, at the privacy budget.
      d_step: discriminator Adam steps per teacher per generator step.
      pretrain_teacher: discriminator steps in the first epoch instead of d_step (0 = use
        d_step).
      g_step: student updates (each a TopAgg round of one fake batch) per generator step.
      z_dim: latent dimension; z ~ U(-1, 1).
      learning_rate: Adam learning rate of teachers and student, and the step size of the
        voted update x_hat = x + learning_rate * g_bar.
      beta1: Adam's beta1 for teachers and student.
      balanced_partition: the authors' ``--shuffle``: class-balanced disjoint partitions.
        **Not private as accounted:** which teacher a record goes to then depends on every
        record's label (records are striped over teachers in label order), so replacing
        one record can move many others to other teachers, and the 2 sqrt(k) sensitivity
        (one record moves one teacher) no longer holds.  False (the default): teachers get
        contiguous slices of a random permutation of the record *indices* (seeded by
        ``partition_seed``, independent of the data), so replacing one record changes one
        teacher's data and nothing else (:func:`dclens.data.index_partition`).
      partition_seed: seed of the partition of records to teachers.
      seed: seed of every other random draw (teacher/student initialisation, z, labels,
        stochastic sign, DP noise).  ``None`` draws it from OS entropy; a fixed seed makes
        the DP noise reproducible, so such a run's output must not be published as private.
      non_private: no noise, no budget; for debugging only, output is NOT private.
      teacher_chunk: teachers processed together (memory bound, no effect on the algorithm
        except which random numbers a teacher draws).
      num_samples: synthetic samples written at the end.
      conv_path: how the teachers' convolutions run (:class:`ConvPath`; speed only).
      max_records: use only the first ``max_records`` training records (tests, demos);
        ``None`` = all.  With ``training_records``, the first of those records.
      training_records: which records of the training split the run reads
        (:class:`dclens.data.splits.TrainingRecords`): ``all`` (the paper's, the default),
        ``private`` (all but the last 10,000, which are the tuning split: the records a
        tuned configuration's private runs train on; the guarantee covers them) or
        ``tuning`` (the tuning split without its holdout: a screening run, whose results
        may choose hyper-parameters because no private run reads these records).
      fake_rendering: how the teachers' fake batches are rendered (:class:`FakeRendering`;
        ``teacher_labels`` is the authors' way).
      save_votes: what of every round is written to ``<run>/votes/`` (:class:`SaveVotes`).
      generator_ema: decay d of an exponential moving average of the student generator's
        trainable weights, updated after every student update (w_ema <- d w_ema +
        (1 - d) w, starting from the initial weights); the samples and the published
        ``generator.keras`` then come from the average.  Post-processing of the released
        updates: the ledger is unchanged.  0 (the default, the authors' way): no average.
      class_guidance: lambda >= 0 (beyond the paper): each teacher's submitted image
        gradient also descends lambda times its own label cross-entropy, the teacher's
        logits over the K labels of the same image read as a classifier
        (:func:`dclens.datalens.teachers.class_guidance_loss`); K forward passes per query.
        Still a function of that teacher's partition and the public fake batch, so the
        vote's sensitivity and the ledger are unchanged.  0 (the default): the paper's.
      class_guidance_form: the class term of ``class_guidance`` (:class:`GuidanceForm`):
        ``cross_entropy`` (the default) or ``margin`` (a teacher's logit for the label minus
        its mean over the labels; linear, so the teachers' terms add up to the summed
        logits' margin).  ``margin`` needs ``class_guidance`` > 0.
      mismatch_negatives: m >= 0 (beyond the paper): the last m slots of each teacher's
        fake batch hold its own real records of those slots under a wrong label, scored
        as fake, so a teacher must check that an image shows its label (matching-aware
        teachers, :mod:`dclens.datalens.mismatch`).  Still only that teacher's partition:
        the vote's sensitivity and the ledger are unchanged.  At most the teachers'
        batch (min(batch_size, partition size), checked when the run starts).  0 (the
        default): the paper's.
      shared_teacher_init: beyond the paper (issue 39): every teacher starts from the
        same initial weights (one draw from the run's seed) instead of its own
        independent draw.  The initialisation is data-independent, so each teacher's
        state is still a function of its own partition only: the vote's sensitivity and
        the ledger are unchanged.  False (the default): the paper's independent
        initialisations.
      generator_filters, generator_dense: the student generator's width
        (:func:`dclens.datalens.networks.build_generator`: gf and gfc, the authors'
        ``gf_dim`` 64 and ``gfc_dim`` 1024 by default).  Another width is beyond the paper
        (issue 39's lever 4); the generator is a data-independent architecture that reads
        only the released votes, so the vote's sensitivity and the ledger are unchanged.
      generator_upsampling: how the generator doubles its feature maps
        (:class:`GeneratorUpsampling`): ``transpose``, the authors' stride-2 transposed
        convolutions (the default); ``resize``, a nearest-neighbour resize then a
        convolution, which prints no checkerboard; or ``transpose4``, 4x4 transposed
        convolutions, whose overlap is even (both beyond the paper, issue 39's lever 4).
        Data-independent like the width: the sensitivity and the ledger are unchanged.
      teacher_filters, teacher_dense: the teacher discriminators' width
        (:class:`dclens.datalens.networks.DiscriminatorWidth`: df and dfc, the authors'
        ``df_dim`` 32 and ``dfc_dim`` 256 by default).  Another width is beyond the paper
        (issue 39's lever 4); it is data-independent (each teacher still reads only its
        own partition, and each vote is still a sign vector clipped to k coordinates), so
        the vote's sensitivity and the ledger are unchanged.
      query_batch: fake images voted on per TopAgg round (beyond the paper, issue 39's
        lever 3): the round still renders its B images G(z_j, y_j) (so the generator's
        batch statistics are over B, as in the paper), but only the first
        ``query_batch`` are voted on and the student's update moves only those; the
        teachers still train on batches of B.  Each query is still one
        Gaussian vote of sensitivity 2 sqrt(k): the ledger counts ``query_batch`` of them
        per round, so a smaller one buys about B / query_batch x the steps at the same
        epsilon.  At most the batch (min(batch_size, partition size), checked when the
        run starts).  ``None`` (the default): B, the paper's.
      warm_start: the folder of a finished DP-MERF run on the same records (beyond the
        paper, issue 39): the student generator starts from the generator fitted there,
        and the ledger starts with that run's release (one Gaussian mechanism on the
        same records, composed with every TopAgg query;
        :mod:`dclens.datalens.warm_start`).  ``None`` (the default): the paper's
        randomly initialised generator.
      class_direction_every: a diagnostic (beyond the paper, issue 39): every N-th step,
        how much of the teachers' summed class evidence their gradients, vote and released
        update carry (:mod:`dclens.datalens.class_direction`), into
        ``<run>/class_direction.json``.  It reads the teachers' weights, so it is refused
        unless ``training_records`` is ``tuning``; it changes nothing the run computes.
        0 (the default): off.
      data_dependent_analysis: also compute the authors' data-dependent RDP bound of every
        call (paper Fig. 2, :mod:`dclens.privacy.data_dependent`) and record its epsilon beside
        the ledger's; an analysis only, **never spent** (the authors' ``--signsgd_dept``).
    """

    dataset: str = "fashion_mnist"
    data_dir: str | None = None
    num_teachers: int = 4000
    batch_size: int = 30
    epochs: int = 1000
    d_step: int = 2
    pretrain_teacher: int = 10
    g_step: int = 1
    z_dim: int = 50
    learning_rate: float = 1e-3
    beta1: float = 0.5
    balanced_partition: bool = False
    partition_seed: int = 0
    seed: int | None = None
    non_private: bool = False
    teacher_chunk: int = 10
    num_samples: int = 100_000
    max_records: int | None = None
    conv_path: ConvPath = ConvPath.AUTO
    fake_rendering: FakeRendering = FakeRendering.CLASS_GRID
    data_dependent_analysis: bool = False
    save_votes: SaveVotes = SaveVotes.NONE
    generator_ema: float = 0.0
    training_records: TrainingRecords = TrainingRecords.ALL
    class_guidance: float = 0.0
    class_direction_every: int = 0
    class_guidance_form: GuidanceForm = GuidanceForm.CROSS_ENTROPY
    mismatch_negatives: int = 0
    shared_teacher_init: bool = False
    generator_filters: int = 64
    generator_dense: int = 1024
    generator_upsampling: GeneratorUpsampling = GeneratorUpsampling.TRANSPOSE
    teacher_filters: int = 32
    teacher_dense: int = 256
    query_batch: int | None = None
    warm_start: str | None = None

    def __post_init__(self) -> None:
        _require(self.warm_start is None
                 or (isinstance(self.warm_start, str) and self.warm_start != ""),
                 f"warm_start must be None or the folder of a finished DP-MERF run "
                 f"(scripts/merf.py --run_dir), got {self.warm_start!r}")
        _require(isinstance(self.class_guidance_form, GuidanceForm),
                 f"class_guidance_form must be one of {[f.value for f in GuidanceForm]}, "
                 f"got {self.class_guidance_form!r}")
        _require(isinstance(self.generator_upsampling, GeneratorUpsampling),
                 f"generator_upsampling must be one of "
                 f"{[u.value for u in GeneratorUpsampling]}, got "
                 f"{self.generator_upsampling!r}")
        _require(isinstance(self.training_records, TrainingRecords),
                 f"training_records must be one of {[r.value for r in TrainingRecords]}, "
                 f"got {self.training_records!r}")
        _require(is_finite_number(self.generator_ema) and 0 <= self.generator_ema < 1,
                 f"generator_ema must be a decay in [0, 1) (0: no average; e.g. 0.9 over "
                 f"~100 student updates), got {self.generator_ema!r}")
        _require(is_finite_number(self.class_guidance) and self.class_guidance >= 0,
                 f"class_guidance must be a finite number >= 0 (0: the paper's teachers; "
                 f"e.g. 1.0), got {self.class_guidance!r}")
        _require(self.class_guidance_form is GuidanceForm.CROSS_ENTROPY
                 or self.class_guidance > 0,
                 f"class_guidance_form={self.class_guidance_form.value!r} chooses the class "
                 f"term of class_guidance, which is 0 (off): set class_guidance > 0 too "
                 f"(e.g. 1.0), or drop the form")
        _require(is_int(self.class_direction_every) and self.class_direction_every >= 0,
                 f"class_direction_every must be an integer >= 0 (0: off; e.g. 10), got "
                 f"{self.class_direction_every!r}")
        _require(self.class_direction_every == 0
                 or self.training_records is TrainingRecords.TUNING,
                 f"class_direction_every={self.class_direction_every} reads the teachers' "
                 f"weights, which no mechanism releases: only for screening runs on the "
                 f"tuning split (training_records='tuning'), got training_records="
                 f"{self.training_records.value!r}")
        _require(isinstance(self.dataset, str) and self.dataset != "",
                 f"dataset must be a non-empty name, got {self.dataset!r}")
        for name in ("num_teachers", "batch_size", "epochs", "d_step", "g_step", "z_dim",
                     "teacher_chunk", "num_samples", "generator_filters", "generator_dense",
                     "teacher_filters", "teacher_dense"):
            value = getattr(self, name)
            _require(is_int(value) and value >= 1,
                     f"{name} must be an integer >= 1, got {value!r}")
        _require(is_int(self.mismatch_negatives) and 0 <= self.mismatch_negatives
                 <= self.batch_size,
                 f"mismatch_negatives must be an integer in [0, batch_size={self.batch_size}]"
                 f" (0: the paper's teachers; e.g. 5 of a batch of 15), got "
                 f"{self.mismatch_negatives!r}")
        _require(isinstance(self.shared_teacher_init, bool),
                 f"shared_teacher_init must be True or False, got "
                 f"{self.shared_teacher_init!r}")
        _require(is_int(self.pretrain_teacher) and self.pretrain_teacher >= 0,
                 f"pretrain_teacher must be an integer >= 0, got {self.pretrain_teacher!r}")
        _require(is_finite_number(self.learning_rate) and self.learning_rate > 0,
                 f"learning_rate must be a finite number > 0, got {self.learning_rate!r}")
        _require(is_finite_number(self.beta1) and 0 <= self.beta1 < 1,
                 f"beta1 must be in [0, 1), got {self.beta1!r}")
        _require(is_int(self.partition_seed) and self.partition_seed >= 0,
                 f"partition_seed must be an integer >= 0, got {self.partition_seed!r}")
        _require(self.seed is None or (is_int(self.seed) and self.seed >= 0),
                 f"seed must be an integer >= 0 or None, got {self.seed!r}")
        _require(isinstance(self.conv_path, ConvPath),
                 f"conv_path must be one of {[p.value for p in ConvPath]}, "
                 f"got {self.conv_path!r}")
        _require(isinstance(self.save_votes, SaveVotes),
                 f"save_votes must be one of {[v.value for v in SaveVotes]}, "
                 f"got {self.save_votes!r}")
        _require(isinstance(self.fake_rendering, FakeRendering),
                 f"fake_rendering must be one of {[r.value for r in FakeRendering]}, "
                 f"got {self.fake_rendering!r}")
        _require(self.query_batch is None
                 or (is_int(self.query_batch) and self.query_batch >= 1),
                 f"query_batch must be an integer >= 1 (at most the batch) or None (the "
                 f"paper's: the whole batch), got {self.query_batch!r}")
        _require(self.max_records is None
                 or (is_int(self.max_records) and self.max_records >= 1),
                 f"max_records must be an integer >= 1 or None, got {self.max_records!r}")


@dataclasses.dataclass(frozen=True)
class DataLensConfig:
    """A whole run: the loop, the mechanism and the budget."""

    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    topagg: TopAggConfig = dataclasses.field(default_factory=TopAggConfig)
    budget: BudgetConfig = dataclasses.field(default_factory=BudgetConfig)

    def __post_init__(self) -> None:
        if self.train.data_dependent_analysis:
            _require(self.topagg.method in TOPK_METHODS and not self.train.non_private,
                     f"the data-dependent analysis (--signsgd_dept) is defined for the "
                     f"private top-k sign aggregations only, got "
                     f"{self.topagg.method.value!r}"
                     f"{' with --non_private' if self.train.non_private else ''}")
        if not self.train.non_private:
            _require(self.topagg.sigma > 0,
                     f"sigma must be > 0 for a private run, got {self.topagg.sigma!r}; "
                     "pass --non_private to debug without noise (its output is not private)")

    @property
    def accounting_proven(self) -> bool:
        """Whether the reported epsilon is a proven guarantee: the aggregation's accounting
        is proven and the partition is data-independent (``balanced_partition`` off)."""
        return self.topagg.accounting_proven and not self.train.balanced_partition

    def replace(self, **sections: Mapping[str, Any]) -> "DataLensConfig":
        """A copy with fields of sections replaced: ``cfg.replace(train={"epochs": 3})``."""
        updated = {}
        for section, changes in sections.items():
            current = getattr(self, section)
            updated[section] = dataclasses.replace(current, **dict(changes))
        return dataclasses.replace(self, **updated)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (enums as their values)."""
        def convert(value: Any) -> Any:
            if isinstance(value, enum.Enum):
                return value.value
            if isinstance(value, dict):
                return {k: convert(v) for k, v in value.items()}
            return value
        return convert(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DataLensConfig":
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        def build(kind: type, values: Mapping[str, Any], enums: dict[str, type]) -> Any:
            known = {f.name for f in dataclasses.fields(kind)}
            unknown = set(values) - known
            _require(not unknown, f"unknown {kind.__name__} keys: {sorted(unknown)}")
            kwargs = dict(values)
            for name, enum_type in enums.items():
                if name in kwargs:
                    kwargs[name] = enum_type(kwargs[name])
            return kind(**kwargs)

        unknown = set(data) - {"train", "topagg", "budget"}
        _require(not unknown, f"unknown config sections: {sorted(unknown)}")
        return cls(
            train=build(TrainConfig, data.get("train", {}),
                        {"conv_path": ConvPath, "fake_rendering": FakeRendering,
                         "save_votes": SaveVotes, "training_records": TrainingRecords,
                         "class_guidance_form": GuidanceForm,
                         "generator_upsampling": GeneratorUpsampling}),
            topagg=build(TopAggConfig, data.get("topagg", {}),
                         {"method": Aggregation, "sketch_accounting": SketchAccounting}),
            budget=build(BudgetConfig, data.get("budget", {}), {"conversion": Conversion}),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


# Paper configurations (authors' README; docs/design.md).  All: d_step 2,
# c = 1e-5, stochastic sign, batch 30 (cut to the partition size).
_PAPER_PRESETS: dict[tuple[str, int], dict[str, dict[str, Any]]] = {
    ("mnist", 1): {"train": {"num_teachers": 4000, "z_dim": 50},
                   "topagg": {"topk": 200, "sigma": 5000.0, "thresh": 0.7}},
    ("mnist", 10): {"train": {"num_teachers": 4000, "z_dim": 50},
                    "topagg": {"topk": 300, "sigma": 800.0, "thresh": 0.2}},
    ("fashion_mnist", 1): {"train": {"num_teachers": 4000, "z_dim": 50},
                           "topagg": {"topk": 200, "sigma": 5000.0, "thresh": 0.9}},
    ("fashion_mnist", 10): {"train": {"num_teachers": 4000, "z_dim": 64},
                            "topagg": {"topk": 350, "sigma": 1000.0, "thresh": 0.27}},
    ("celebA-gender", 1): {"train": {"num_teachers": 6000, "z_dim": 100},
                           "topagg": {"topk": 700, "sigma": 9000.0, "thresh": 0.85}},
    ("celebA-gender", 10): {"train": {"num_teachers": 6000, "z_dim": 100},
                            "topagg": {"topk": 500, "sigma": 700.0, "thresh": 0.12}},
}

PAPER_PRESET_NAMES = tuple(f"{d}-eps{e}" for d, e in _PAPER_PRESETS)


def partition_kind(train: Mapping[str, Any]) -> str:
    """``"index"`` (data-independent: the epsilon is proven) or ``"class-balanced"`` (the
    authors' ``--shuffle``: NOT proven) for a serialized ``train`` section. Sections written
    before the index partition became the default lack the key and used the
    class-balanced one."""
    return "class-balanced" if train.get("balanced_partition", True) else "index"


def paper_preset(dataset: str, eps: int) -> DataLensConfig:
    """The paper's configuration for (dataset, eps) with eps in {1, 10}.

    ``dataset`` is ``mnist``, ``fashion_mnist`` or ``celebA-gender`` (the train split
    ``celebA-gender-train`` is used).
    """
    key = (dataset, eps)
    if key not in _PAPER_PRESETS:
        raise ConfigError(f"no paper preset for dataset={dataset!r}, eps={eps!r}; "
                          f"available: {', '.join(PAPER_PRESET_NAMES)}")
    values = _PAPER_PRESETS[key]
    dataset_name = "celebA-gender-train" if dataset == "celebA-gender" else dataset
    return DataLensConfig(
        train=TrainConfig(dataset=dataset_name, **values["train"]),
        topagg=TopAggConfig(**values["topagg"]),
        budget=BudgetConfig(max_eps=float(eps)),
    )


def demo_preset() -> DataLensConfig:
    """A Fashion-MNIST run sized for a 2-core CPU in about ten minutes.

    See docs/training.md ("The default run") for why it differs from the paper configs: with few
    teachers the vote sum is small, so the noise has to be small too, and the budget is
    far larger than the paper's.
    """
    return DataLensConfig(
        train=TrainConfig(dataset="fashion_mnist", num_teachers=100, batch_size=30,
                          epochs=1000, d_step=2, pretrain_teacher=10, z_dim=50,
                          teacher_chunk=10, num_samples=20_000),
        topagg=TopAggConfig(topk=200, sigma=50.0, thresh=0.3),
        budget=BudgetConfig(max_eps=350.0),
    )


PRESETS = {"demo": demo_preset,
           **{name: (lambda d=d, e=e: paper_preset(d, e)) for (d, e), name
              in zip(_PAPER_PRESETS, PAPER_PRESET_NAMES)}}


def preset(name: str) -> DataLensConfig:
    """A preset by name: ``demo`` or ``<dataset>-eps<1|10>`` (see PRESETS)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
    return PRESETS[name]()
