"""dclens command line, with the flag names of the DataLens authors' main.py.

    python scripts/main.py                     # the demo: Fashion-MNIST, ~10 min on 2 cores
    python scripts/main.py --dataset fashion_mnist --train --stochastic --signsgd \\
        --batch_teachers 50 --teachers_batch 80 --topk 200 --sigma 5000 --thresh 0.9 \\
        --max_eps 1 --d_step 2 --pretrain_teacher 10 --z_dim 50 --max_grad 1e-5 \\
        --checkpoint_dir fmnist-eps1        # an authors'-style command, as-is
    python scripts/main.py --preset fashion_mnist-eps1 --train --checkpoint_dir runs/f1

Flags not given take the preset's values.  The preset is ``demo`` when no --dataset is
given, else ``authors`` (the authors' main.py defaults), unless --preset names one.
Booleans accept ``--flag``, ``--noflag`` and ``--flag=true|false`` as absl does.
Flags of the authors' main.py that dclens does not implement are refused by name.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable
import enum
import os
import sys

from dclens.datalens import config as cfg
from dclens.cli import common_flags, graceful_stop, interrupted
from dclens.common import tf_env
from dclens.privacy.accounting import Conversion
from dclens import data
from dclens.datalens import outputs, run
from dclens.runs.checkpoint import CheckpointError
from dclens.runs.journal import JournalError
from dclens.datalens.sharded import ShardError
from dclens.datalens.teacher_bank import BankSpaceError

# The authors' main.py defaults (their flag definitions), for --preset authors.
AUTHORS_DEFAULTS = dict(epoch=1000, batch_size=30, learning_rate=1e-3, beta1=0.5, z_dim=100,
                        batch_teachers=1, teachers_batch=1, topk=50, sigma=2000.0, thresh=0.5,
                        max_eps=1.0, delta=1e-5, max_grad=0.0, d_step=1, g_step=1,
                        pretrain_teacher=0, orders=200, shuffle=True, stochastic=False,
                        signsgd=False)

# Flags of the authors' main.py that dclens does not implement (yet): refused by name.
UNSUPPORTED_AUTHORS_FLAGS = {
    "g_epoch": "the autoencoder pipeline is not implemented",
    "train_size": "use --max_records to train on a subset",
    "input_height": "image sizes follow the dataset (28x28 or 64x64)",
    "input_width": "image sizes follow the dataset (28x28 or 64x64)",
    "output_height": "image sizes follow the dataset (28x28 or 64x64)",
    "output_width": "image sizes follow the dataset (28x28 or 64x64)",
    "checkpoint_name": "outputs have fixed names inside --checkpoint_dir",
    "sample_dir": "samples are written into --checkpoint_dir",
    "load_d": "loading pretrained discriminators is not implemented",
    "crop": "CelebA is always centre-cropped",
    "proj_mat": "random projections are not implemented",
    "y_dim": "the number of classes follows the dataset",
    "tanh": "the generator output is a sigmoid",
    "random_proj": "random projections are not implemented",
    "simple_gan": "only the DCGAN architecture is implemented",
    "mean_kernel": "mean-kernel aggregation is not implemented; --aggregation lists the "
                   "implemented ones",
    "pca": "DP-PCA is not implemented",
    "increasing_dim": "random projections are not implemented",
    "wgan": "only the standard GAN loss is implemented",
    "small": "only the paper's discriminator is implemented",
    "sigma_thresh": "threshold GNMax is not implemented",
    "pca_sigma": "DP-PCA is not implemented",
    "step_size": "the voted update uses --learning_rate, as the authors' signsgd path does",
    "pca_dim": "DP-PCA is not implemented",
    "random_label": "random labels are not implemented",
    "save_epoch": "per-epsilon snapshots are not implemented yet",
    "teacher_dir": "teachers are kept inside the run",
    "generator_dir": "the generator is written to --checkpoint_dir/generator.keras",
    "loss": "the autoencoder pipeline is not implemented",
    "ae": "the autoencoder pipeline is not implemented",
    "train_ae": "the autoencoder pipeline is not implemented",
    "finetune_ae": "the autoencoder pipeline is not implemented",
    "sample_step": "TensorBoard sample grids are written automatically",
    "hid_dim": "the autoencoder pipeline is not implemented",
}

# Boolean flags of the authors' main.py whose *off* state (``--noX`` / ``--X false``) is
# their default or unread, and is what dclens does: accepted, so that their commands run as
# written (their README's paper commands carry --norandom_proj and --nosave_epoch).  The on
# state stays refused through UNSUPPORTED_AUTHORS_FLAGS.
OFF_IS_DCLENS = {
    "random_proj": "read by their code only when no sign, sketch or k-level aggregation is "
                   "named (G-PATE's gradient voting)",
    "save_epoch": "their default: no per-epsilon snapshots",
    "wgan": "their default: the standard GAN loss",
    "simple_gan": "their default: the DCGAN architecture",
    "small": "their default (and unread by their model)",
    "tanh": "their default: a sigmoid generator output",
    "pca": "their default: no DP-PCA",
    "mean_kernel": "their default: no mean-kernel aggregation",
    "increasing_dim": "their default: no growing projection",
    "random_label": "their default: the records' own labels",
}

BOOLEAN_FLAGS = ("train", "stochastic", "signsgd", "signsgd_nothresh", "klevelsgd", "signsgd_dept",
                 "save_vote", "sketchsgd",
                 "shuffle", "non_private", "pretrain")


class CliError(Exception):
    """A flag value the run cannot use."""


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "t", "y"):
        return True
    if lowered in ("0", "false", "no", "f", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# Where each flag's value lives in the config (for the defaults shown by --help).
FLAG_FIELDS = {"epoch": "train.epochs", "batch_size": "train.batch_size",
               "topk": "topagg.topk", "sigma": "topagg.sigma", "thresh": "topagg.thresh",
               "max_eps": "budget.max_eps", "delta": "budget.delta",
               "max_grad": "topagg.max_grad", "d_step": "train.d_step", "g_step": "train.g_step",
               "pretrain_teacher": "train.pretrain_teacher", "z_dim": "train.z_dim",
               "learning_rate": "train.learning_rate", "beta1": "train.beta1",
               "orders": "budget.max_order", "conversion": "budget.conversion",
               "partition_seed": "train.partition_seed", "teacher_chunk": "train.teacher_chunk",
               "num_samples": "train.num_samples", "shuffle": "train.balanced_partition",
               "non_private": "train.non_private", "conv_path": "train.conv_path",
               "fake_rendering": "train.fake_rendering", "klevel": "topagg.klevel",
               "aggregation": "topagg.method", "sketch_accounting": "topagg.sketch_accounting",
               "signsgd_dept": "train.data_dependent_analysis",
               "generator_ema": "train.generator_ema",
               "class_guidance": "train.class_guidance",
               "class_guidance_form": "train.class_guidance_form",
               "mismatch_negatives": "train.mismatch_negatives",
               "shared_teacher_init": "train.shared_teacher_init",
               "gf_dim": "train.generator_filters", "gfc_dim": "train.generator_dense",
               "generator_upsampling": "train.generator_upsampling",
               "df_dim": "train.teacher_filters", "dfc_dim": "train.teacher_dense",
               "query_batch": "train.query_batch",
               "warm_start": "train.warm_start",
               "training_records": "train.training_records"}


def _field(config: cfg.DataLensConfig, dotted: str):
    section, name = dotted.split(".")
    value = getattr(getattr(config, section), name)
    return value.value if hasattr(value, "value") else value


def _default_note(flag: str) -> str:
    """' [demo: X; with --dataset: Y]': the value a flag takes when not given, under the
    demo preset and under the authors' main.py defaults (--preset authors)."""
    demo = cfg.preset("demo")
    if flag in ("batch_teachers", "teachers_batch"):
        return (f" [demo: {demo.train.num_teachers} teachers in all; with --dataset: "
                f"{AUTHORS_DEFAULTS[flag]}]")
    if flag == "stochastic":
        return (" [demo: on; with --dataset: "
                f"{'on' if AUTHORS_DEFAULTS['stochastic'] else 'off'}]")
    if flag not in FLAG_FIELDS:
        return ""
    value = _field(demo, FLAG_FIELDS[flag])
    authors = AUTHORS_DEFAULTS.get(flag, _field(cfg.DataLensConfig(), FLAG_FIELDS[flag]))
    if flag == "max_grad":
        authors = 1e-5
    if flag == "shuffle":
        return (" [default: off, also with --dataset; the authors' default is on, which is "
                "not private: see --shuffle]")
    if value == authors:
        return f" [default: {value}]"
    return f" [demo: {value}; with --dataset: {authors}]"


