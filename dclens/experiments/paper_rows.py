"""The paper's Table 1 rows and how a reproduction deviates from them.

:class:`ReproduceOptions` names a row (dataset, eps) and every deviation a user may ask for
(fewer teachers, capped epochs, fewer samples, an analysis row's aggregation / beta / k,
the authors' fidelity options, the noise-matched reduced scale); :func:`build_config` turns
it into a :class:`dclens.datalens.config.DataLensConfig` and a list of the deviations in
words, which every report prints.  :func:`paper_steps` and :func:`matched_budget` are the
row's TopAgg budget in steps and the budget that keeps those steps at another sigma.
"""

from __future__ import annotations

import dataclasses
import math
import os

from dclens import data
from dclens.data import splits
from dclens.datalens import config as cfg
from dclens.datalens import networks, teachers as teacher_module
from dclens.privacy import accounting

#: Paper Table 1 (Wang et al., "DataLens", ACM CCS 2021): accuracy on the real test set of
#: a classifier trained on 100k DataLens samples (the authors' protocol: best test accuracy
#: over 600 epochs, i.e. our "sen"). Values as listed in docs/design.md.
PAPER_TABLE1 = {
    ("mnist", 1): 0.7123, ("mnist", 10): 0.8066,
    ("fashion_mnist", 1): 0.6478, ("fashion_mnist", 10): 0.7061,
    ("celebA-gender", 1): 0.7058, ("celebA-gender", 10): 0.7287,
    ("celebA-hair", 1): 0.6061, ("celebA-hair", 10): 0.6224,
}
PAPER_SOURCE = ("Wang et al., DataLens, ACM CCS 2021, Table 1 (classifier trained on 100k "
                "synthetic samples; best real-test accuracy over 600 epochs = our 'sen')")
#: Independent re-runs of the authors' code, where known.
INDEPENDENT = {("mnist", 10): (0.539, "SoK-PPDS: independent re-run of the authors' code")}

#: Training-split sizes, for the paper's effective batch (batch 30 cut to the partition size).
TRAIN_RECORDS = {"mnist": 60_000, "fashion_mnist": 60_000, "celebA-gender": 162_770}