BOOLEAN_HELP = {
    "train": "train (default for the demo; without it, --dataset runs sample the trained "
             "generator in --checkpoint_dir)",
    "stochastic": "stochastic sign of the top-k coordinates (paper Alg. 2); --nostochastic: "
                  "deterministic sign",
    "signsgd": "top-k sign voting (the paper's TopAgg); not with --signsgd_nothresh, "
               "--sketchsgd or --klevelsgd (the authors' code would ignore those); "
               "--nosignsgd only with one of them (alone it is refused: the authors' code "
               "then runs G-PATE's gradient voting, not implemented)",
    "signsgd_nothresh": "top-k sign without the threshold: the noisy vote sum / k is "
                        "released (with --stochastic = --aggregation no_threshold; without "
                        "it, the deterministic sign = --aggregation no_threshold_sign)",
    "sketchsgd": "FetchSGD: the top-k stochastic signs summed in a count sketch, unsketched, "
                 "top-k, thresholded (= --aggregation fetchsgd; noise on the sketch unless "
                 "--sketch_accounting authors_unproven)",
    "save_vote": "write every round's released (noisy, thresholded) update to "
                 "<checkpoint_dir>/votes/ (public); --save_raw_votes adds the raw sums",
    "signsgd_dept": "also compute the authors' data-dependent RDP bound of every call and "
                    "record its epsilon (paper Fig. 2) -- an analysis, NEVER spent: the "
                    "data-independent bound is the ledger",
    "klevelsgd": "D2P-Fed: L-level stochastic quantisation of every coordinate, no top-k "
                 "(= --aggregation klevel; L = --klevel)",
    "shuffle": "the authors' class-balanced disjoint partitions: a record's teacher then "
               "depends on every label, so the 2 sqrt(k) sensitivity does not hold and the "
               "epsilon is NOT a guarantee (marked in privacy.json); --noshuffle (default): "
               "slices of a random permutation of the record indices, data-independent",
    "non_private": "no noise and no budget: the output is NOT private (debugging only)",
    "pretrain": "load a pretrained generator (not implemented: refused; the authors' "
                "--nopretrain is the default)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="main.py", description="DataLens (dclens): DP image generation by gradient "
        "voting. Flag names follow the authors' main.py. Values in [] are what a flag "
        "not given takes: under the demo preset (no --dataset) and under the authors' "
        "main.py defaults (with --dataset, --preset authors).",
        epilog="Booleans take --flag, --noflag or --flag=true|false. Environment: the CLI "
        "sets TF_ENABLE_ONEDNN_OPTS=1 and TF_CPP_MIN_LOG_LEVEL=3 unless you set them "
        "(dclens/common/tf_env.py).", allow_abbrev=False)
    add = parser.add_argument
    _add_data_and_run_flags(add)
    _add_training_flags(add)
    _add_dclens_flags(add)
    for name in BOOLEAN_FLAGS:
        add(f"--{name}", nargs="?", const=True, default=None, type=_parse_bool,
            metavar="BOOL", help=BOOLEAN_HELP[name])
        add(f"--no{name}", dest=name, action="store_const", const=False, help=argparse.SUPPRESS)
    for action in parser._actions:                     # pylint: disable=protected-access
        flag = action.dest
        if action.help not in (None, argparse.SUPPRESS) and action.option_strings:
            action.help += _default_note(flag)
    for name in UNSUPPORTED_AUTHORS_FLAGS:
        add(f"--{name}", dest=f"unsupported_{name}", nargs="?", const=True, default=None,
            help=argparse.SUPPRESS)
        add(f"--no{name}", dest=f"unsupported_{name}", action="store_const", const=False,
            help=argparse.SUPPRESS)
    return parser




def _add_data_and_run_flags(add: Callable[..., argparse.Action]) -> None:
    """The preset, the data and the run directory."""
    add("--preset", help="demo | authors | " + " | ".join(cfg.PAPER_PRESET_NAMES) +
        " [default: demo without --dataset, else authors]")
    add("--dataset", help="mnist, fashion_mnist, celebA-gender-<split>, celebA-hair-<split>; "
        "celebA = celebA-gender-train")
    add("--data_dir", help="data root (authors' layout <data_dir>/<dataset>/...); default: "
        "/usr/share/datasets/fashion-mnist for fashion_mnist")
    add("--checkpoint_dir", "--run_dir", dest="checkpoint_dir",
        help="the run directory (--run_dir, the name every other dclens tool uses, is the "
             "same flag; default: runs/demo for the demo, checkpoint otherwise)")


def _add_training_flags(add: Callable[..., argparse.Action]) -> None:
    """The authors' training, TopAgg and budget flags (their names are the contract)."""
    add("--epoch", type=int, help="maximum epochs (passes over the partitions)")
    add("--batch_size", type=int, help="batch size (cut to the partition size)")
    add("--batch_teachers", type=int, help="teachers per batch (teachers = batch_teachers x "
        "teachers_batch)")
    add("--teachers_batch", type=int, help="number of teacher batches")
    add("--topk", type=int, help="coordinates each teacher votes on (k)")
    add("--sigma", type=float, help="std of the Gaussian noise on the vote sums")
    add("--thresh", type=float, help="threshold beta in [0, 1): votes pass at beta*N")
    add("--max_eps", type=float, help="privacy budget epsilon")
    add("--delta", type=float, help="privacy delta")
    add("--max_grad", type=float, help="gradient clip bound c (paper: 1e-5)")
    add("--d_step", type=int, help="discriminator steps per generator step")
    add("--g_step", type=int, help="student updates per generator step")
    add("--pretrain_teacher", type=int, help="discriminator steps in the first epoch")
    add("--z_dim", type=int, help="latent dimension")
    add("--learning_rate", type=float, help="Adam learning rate; also the voted step size")
    add("--beta1", type=float, help="Adam beta1")
    add("--orders", type=int, help="RDP orders 1.1, 2, ..., orders-1 (classic conversion)")
    add("--conversion", choices=[c.value for c in Conversion],
        help="how the ledger gives (eps, delta) for the budget and reports: classic "
             "(RDP, the authors'), dp_accounting (RDP, tighter) or pld (exact, tightest)")