class ReproduceError(ValueError):
    """A reproduction that cannot run as asked; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class ReproduceOptions:
    """What to reproduce and how far to deviate from the paper config (all recorded).

    Attributes:
      dataset: ``mnist``, ``fashion_mnist`` or ``celebA-gender``.
      eps: 1 or 10 (the paper's budgets).
      scale: fraction of the paper's teachers (None = the paper's number).
      teachers: number of teachers (overrides ``scale``).
      non_private: no noise, no budget; trains as many steps as the private config would
        (the eps = inf reference row; NOT private).
      epochs: cap on epochs (passes over the partitions); None = the preset's.
      num_samples: synthetic samples to write and evaluate (paper: 100k).
      max_records: train on the first N records only.
      seed: fixes every random draw of training (DP noise included: not publishable).
      data_dir: where the data lies (None = the dataset's default).
      teacher_chunk: teachers processed together (memory only).
      aggregation, thresh, topk: the paper's analysis rows (Tables 4-7) change these from
        the Table 1 config (an :class:`dclens.datalens.config.Aggregation` value, beta, k).
      balanced_partition: the authors' class-balanced partition (their ``--shuffle``)
        instead of dclens' index partition. A fidelity option, not a deviation from the
        paper's config (it *is* theirs), but under it one replaced record can move many
        records between teachers, so the run's epsilon is NOT a proven guarantee.
      fake_rendering: a :class:`dclens.datalens.config.FakeRendering` value; ``teacher_labels`` is
        the authors' rendering of the teachers' fake batches (a fidelity option; about 2x
        slower per step at the paper config).
      sigma_scale: the paper's sigma times this factor in (0, 1], with the budget raised
        to the epsilon the paper config's steps cost at that sigma (:func:`matched_budget`).
        With ``sigma_scale = teachers / paper teachers`` a reduced-scale run keeps the
        paper's noise relative to the vote sum (a sum of ``teachers`` votes of size at most
        1 per coordinate) and its number of steps, at a larger, truthfully accounted
        epsilon: a noise-matched small model of the paper run, NOT its privacy level.
      conversion, generator_ema: levers beyond the paper (listed as deviations): ``pld``
        accounts exactly instead of by the classic RDP conversion, so the same budget
        allows more steps; ``generator_ema`` samples a moving average of the generator.
      learning_rate: beyond the paper (issue 39's lever 4): the Adam learning rate of the
        teachers and the generator, which is also the step of the voted update (the
        paper's 1e-3); data-independent, so the accounting is unchanged.
      class_guidance: beyond the paper (issue 39's lever 5): lambda of the teachers' class
        term (:attr:`dclens.datalens.config.TrainConfig.class_guidance`); each teacher's
        vote is still a function of its own partition, so the accounting is unchanged.
      mismatch_negatives: beyond the paper (issue 39's lever 5): the last m slots of each
        teacher's fake batch hold its own records under a wrong label
        (:attr:`dclens.datalens.config.TrainConfig.mismatch_negatives`); still only its own
        partition, so the accounting is unchanged.
      sigma_factor: beyond the paper (issue 39's lever 3): the run's sigma (the paper's,
        times ``sigma_scale`` when set) times this factor, under the same epsilon budget.
        RDP of the Gaussian vote grows with steps / sigma^2, so about ``sigma_factor**2``
        times the steps: more, noisier steps (> 1) or fewer, cleaner ones (< 1) at equal
        epsilon. The ledger accounts the sigma actually used.
      batch_size: beyond the paper (issue 39's lever 3): the batch (each teacher's real and
        fake halves, and the generated images voted on per step: the queries per step)
        instead of the paper's 30 cut to the partition size. At most the partition size
        (refused above it, where the run would cut it silently); under the same budget
        about ``paper batch / batch_size`` times the steps.
      shared_teacher_init: beyond the paper (issue 39): every teacher starts from the same
        initial weights (:attr:`dclens.datalens.config.TrainConfig.shared_teacher_init`);
        data-independent, so the accounting is unchanged.
      teacher_steps: beyond the paper (issue 39's lever 4): each teacher's Adam steps per
        generator step (:attr:`dclens.datalens.config.TrainConfig.d_step`; the paper's 2;
        the first step's ``pretrain_teacher`` stays the paper's). A teacher trains on its
        own partition only and only the votes are released, so the sensitivity and the
        accounting are unchanged; the teachers' compute grows with it.
      generator_width: beyond the paper (issue 39's lever 4): the student generator's
        width as a multiple W of the paper's: gf = 64 W filters and gfc = 1024 W dense
        units (:attr:`dclens.datalens.config.TrainConfig.generator_filters`,
        ``generator_dense``); 64 W must be a whole number. The architecture is
        data-independent and the generator reads only the released votes, so the
        accounting is unchanged.
      generator_upsampling: beyond the paper (issue 39's lever 4): ``"resize"`` doubles
        the generator's feature maps by a nearest-neighbour resize then a convolution
        instead of the authors' transposed convolutions, so its samples carry no
        checkerboard; ``"transpose4"`` by 4x4 transposed convolutions (an even overlap)
        (:attr:`dclens.datalens.config.TrainConfig.generator_upsampling`).
        Data-independent, so the accounting is unchanged.  ``None`` or ``"transpose"``:
        the paper's.
      warm_start: beyond the paper (issue 39): the folder of a finished DP-MERF run on
        the same records; the generator starts from its fit and the ledger from its
        release (:attr:`dclens.datalens.config.TrainConfig.warm_start`), so the budget
        covers both and TopAgg gets the steps left.  At the noise-matched scale, match the
        DP-MERF run's noise too (``scripts/merf.py --noise_scale`` = ``sigma_scale``) and
        account by pld: every spend's mu^2 then scales alike and the run stops where the
        paper-scale run would.  ``None``: the paper's random start.
      teacher_width: beyond the paper (issue 39's lever 4): the teacher discriminators'
        width as a multiple W of the paper's: df = 32 W filters and dfc = 256 W dense
        units (:attr:`dclens.datalens.config.TrainConfig.teacher_filters`,
        ``teacher_dense``); 32 W must be a whole number. Each teacher still reads only its
        own partition and submits a clipped sign vote, so the sensitivity and the
        accounting are unchanged; the teachers' compute and bank grow with it.
      query_batch: beyond the paper (issue 39's lever 3): the fake images voted on per
        round (:attr:`dclens.datalens.config.TrainConfig.query_batch`) while the teachers
        keep their batch: each query is the same Gaussian vote, so the same budget buys
        about ``batch / query_batch`` times the steps.  At most the run's batch.
      repeat: the r-th (r >= 2) independent run of otherwise equal options: only its name
        differs (``-rep<r>``), its seed is its own (OS entropy unless ``seed`` is set).
      training_records: a :class:`dclens.data.splits.TrainingRecords` value: ``all`` (the
        paper's), ``private`` (a tuned configuration's private run: the tuning split is
        left out) or ``tuning`` (a screening run: trained on the tuning split and scored
        on its holdout instead of the test set, so its results may choose
        hyper-parameters).
    """

    dataset: str = "fashion_mnist"
    eps: int = 1
    scale: float | None = None
    teachers: int | None = None
    non_private: bool = False
    epochs: int | None = None
    num_samples: int | None = None
    max_records: int | None = None
    seed: int | None = None
    data_dir: str | None = None
    teacher_chunk: int | None = None
    aggregation: str | None = None
    thresh: float | None = None
    topk: int | None = None
    balanced_partition: bool = False
    fake_rendering: str | None = None
    sigma_scale: float | None = None
    conversion: str | None = None
    generator_ema: float | None = None
    training_records: str | None = None
    repeat: int | None = None
    learning_rate: float | None = None
    class_guidance: float | None = None
    class_direction_every: int = 0
    class_guidance_form: str | None = None
    mismatch_negatives: int | None = None
    sigma_factor: float | None = None
    batch_size: int | None = None
    shared_teacher_init: bool = False
    teacher_steps: int | None = None
    generator_width: float | None = None
    generator_upsampling: str | None = None
    teacher_width: float | None = None
    query_batch: int | None = None
    warm_start: str | None = None

    def __post_init__(self) -> None:
        if (self.dataset, self.eps) not in PAPER_TABLE1:
            raise ReproduceError(f"the paper has no row for dataset={self.dataset!r}, "
                                 f"eps={self.eps!r}; rows: " + ", ".join(
                                     f"{d} eps={e}" for d, e in PAPER_TABLE1))
        if self.dataset == "celebA-hair":
            raise ReproduceError("celebA-hair: the paper's hyper-parameters for it are not "
                                 "published with the code (no preset); only its Table 1 "
                                 "value is known")
        if self.scale is not None and not (isinstance(self.scale, (int, float))
                                           and 0 < self.scale <= 1):
            raise ReproduceError(f"scale must be in (0, 1], got {self.scale!r}")
        if self.aggregation is not None and self.aggregation not in {
                a.value for a in cfg.Aggregation}:
            raise ReproduceError(f"unknown aggregation {self.aggregation!r}; use one of "
                                 f"{[a.value for a in cfg.Aggregation]}")
        if self.thresh is not None and not (isinstance(self.thresh, (int, float))
                                            and 0 <= self.thresh < 1):
            raise ReproduceError(f"thresh must be in [0, 1), got {self.thresh!r}")
        if not isinstance(self.shared_teacher_init, bool):
            raise ReproduceError(f"shared_teacher_init must be True or False, got "
                                 f"{self.shared_teacher_init!r}")
        if not isinstance(self.balanced_partition, bool):
            raise ReproduceError(f"balanced_partition must be True or False, got "
                                 f"{self.balanced_partition!r}")
        if self.fake_rendering is not None and self.fake_rendering not in {
                r.value for r in cfg.FakeRendering}:
            raise ReproduceError(f"unknown fake_rendering {self.fake_rendering!r}; use one of "
                                 f"{[r.value for r in cfg.FakeRendering]}")
        if self.sigma_scale is not None:
            if isinstance(self.sigma_scale, bool) or not (
                    isinstance(self.sigma_scale, (int, float))
                    and 0 < self.sigma_scale <= 1):
                raise ReproduceError(f"sigma_scale must be in (0, 1] (a fraction of the "
                                     f"paper's sigma), got {self.sigma_scale!r}")
            if self.non_private:
                raise ReproduceError("sigma_scale scales the noise of a private run; a "
                                     "non_private run has none: give one of them")
        if self.conversion is not None and self.conversion not in {
                c.value for c in accounting.Conversion}:
            raise ReproduceError(f"unknown conversion {self.conversion!r}; use one of "
                                 f"{[c.value for c in accounting.Conversion]}")
        if self.generator_ema is not None and (
                isinstance(self.generator_ema, bool)
                or not isinstance(self.generator_ema, (int, float))
                or not 0 <= self.generator_ema < 1):
            raise ReproduceError(f"generator_ema must be a decay in [0, 1), got "
                                 f"{self.generator_ema!r}")
        if self.learning_rate is not None and (
                isinstance(self.learning_rate, bool)
                or not isinstance(self.learning_rate, (int, float))
                or not math.isfinite(self.learning_rate) or self.learning_rate <= 0):
            raise ReproduceError(f"learning_rate must be a finite number > 0, got "
                                 f"{self.learning_rate!r}")
        if self.class_guidance is not None and (
                isinstance(self.class_guidance, bool)
                or not isinstance(self.class_guidance, (int, float))
                or not math.isfinite(self.class_guidance) or self.class_guidance < 0):
            raise ReproduceError(f"class_guidance must be a finite number >= 0, got "
                                 f"{self.class_guidance!r}")
        if self.mismatch_negatives is not None and (
                isinstance(self.mismatch_negatives, bool)
                or not isinstance(self.mismatch_negatives, int) or self.mismatch_negatives < 0):
            raise ReproduceError(f"mismatch_negatives must be an integer >= 0 (0: the "
                                 f"paper's teachers), got {self.mismatch_negatives!r}")
        if self.sigma_factor is not None:
            if (isinstance(self.sigma_factor, bool)
                    or not isinstance(self.sigma_factor, (int, float))
                    or not math.isfinite(self.sigma_factor) or self.sigma_factor <= 0):
                raise ReproduceError(f"sigma_factor must be a finite number > 0 (the run's "
                                     f"sigma over the paper's), got {self.sigma_factor!r}")
            if self.non_private:
                raise ReproduceError("sigma_factor scales the noise of a private run; a "
                                     "non_private run has none: give one of them")
        _check_width_multiple("generator_width", self.generator_width,
                              networks.GENERATOR_FILTERS)
        _check_width_multiple("teacher_width", self.teacher_width,
                              networks.DISCRIMINATOR_FILTERS)
        if self.generator_upsampling is not None and self.generator_upsampling not in {
                u.value for u in cfg.GeneratorUpsampling}:
            raise ReproduceError(f"unknown generator_upsampling {self.generator_upsampling!r}; "
                                 f"use one of {[u.value for u in cfg.GeneratorUpsampling]} "
                                 f"('transpose': the paper's)")
        if self.class_guidance_form is not None and self.class_guidance_form not in {
                f.value for f in cfg.GuidanceForm}:
            raise ReproduceError(f"unknown class_guidance_form {self.class_guidance_form!r}; "
                                 f"use one of {[f.value for f in cfg.GuidanceForm]}")
        if self.training_records is not None and self.training_records not in {
                r.value for r in splits.TrainingRecords}:
            raise ReproduceError(f"unknown training_records {self.training_records!r}; use "
                                 f"one of {[r.value for r in splits.TrainingRecords]}")
        for name in ("teachers", "epochs", "num_samples", "max_records", "teacher_chunk",
                     "topk", "batch_size", "teacher_steps", "query_batch"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ReproduceError(f"{name} must be an integer >= 1, got {value!r}")
        if self.repeat is not None and (isinstance(self.repeat, bool)
                                        or not isinstance(self.repeat, int) or self.repeat < 2):
            raise ReproduceError(f"repeat numbers the 2nd, 3rd, ... run of the same options "
                                 f"(the first has none): an integer >= 2, got {self.repeat!r}")
        if self.max_records is not None and self.max_records > self.available_records:
            raise ReproduceError(f"max_records {self.max_records} exceeds the "
                                 f"{self.available_records} {self.records.value} training "
                                 f"records of {self.dataset}")
        if self.batch_size is None and self.query_batch is None:
            return
        paper_teachers = cfg.paper_preset(self.dataset, self.eps).train.num_teachers
        partition = ((self.max_records or self.available_records)
                     // self.resolved_teachers(paper_teachers))
        if self.batch_size is not None and self.batch_size > partition:
            raise ReproduceError(f"batch_size {self.batch_size} exceeds the partition "
                                 f"size {partition} (records per teacher), to which a "
                                 f"run cuts its batch; give at most {partition}")
        batch = min(self.batch_size or self.paper_batch, partition)
        if self.query_batch is not None and self.query_batch > batch:
            raise ReproduceError(f"query_batch {self.query_batch} exceeds the run's batch "
                                 f"of {batch} (a round renders {batch} images and votes on "
                                 f"the first query_batch); give at most {batch}")

    @property
    def records(self) -> splits.TrainingRecords:
        """Which training records the run reads (``all`` unless set)."""
        return splits.TrainingRecords(self.training_records or "all")

    @property
    def available_records(self) -> int:
        """How many records :attr:`records` holds (before ``max_records``)."""
        return len(splits.record_range(TRAIN_RECORDS[self.dataset], self.records))

    @property
    def margin_guidance(self) -> bool:
        """Whether the class term is the margin form (:class:`cfg.GuidanceForm`)."""
        return self.class_guidance_form == cfg.GuidanceForm.MARGIN.value

    @property
    def screening(self) -> bool:
        """Whether this is a screening run (trained on the tuning split)."""
        return self.records is splits.TrainingRecords.TUNING
    @property
    def paper_accuracy(self) -> float:
        return PAPER_TABLE1[(self.dataset, self.eps)]

    def default_name(self) -> str:
        """``fashion_mnist-eps1`` for the paper config; every deviation that changes the
        result is in the name, so a shortened run never takes the paper run's folder:
        ``-t400`` (teachers), ``-e50`` (training capped at 50 epochs), ``-n10000``
        (samples), ``-r6000`` (records), ``-nonprivate`` (the eps=inf row), and what an
        analysis row changes: ``-no_topk`` (aggregation), ``-b0`` (beta), ``-k100`` (top-k);
        and the fidelity options: ``-balanced`` (the authors' partition),
        ``-teacher_labels`` (the authors' fake-batch rendering); ``-sigma0.05`` (the
        noise-matched reduced scale, :attr:`sigma_scale`)."""
        name = f"{self.dataset}-eps{self.eps}"
        paper = cfg.paper_preset(self.dataset, self.eps).train.num_teachers
        teachers = self.resolved_teachers(paper)
        if teachers != paper:
            name += f"-t{teachers}"
        for value, tag in ((self.epochs, "e"), (self.num_samples, "n"),
                           (self.max_records, "r")):
            if value is not None:
                name += f"-{tag}{value}"
        paper_topagg = cfg.paper_preset(self.dataset, self.eps).topagg
        if self.aggregation is not None and self.aggregation != paper_topagg.method.value:
            name += f"-{self.aggregation}"
        if self.thresh is not None and self.thresh != paper_topagg.thresh:
            name += f"-b{self.thresh:g}"
        if self.topk is not None and self.topk != paper_topagg.topk:
            name += f"-k{self.topk}"
        for tag in self.fidelity_tags():
            name += f"-{tag}"
        if self.sigma_scale is not None and self.sigma_scale != 1:
            name += f"-sigma{self.sigma_scale:g}"
        if self.conversion is not None and self.conversion != "classic":
            name += f"-{self.conversion}"
        if self.generator_ema:
            name += f"-ema{self.generator_ema:g}"
        paper_rate = cfg.paper_preset(self.dataset, self.eps).train.learning_rate
        if self.learning_rate is not None and self.learning_rate != paper_rate:
            name += f"-lr{self.learning_rate:g}"
        if self.class_guidance:
            name += f"-cg{self.class_guidance:g}"
            if self.margin_guidance:
                name += "m"
        if self.mismatch_negatives:
            name += f"-mm{self.mismatch_negatives}"
        if self.sigma_factor is not None and self.sigma_factor != 1:
            name += f"-sf{self.sigma_factor:g}"
        if self.batch_size is not None and self.batch_size != self.paper_batch:
            name += f"-bs{self.batch_size}"
        if self.shared_teacher_init:
            name += "-sharedinit"
        paper_steps = cfg.paper_preset(self.dataset, self.eps).train.d_step
        if self.teacher_steps is not None and self.teacher_steps != paper_steps:
            name += f"-ds{self.teacher_steps}"
        if self.generator_width is not None and self.generator_width != 1:
            name += f"-gw{self.generator_width:g}"
        if self.generator_upsampling not in (None, cfg.GeneratorUpsampling.TRANSPOSE.value):
            name += f"-{self.generator_upsampling}"
        if self.teacher_width is not None and self.teacher_width != 1:
            name += f"-tw{self.teacher_width:g}"
        if self.query_batch is not None:
            name += f"-qb{self.query_batch}"
        if self.warm_start is not None:
            name += "-warm"
        if self.records is not splits.TrainingRecords.ALL:
            name += f"-{self.records.value}"
        if self.repeat is not None:
            name += f"-rep{self.repeat}"
        if self.non_private:
            name += "-nonprivate"
        return name

    @property
    def paper_batch(self) -> int:
        """The paper run's effective batch: its batch_size cut to its partition size."""
        paper = cfg.paper_preset(self.dataset, self.eps).train
        return min(paper.batch_size, TRAIN_RECORDS[self.dataset] // paper.num_teachers)

    def fidelity_tags(self) -> list[str]:
        """The fidelity options this run sets, as name tags (empty: dclens' defaults)."""
        tags = ["balanced"] if self.balanced_partition else []
        if (self.fake_rendering is not None
                and self.fake_rendering != cfg.FakeRendering.CLASS_GRID.value):
            tags.append(self.fake_rendering)
        return tags

    def resolved_teachers(self, paper_teachers: int) -> int:
        if self.teachers is not None:
            return self.teachers
        if self.scale is not None:
            return max(1, int(round(self.scale * paper_teachers)))
        return paper_teachers


def build_config(options: ReproduceOptions) -> tuple[cfg.DataLensConfig, list[str]]:
    """The run's config and the list of its deviations from the paper config (empty = none)."""
    paper = cfg.paper_preset(options.dataset, options.eps)
    train: dict = {"data_dir": options.data_dir, "seed": options.seed}
    topagg: dict = {}
    budget: dict = {}
    deviations = _scale_deviations(options, paper, train)
    deviations += _analysis_deviations(options, paper, topagg)
    # Fidelity options: the authors' choices where dclens' defaults differ. Not deviations
    # from the paper's config, so not listed as such; the report names them.
    if options.balanced_partition:
        train["balanced_partition"] = True
    if options.fake_rendering is not None:
        train["fake_rendering"] = cfg.FakeRendering(options.fake_rendering)
    if options.sigma_scale is not None and options.sigma_scale != 1:
        deviations.append(_noise_matched(options, paper, topagg, budget))
    deviations += _levers(options, paper, train, budget)
    deviations += _equal_epsilon_tradeoff(options, paper, train, topagg)
    config = paper.replace(train=train, topagg=topagg, budget=budget)
    if options.non_private:
        config, deviation = _non_private(options, config)
        deviations.append(deviation)
    return config, deviations


def _scale_deviations(options: ReproduceOptions, paper: cfg.DataLensConfig,
                      train: dict) -> list[str]:
    """Teachers, records, samples, chunk and epochs (``train``'s settings) and their words."""
    paper_teachers = paper.train.num_teachers
    records = options.max_records or options.available_records
    paper_batch = options.paper_batch
    teachers = options.resolved_teachers(paper_teachers)
    deviations: list[str] = []
    if teachers != paper_teachers:
        train["num_teachers"] = teachers
        # Keep the paper's queries per step (its batch: 30 cut to the partition size), so the
        # privacy cost per step and the number of steps to the budget stay the paper's.
        train["batch_size"] = paper_batch
        relative_noise = paper_teachers / teachers * (options.sigma_scale or 1.0)
        if options.non_private:
            noise = ""
        elif options.sigma_scale is None:
            noise = (f"; with the paper's sigma the noise is {relative_noise:g}x larger "
                     f"relative to the vote sum (at most {teachers})")
        else:
            noise = (f"; sigma is scaled (below), so the noise relative to the vote sum "
                     f"(at most {teachers}) is {relative_noise:g}x the paper's")
        partition, paper_partition = (records // teachers,
                                      TRAIN_RECORDS[options.dataset] // paper_teachers)
        sizes = (f"partitions of {partition} records, as the paper's"
                 if partition == paper_partition else
                 f"partitions of {partition} records instead of {paper_partition}")
        deviations.append(f"{teachers} teachers instead of the paper's {paper_teachers} "
                          f"({sizes}){noise}")
        deviations.append(f"batch_size {paper_batch} (the paper run's effective batch: 30 cut "
                          f"to its partition size), so queries per step and steps to the "
                          f"budget match the paper run")
    if options.max_records is not None:
        train["max_records"] = options.max_records
        which = ("" if options.records is splits.TrainingRecords.ALL
                 else f" {options.records.value}")
        deviations.append(f"trained on the first {options.max_records}{which} records only")
    if options.num_samples is not None and options.num_samples != paper.train.num_samples:
        train["num_samples"] = options.num_samples
        deviations.append(f"{options.num_samples} synthetic samples instead of the paper's "
                          f"{paper.train.num_samples}")
    if options.teacher_chunk is not None:
        train["teacher_chunk"] = options.teacher_chunk
    if options.epochs is not None:
        train["epochs"] = options.epochs
        deviations.append(f"training capped at {options.epochs} epoch(s)")
    return deviations


def _analysis_deviations(options: ReproduceOptions, paper: cfg.DataLensConfig,
                         topagg: dict) -> list[str]:
    """An analysis row's aggregation, beta and k (``topagg``'s settings) and their words."""
    deviations: list[str] = []
    if options.aggregation is not None and options.aggregation != paper.topagg.method.value:
        topagg["method"] = cfg.Aggregation(options.aggregation)
        deviations.append(f"aggregation {options.aggregation} instead of the paper's "
                          f"{paper.topagg.method.value} (an analysis row, Tables 5-7)")
    if options.thresh is not None and options.thresh != paper.topagg.thresh:
        topagg["thresh"] = float(options.thresh)
        deviations.append(f"beta = {options.thresh:g} instead of {paper.topagg.thresh:g} "
                          f"(an analysis row, Tables 4 and 7)")
    if options.topk is not None and options.topk != paper.topagg.topk:
        topagg["topk"] = options.topk
        deviations.append(f"top-k = {options.topk} instead of {paper.topagg.topk} (an "
                          f"analysis row, Table 4)")
    return deviations


def _check_width_multiple(name: str, width: float | None, filters: int) -> None:
    """A ReproduceError unless ``width`` is None or a number > 0 that makes ``filters`` x
    width a whole number of filters."""
    if width is None:
        return
    if (isinstance(width, bool) or not isinstance(width, (int, float))
            or not math.isfinite(width) or width <= 0 or (filters * width) % 1):
        raise ReproduceError(
            f"{name} must be a number > 0 that makes {filters} x width a whole number of "
            f"filters (e.g. 0.5 or 2; 1 is the paper's), got {width!r}")


#: The networks a width lever scales: (words, TrainConfig field prefix, the paper's
#: filters, the paper's dense units).
_WIDTHS = {"generator": ("a generator", "generator", networks.GENERATOR_FILTERS,
                         networks.GENERATOR_DENSE),
           "teacher": ("teachers", "teacher", networks.DISCRIMINATOR_FILTERS,
                       networks.DISCRIMINATOR_DENSE)}


#: The generator upsamplings beyond the paper, in words.
_UPSAMPLING_WORDS = {
    cfg.GeneratorUpsampling.RESIZE: "a generator with resize-convolutions (a "
                                    "nearest-neighbour 2x resize, then a 5x5 convolution: "
                                    "no checkerboard)",
    cfg.GeneratorUpsampling.TRANSPOSE4: "a generator with stride-2 4x4 transposed "
                                        "convolutions (an even overlap)",
}


def scaled_size(width: float, filters: int, dense: int) -> tuple[int, int]:
    """(filters, dense units) of a network ``width`` times as wide as one of ``filters``
    and ``dense`` (``filters`` x width a whole number, checked by
    :class:`ReproduceOptions`)."""
    return round(filters * width), round(dense * width)


def _levers(options: ReproduceOptions, paper: cfg.DataLensConfig, train: dict,
            budget: dict) -> list[str]:
    """The levers beyond the paper a run sets (``train``'s and ``budget``'s settings) and
    their words."""
    deviations: list[str] = []
    if options.conversion is not None and options.conversion != paper.budget.conversion.value:
        budget["conversion"] = accounting.Conversion(options.conversion)
        deviations.append(f"beyond the paper: the {options.conversion} conversion instead of "
                          f"the paper's {paper.budget.conversion.value} (the same epsilon "
                          f"budget, accounted differently: a different number of steps)")
    if options.generator_ema:
        train["generator_ema"] = float(options.generator_ema)
        deviations.append(f"beyond the paper: samples from a moving average of the "
                          f"generator's weights, decay {options.generator_ema:g} "
                          f"(post-processing)")
    if (options.learning_rate is not None
            and options.learning_rate != paper.train.learning_rate):
        train["learning_rate"] = float(options.learning_rate)
        deviations.append(f"beyond the paper: learning rate {options.learning_rate:g} "
                          f"(teachers, generator and the voted update's step) instead of "
                          f"{paper.train.learning_rate:g}")
    if options.margin_guidance:        # refused by TrainConfig without class_guidance
        train["class_guidance_form"] = cfg.GuidanceForm.MARGIN
    if options.class_guidance:
        train["class_guidance"] = float(options.class_guidance)
        deviations.append(f"beyond the paper: class guidance {options.class_guidance:g} "
                          f"(each teacher's vote also descends its own label "
                          + ("margin, its logit for the label minus its mean over the "
                             "labels" if options.margin_guidance else "cross-entropy")
                          + "; the same sensitivity)")
    if options.mismatch_negatives:
        train["mismatch_negatives"] = int(options.mismatch_negatives)
        deviations.append(f"beyond the paper: matching-aware teachers (the last "
                          f"{options.mismatch_negatives} slots of each teacher's fake batch "
                          f"are its own records under a wrong label; the same sensitivity)")
    if options.shared_teacher_init:
        train["shared_teacher_init"] = True
        deviations.append("beyond the paper: every teacher starts from the same initial "
                          "weights (data-independent; the same sensitivity)")
    if options.teacher_steps is not None and options.teacher_steps != paper.train.d_step:
        train["d_step"] = int(options.teacher_steps)
        deviations.append(f"beyond the paper: {options.teacher_steps} Adam steps per teacher "
                          f"per generator step instead of {paper.train.d_step} (each on its "
                          f"own partition; the same sensitivity)")
    for width, (who, prefix, filters_0, dense_0) in (
            (options.generator_width, _WIDTHS["generator"]),
            (options.teacher_width, _WIDTHS["teacher"])):
        if width is not None and width != 1:
            filters, dense = scaled_size(width, filters_0, dense_0)
            train[f"{prefix}_filters"], train[f"{prefix}_dense"] = filters, dense
            deviations.append(f"beyond the paper: {who} {width:g} x as wide ({filters} "
                              f"filters and {dense} dense units instead of {filters_0} and "
                              f"{dense_0}; data-independent, the same sensitivity)")
    if options.generator_upsampling not in (None, cfg.GeneratorUpsampling.TRANSPOSE.value):
        upsampling = cfg.GeneratorUpsampling(options.generator_upsampling)
        train["generator_upsampling"] = upsampling
        deviations.append(f"beyond the paper: {_UPSAMPLING_WORDS[upsampling]} instead of the "
                          f"paper's stride-2 5x5 transposed convolutions; data-independent, "
                          f"the same sensitivity")
    if options.warm_start is not None:
        train["warm_start"] = options.warm_start
        deviations.append(f"beyond the paper: the generator starts from the DP-MERF run "
                          f"{options.warm_start} (a generator fitted to one Gaussian release "
                          f"of the same records' class-conditional mean embedding); that "
                          f"release is counted in this run's ledger, so the budget covers "
                          f"both and TopAgg runs the steps left")
    if options.query_batch is not None:
        train["query_batch"] = options.query_batch
        deviations.append(f"beyond the paper: {options.query_batch} fake images voted on per "
                          f"round instead of the whole batch (the teachers keep their "
                          f"batch; each query is the same Gaussian vote, so the same budget "
                          f"buys more steps)")
    if options.class_direction_every:     # a diagnostic: the run's outputs are the same
        train["class_direction_every"] = options.class_direction_every
    if options.records is not splits.TrainingRecords.ALL:
        train["training_records"] = options.records
        deviations.append("beyond the paper: trained on " + splits.describe(
            options.records, TRAIN_RECORDS[options.dataset]))
    return deviations


def _equal_epsilon_tradeoff(options: ReproduceOptions, paper: cfg.DataLensConfig,
                           train: dict, topagg: dict) -> list[str]:
    """Issue 39's lever 3 (``train``'s batch and ``topagg``'s sigma) and their words.

    Both leave the budget alone (the paper's, or the noise-matched one already in place),
    so the run spends the same epsilon over a different number of steps: RDP of the
    Gaussian vote is linear in steps x queries per step / sigma^2.
    """
    deviations: list[str] = []
    if options.sigma_factor is not None and options.sigma_factor != 1:
        base_sigma = paper.topagg.sigma * (options.sigma_scale or 1.0)
        topagg["sigma"] = base_sigma * float(options.sigma_factor)
        each = "noisier" if options.sigma_factor > 1 else "less noisy"
        deviations.append(f"beyond the paper: sigma = {topagg['sigma']:g} "
                          f"({options.sigma_factor:g} x {base_sigma:g}) under the same "
                          f"epsilon budget: about {options.sigma_factor ** 2:.3g} x the "
                          f"steps, each {each}")
    if options.batch_size is not None and options.batch_size != options.paper_batch:
        train["batch_size"] = options.batch_size
        deviations.append(f"beyond the paper: batch {options.batch_size} instead of "
                          f"{options.paper_batch} (each teacher's real and fake halves and "
                          f"the images voted on per step) under the same epsilon budget: "
                          f"about {options.paper_batch / options.batch_size:.3g} x the "
                          f"steps")
    return deviations


def _noise_matched(options: ReproduceOptions, paper: cfg.DataLensConfig, topagg: dict,
                   budget: dict) -> str:
    """The noise-matched reduced scale: sigma scaled, the budget raised to the paper's steps."""
    teachers = options.resolved_teachers(paper.train.num_teachers)
    topagg["sigma"] = paper.topagg.sigma * options.sigma_scale
    # A run accounted otherwise than the paper (pld) is matched to the steps the paper
    # config gets under that accounting: the small model of that run.
    conversion = (accounting.Conversion(options.conversion) if options.conversion
                  else paper.budget.conversion)
    budget["max_eps"] = matched_budget(options.dataset, options.eps, topagg["sigma"],
                                       conversion)
    steps = paper_steps(options.dataset, options.eps, conversion)
    accounted = ("" if conversion is paper.budget.conversion
                 else f" under the {conversion.value} conversion")
    return (f"NOT epsilon = {options.eps}: sigma = {topagg['sigma']:g} ({options.sigma_scale:g} "
            f"x the paper's {paper.topagg.sigma:g}; at {teachers} teachers the noise relative "
            f"to the vote sum is the paper's at {teachers / options.sigma_scale:g}), and the "
            f"budget is raised to epsilon {budget['max_eps']:.4g}, between what the paper "
            f"config's {steps} and {steps + 1} steps cost at that sigma{accounted}, so the "
            f"paper's TopAgg runs the paper's {steps} steps{accounted} (a noise-matched "
            f"reduced scale; a row that changes k, sigma or the batch runs the steps this "
            f"budget allows it)")


def _non_private(options: ReproduceOptions,
                 config: cfg.DataLensConfig) -> tuple[cfg.DataLensConfig, str]:
    """The eps = inf reference: no noise, as many whole epochs as the private run's steps."""
    records = options.max_records or options.available_records
    batch = min(config.train.batch_size, records // config.train.num_teachers)
    steps = accounting.max_steps_within(
        sigma=config.topagg.sigma, topk=config.topagg.topk,
        queries_per_step=min(config.train.query_batch or batch, batch) * config.train.g_step,
        max_eps=config.budget.max_eps,
        delta=config.budget.delta, conversion=config.budget.conversion,
        orders=(accounting.classic_orders(config.budget.max_order)
                if config.budget.conversion is accounting.Conversion.CLASSIC else None))
    steps_per_epoch = max(1, (records // config.train.num_teachers) // batch)
    epochs = max(1, math.ceil(steps / steps_per_epoch))
    if options.epochs is not None:
        epochs = min(epochs, options.epochs)
    config = config.replace(train={"non_private": True, "epochs": epochs},
                            topagg={"sigma": 0.0})
    return config, (f"NON-PRIVATE: no noise and no budget (sigma = 0); {epochs} "
                    f"epoch(s) = {epochs * steps_per_epoch} steps, the fewest whole "
                    f"epochs covering the {steps} steps the private config allows; the "
                    f"paper's eps = inf column is a non-private DC-GAN, not this run")


def _paper_accounting(dataset: str, eps: int,
                      conversion: accounting.Conversion | None = None
                      ) -> tuple[cfg.DataLensConfig, int, tuple | None,
                                 accounting.Conversion]:
    """The paper config of the Table 1 row, its TopAgg queries per step (B: 30 cut to the
    15-record partitions, times g_step), the RDP orders its budget is checked at and the
    conversion (``conversion``, else the paper's)."""
    paper = cfg.paper_preset(dataset, eps)
    conversion = conversion or paper.budget.conversion
    queries = min(paper.train.batch_size,
                  TRAIN_RECORDS[dataset] // paper.train.num_teachers) * paper.train.g_step
    orders = (accounting.classic_orders(paper.budget.max_order)
              if conversion is accounting.Conversion.CLASSIC else None)
    return paper, queries, orders, conversion


def paper_steps(dataset: str, eps: int,
                conversion: accounting.Conversion | None = None) -> int:
    """The steps the paper config of the Table 1 row (``dataset``, ``eps``) runs before
    its budget: TopAgg with the paper's sigma and k, B queries per step, its epsilon
    obtained by ``conversion`` (default: the paper's; ``pld`` fits more steps)."""
    paper, queries, orders, conversion = _paper_accounting(dataset, eps, conversion)
    return accounting.max_steps_within(
        sigma=paper.topagg.sigma, topk=paper.topagg.topk, queries_per_step=queries,
        max_eps=paper.budget.max_eps, delta=paper.budget.delta,
        conversion=conversion, orders=orders)


def matched_budget(dataset: str, eps: int, sigma: float,
                   conversion: accounting.Conversion | None = None) -> float:
    """The epsilon budget under which TopAgg with ``sigma`` (the paper's k and queries per
    step) runs exactly the paper row's :func:`paper_steps`: the midpoint between the
    epsilon after that many steps and after one more, so floating-point differences in
    composing the ledger step by step cannot move the stop by a step.

    RDP is linear in steps / noise_multiplier^2, so at a common budget every mechanism of
    an analysis table (its own sensitivity, its own noise multiplier) runs the steps it
    would run at the paper's sigma and epsilon, up to rounding: the rows stay comparable
    as at the paper scale.

    With ``conversion`` (e.g. ``pld``) both the paper's steps and this budget are
    obtained by it: the small model of the paper config accounted that way (pld: the 149
    steps the paper's epsilon = 1 then allows, not the 86 of the classic conversion).
    """
    paper, queries, orders, conversion = _paper_accounting(dataset, eps, conversion)
    steps = paper_steps(dataset, eps, conversion)
    at, after = (accounting.epsilon_for(
        sigma=sigma, topk=paper.topagg.topk, queries_per_step=queries, steps=n,
        delta=paper.budget.delta, conversion=conversion,
        orders=orders).epsilon for n in (steps, steps + 1))
    return (at + after) / 2


def teacher_state_bytes(dataset: str, teachers: int) -> int | None:
    """Bytes of the teacher bank (weights + two Adam moments, float32) for ``teachers``."""
    try:

        spec = data.dataset_spec("celebA-gender-train" if dataset == "celebA-gender"
                                 else dataset)
        shape = networks.ImageShape(spec.height, spec.width, spec.channels, spec.num_classes)
        return 3 * 4 * teacher_module.ParamLayout.for_shape(shape).size * teachers
    except Exception:   # informative only: never fail a report over it
        return None


def scale_facts(config: cfg.DataLensConfig, options: ReproduceOptions, steps: int | None,
                train_seconds: float | None) -> dict:
    """How far this run is from the paper's scale, and what the paper's would cost here.

    The extrapolation is linear in the number of teachers (every teacher trains and is
    queried once per step) and counts the paper's number of steps; it is a rough guide.
    """
    paper = cfg.paper_preset(options.dataset, options.eps)
    teachers = config.train.num_teachers
    per_step = (train_seconds / steps) if (train_seconds and steps) else None
    paper_step_count = paper_steps(options.dataset, options.eps)
    return {
        "teachers": teachers, "paper_teachers": paper.train.num_teachers,
        "seconds_per_step": per_step, "paper_steps": paper_step_count,
        "paper_seconds_extrapolated": (per_step * paper.train.num_teachers / teachers
                                       * paper_step_count) if per_step else None,
        "paper_teacher_state_bytes": teacher_state_bytes(options.dataset,
                                                         paper.train.num_teachers),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _physical_memory(),
    }


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