def _add_dclens_flags(add: Callable[..., argparse.Action]) -> None:
    """dclens' own flags: seeds, execution, aggregations, sharding, checkpoints."""
    add("--seed", type=int, help="fix every random draw, DP noise included (runs with a "
        "fixed seed must not be published as private); default: OS entropy")
    add("--partition_seed", type=int, help="seed of the partition into teachers")
    add("--teacher_chunk", type=int, help="teachers processed together (memory bound)")
    add("--num_samples", type=int, help="synthetic samples written at the end")
    add("--generator_ema", type=float, metavar="DECAY",
        help="sample from an exponential moving average of the generator's weights with "
             "this decay (post-processing, no privacy cost; 0: off)")
    add("--class_guidance", type=float, metavar="LAMBDA",
        help="beyond the paper: each teacher's vote also descends LAMBDA times its own "
             "label cross-entropy (the same sensitivity; 0: off, the paper's)")
    add("--class_guidance_form", choices=["cross_entropy", "margin"],
        help="beyond the paper: the class term of --class_guidance: the teacher's label "
             "cross-entropy, or its margin (its logit for the label minus its mean over "
             "the labels) [default: cross_entropy]")
    add("--mismatch_negatives", type=int, metavar="M",
        help="beyond the paper: the last M slots of each teacher's fake batch hold its own "
             "records under a wrong label, scored as fake (matching-aware teachers; the "
             "same sensitivity; 0: off, the paper's)")
    add("--shared_teacher_init", action="store_const", const=True,
        help="beyond the paper: every teacher starts from the same initial weights "
             "instead of its own draw (data-independent; the same sensitivity) "
             "[default: off, the paper's]")
    add("--gf_dim", type=int, metavar="GF",
        help="beyond the paper for other values: the generator's filters (its first "
             "transposed convolution has 2 GF channels; the authors' model's gf_dim)")
    add("--gfc_dim", type=int, metavar="GFC",
        help="beyond the paper for other values: the generator's first dense layer's units "
             "(the authors' model's gfc_dim)")
    add("--generator_upsampling", choices=[u.value for u in cfg.GeneratorUpsampling],
        help=common_flags.GENERATOR_UPSAMPLING_HELP)
    add("--warm_start", metavar="RUN", help=common_flags.WARM_START_HELP)
    add("--df_dim", type=int, metavar="DF",
        help="beyond the paper for other values: the teachers' filters (their second "
             "convolution has DF + classes channels; the authors' model's df_dim; "
             "data-independent, the same sensitivity)")
    add("--dfc_dim", type=int, metavar="DFC",
        help="beyond the paper for other values: the teachers' dense layer's units (the "
             "authors' model's dfc_dim)")
    add("--query_batch", type=int, metavar="Q",
        help="beyond the paper: fake images voted on per round, the first Q of the B it "
             "renders (the teachers keep their batch; the ledger counts Q queries a round) "
             "[default: the batch, the paper's]")
    add("--max_records", type=int, help="train on the first N records only")
    add("--training_records", choices=[r.value for r in cfg.TrainingRecords],
        help=common_flags.TRAINING_RECORDS_HELP)
    add("--quiet", action="store_true", help="no progress bar")
    add("--restart", action="store_true", help="set the run in --checkpoint_dir aside "
        "(renamed to <dir>.old-<time>, never deleted) and start over; without it an "
        "existing run with the same settings is resumed")
    add("--deterministic", action="store_true", help="tf.config.experimental."
        "enable_op_determinism(): fail on any op without a deterministic kernel")
    add("--conv_path", choices=[p.value for p in cfg.ConvPath],
        help="how the teachers' steps run (speed only, same math): auto picks the fastest "
        "that works here: fused (one C++ op per chunk, built by make -C ops), else "
        "per_teacher (TF kernels); grouped needs oneDNN")
    add("--aggregation", choices=[a.value for a in cfg.Aggregation],
        help="how the teachers' gradients are aggregated (dclens/datalens/config.py Aggregation): the "
        "paper's topk_stochastic_sign, or a variant of its ablations: topk_sign, no_topk, "
        "no_threshold, no_threshold_sign, klevel (D2P-Fed), fetchsgd; each charges its own "
        "sensitivity")
    add("--sketch_accounting", choices=[a.value for a in cfg.SketchAccounting],
        help="FetchSGD's noise and charge: proven (noise on the count sketch, its computed "
        "sensitivity) or authors_unproven (the authors' 2 sqrt(k) after unsketching: NOT a "
        "guarantee; the outputs say so)")
    add("--save_raw_votes", action="store_true", help="with the updates, also write the "
        "raw noise-free vote sums: NOT private, the run directory is marked "
        "PRIVATE-raw-votes.txt (allowed in any run because you ask for it by name)")
    add("--klevel", type=int, help="quantisation levels of --aggregation klevel")
    add("--klevel_rotation", action="store_true", help="D2P-Fed with the paper's random "
        "rotation (commented out in the authors' code, so not in their numbers)")
    add("--fake_rendering", choices=[r.value for r in cfg.FakeRendering],
        help="the teachers' fake batches: class_grid renders each class once per step "
        "(K*B images); teacher_labels renders G(z, y_i) per teacher label sequence as the "
        "authors do (batch-norm statistics over B images)")
    add("--shards", type=int, help="split the teachers into this many contiguous shards, "
        "one Ray actor each (same results bit for bit; each actor reads the dataset from "
        "its own node's disk) [default: none: the teachers stay in this process]")
    add("--ray_address", help="with --shards: the Ray cluster to join (host:port or auto; "
        "start one with `ray start --head`) [default: a local Ray cluster]")
    add("--checkpoint_every", type=int, default=10, help="generator steps between "
        "checkpoints (one is also written at the end) [default: 10]")


def _choose_preset(args: argparse.Namespace) -> tuple[str, cfg.DataLensConfig]:
    name = args.preset or ("authors" if args.dataset else "demo")
    if name == "authors":
        d = AUTHORS_DEFAULTS
        base = cfg.DataLensConfig(
            train=cfg.TrainConfig(dataset=args.dataset or "fashion_mnist", num_teachers=1,
                                  batch_size=d["batch_size"], epochs=d["epoch"],
                                  d_step=d["d_step"], pretrain_teacher=d["pretrain_teacher"],
                                  g_step=d["g_step"], z_dim=d["z_dim"],
                                  learning_rate=d["learning_rate"], beta1=d["beta1"]),
            topagg=cfg.TopAggConfig(topk=d["topk"], sigma=d["sigma"], thresh=d["thresh"],
                                    max_grad=1e-5),
            budget=cfg.BudgetConfig(max_eps=d["max_eps"], delta=d["delta"]))
        return name, base
    return name, cfg.preset(name)


#: Flags whose value goes into one config field as given (an enum field takes the value's
#: member); ``aggregation`` is not among them (it interacts with the authors' booleans).
DIRECT_FLAGS = {flag: field for flag, field in FLAG_FIELDS.items() if flag != "aggregation"}
DIRECT_FLAGS.update({"data_dir": "train.data_dir", "seed": "train.seed",
                     "max_records": "train.max_records"})


def _direct_flags(args: argparse.Namespace, base: cfg.DataLensConfig) -> dict[str, dict]:
    """{section: {field: value}} of every :data:`DIRECT_FLAGS` flag given."""
    sections: dict[str, dict] = {"train": {}, "topagg": {}, "budget": {}}
    if args.dataset is not None:
        sections["train"]["dataset"] = args.dataset
    for flag, dotted in DIRECT_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        section, name = dotted.split(".")
        current = getattr(getattr(base, section), name)
        sections[section][name] = (type(current)(value) if isinstance(current, enum.Enum)
                                   else value)
    return sections


def _authors_flag_on(name: str, value: Any) -> bool:
    """The state an authors' boolean flag was given in: ``--X`` / ``--X=true`` or
    ``--noX`` / ``--X=false``."""
    if isinstance(value, bool):
        return value
    try:
        return _parse_bool(str(value))
    except argparse.ArgumentTypeError as error:
        raise CliError(f"--{name}: {error}") from None


def _names_an_aggregation(args: argparse.Namespace) -> bool:
    """Whether a flag their dispatch checks before --random_proj chose the aggregation."""
    return any(getattr(args, flag) for flag in ("signsgd", "signsgd_nothresh", "sketchsgd",
                                                "klevelsgd", "signsgd_dept"))


def resolve(args: argparse.Namespace) -> tuple[str, cfg.DataLensConfig, bool, str]:
    """Flags -> (preset name, config, train?, output dir).  Raises CliError/ConfigError."""
    for name, why in UNSUPPORTED_AUTHORS_FLAGS.items():
        value = getattr(args, f"unsupported_{name}")
        if value is None:
            continue
        if name in OFF_IS_DCLENS and not _authors_flag_on(name, value):
            if name != "random_proj" or _names_an_aggregation(args):
                continue
            raise CliError("--norandom_proj without --signsgd, --signsgd_nothresh, "
                           "--sketchsgd or --klevelsgd: the authors' code then runs "
                           "G-PATE's gradient voting on the pixels, which dclens does not "
                           "implement; add --signsgd (with --stochastic: the paper's TopAgg)")
        raise CliError(f"--{name}{'' if value is True else '=' + str(value).lower()} (a flag "
                       f"of the authors' main.py) is not implemented in dclens yet: {why}")
    if args.pretrain:
        raise CliError("--pretrain (load a pretrained generator) is not implemented; the "
                       "generator always starts from scratch (the authors' --nopretrain)")
    if args.dataset == "celebA":
        print("note: --dataset celebA is read as celebA-gender-train (CelebA-Gender, the "
              "training split), as in the authors' commands")
        args.dataset = "celebA-gender-train"
    preset_name, base = _choose_preset(args)
    sections = _direct_flags(args, base)
    train, topagg, budget = sections["train"], sections["topagg"], sections["budget"]
    if args.batch_teachers is not None or args.teachers_batch is not None:
        per_batch = args.batch_teachers if args.batch_teachers is not None else 1
        batches = args.teachers_batch if args.teachers_batch is not None else 1
        if per_batch < 1 or batches < 1:
            raise CliError(f"--batch_teachers and --teachers_batch must be >= 1, got "
                           f"{per_batch} and {batches}")
        train["num_teachers"] = per_batch * batches
    # The authors' aggregate_results dispatches on --signsgd before --signsgd_nothresh,
    # --sketchsgd and --klevelsgd, and without any of them runs G-PATE's gradient voting.
    authors_named = [flag for flag in ("signsgd_nothresh", "sketchsgd", "klevelsgd")
                     if getattr(args, flag)]
    if args.signsgd is False and not authors_named and args.signsgd_dept:
        raise CliError("--nosignsgd --signsgd_dept: the authors' code then runs the "
                       "thresholded top-k sign and spends the data-dependent bound, which "
                       "dclens never spends; drop --nosignsgd (--signsgd_dept then records "
                       "the bound beside the thresholded sign)")
    if args.signsgd is False and not authors_named:
        raise CliError("--nosignsgd without --signsgd_nothresh, --sketchsgd or --klevelsgd: "
                       "the authors' code then aggregates by G-PATE's gradient voting "
                       "(random projection, histogram votes per coordinate, thresholded "
                       "GNMax), which dclens does not implement; drop --nosignsgd for the "
                       "paper's top-k sign voting (--signsgd, with --stochastic for the "
                       "stochastic sign), or name one of those aggregations")
    if args.signsgd and authors_named:
        raise CliError(f"--signsgd and --{authors_named[0]} name different aggregations: the "
                       f"authors' code runs --signsgd's (the thresholded top-k sign) and "
                       f"ignores --{authors_named[0]}; give one")
    if args.stochastic is not None:
        topagg["method"] = (cfg.Aggregation.TOPK_STOCHASTIC_SIGN if args.stochastic
                            else cfg.Aggregation.TOPK_SIGN)
    elif (args.signsgd or args.signsgd_dept) and preset_name == "authors":
        # --signsgd (or their --signsgd_dept, the same thresholded sign) without
        # --stochastic: their default, the deterministic sign.
        topagg["method"] = cfg.Aggregation.TOPK_SIGN
    named = [flag for flag in ("aggregation", "signsgd_nothresh", "klevelsgd", "sketchsgd")
             if getattr(args, flag)]
    if len(named) > 1:
        raise CliError(f"--{' and --'.join(named)} name different aggregations; give one")
    if args.aggregation is not None:
        topagg["method"] = cfg.Aggregation(args.aggregation)
    elif args.signsgd_nothresh:
        # The sign follows --stochastic; not given, the preset's (the authors' default is
        # the deterministic sign: their signsgd_aggregate_no_thresh(stochastic=False)).
        deterministic = (args.stochastic is False
                         or (args.stochastic is None and preset_name == "authors"))
        topagg["method"] = (cfg.Aggregation.NO_THRESHOLD_SIGN if deterministic
                            else cfg.Aggregation.NO_THRESHOLD)
    elif args.klevelsgd:
        topagg["method"] = cfg.Aggregation.KLEVEL
    elif args.sketchsgd:
        topagg["method"] = cfg.Aggregation.FETCHSGD
    if args.klevel_rotation:
        topagg["klevel_rotation"] = True
    if args.save_raw_votes:
        train["save_votes"] = cfg.SaveVotes.RAW_SUMS
    elif args.save_vote:
        train["save_votes"] = cfg.SaveVotes.UPDATES
    if args.max_grad is not None and args.max_grad <= 0:
        raise CliError(f"--max_grad must be > 0 (the paper uses 1e-5), got {args.max_grad!r}")
    config = base.replace(train=train, topagg=topagg, budget=budget)
    do_train = args.train if args.train is not None else preset_name == "demo"
    output_dir = args.checkpoint_dir or ("runs/demo" if preset_name == "demo" else "checkpoint")
    return preset_name, config, do_train, output_dir


def main(argv: list[str] | None = None, *, fault_hook=None) -> int:
    """Runs the command line; ``fault_hook`` is for fault-injection tests (see dclens.datalens.run)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        preset_name, config, do_train, output_dir = resolve(args)
    except (CliError, cfg.ConfigError) as error:
        parser.error(str(error))
    if args.checkpoint_every < 1:
        parser.error(f"--checkpoint_every must be >= 1, got {args.checkpoint_every}")
    if args.ray_address is not None and args.shards is None:
        parser.error(f"--ray_address {args.ray_address} needs --shards N (the teachers are "
                     "split over N Ray actors)")
    tf_env.import_tensorflow_quietly()

    try:
        if args.deterministic:
            import tensorflow as tf

            tf.config.experimental.enable_op_determinism()
        if do_train:
            print(f"dclens: training with preset {preset_name!r} (flags override it); "
                  f"the resolved config goes to {os.path.join(output_dir, 'config.json')}")
            with graceful_stop.GracefulStop("main.py") as stop:
                run.train_run(config, output_dir, progress=not args.quiet,
                              restart=args.restart, checkpoint_every=args.checkpoint_every,
                              fault_hook=fault_hook, shards=args.shards,
                              ray_address=args.ray_address, should_stop=stop)
        else:
            print(f"dclens: no --train: sampling the trained generator in {output_dir}")
            # The settings the command names must be the run's (the samples' labels and
            # shapes come from the saved config).
            expect = {name: _field(config, name)
                      for flag, name in (("dataset", "train.dataset"), ("z_dim", "train.z_dim"))
                      if getattr(args, flag) is not None}
            outputs.sample_run(output_dir, num_samples=args.num_samples, seed=args.seed,
                           expect=expect)
    except (data.DataError, run.RunDirError, JournalError, CheckpointError, BankSpaceError,
            ShardError, ValueError) as error:
        print(f"main.py: error: {error}", file=sys.stderr)
        return 2
    except run.TrainingDiverged as error:
        print(f"main.py: training diverged: {error}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return interrupted.report("main.py", output_dir, argv)
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()     # before TensorFlow is imported; see dclens/common/tf_env.py
    sys.exit(main())
