"""The command-line settings of a private classifier run, shared by ``scripts/dpsgd.py``
and ``scripts/dpsgd_sweep.py`` (one definition of every flag and its default)."""

from __future__ import annotations

import argparse

from dclens.cli import common_flags
from dclens.dpsgd.config import DEFAULT_LEARNING_RATES, DpsgdConfig
from dclens.dpsgd.mechanisms import Method
from dclens.privacy.accounting import Conversion


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per :class:`DpsgdConfig` setting, with the config's defaults."""
    defaults = DpsgdConfig()
    add = parser.add_argument
    add("--method", choices=[m.value for m in Method], default=defaults.method.value)
    add("--dataset", choices=("fashion_mnist", "mnist"), default=defaults.dataset)
    common_flags.add_data(parser)
    common_flags.add_training_records(parser, default=defaults.training_records.value)
    common_flags.add_budget(parser, default_eps=defaults.target_eps)
    add("--delta", type=float, default=defaults.delta)
    add("--conversion", choices=[c.value for c in Conversion],
        default=defaults.conversion.value,
        help="(eps, delta) from the ledger: RDP with dp_accounting's or the classic "
             "conversion, or pld (dp_accounting's PLD accountant, tighter; Poisson "
             "sampling)")
    add("--batch_size", type=int, default=defaults.batch_size,
        help="expected Poisson batch size B (q = B / n)")
    add("--epochs", type=float, default=defaults.epochs)
    add("--learning_rate", type=float, help="plain SGD step (with --momentum) [default: "
        + ", ".join(f"{m.value} {lr:g}" for m, lr in DEFAULT_LEARNING_RATES.items()) + "]")
    add("--momentum", type=float, default=defaults.momentum)
    add("--lr_milestones", type=float, nargs="*", default=list(defaults.lr_milestones),
        metavar="FRACTION", help="multiply the learning rate by --lr_decay at each of these "
        "fractions of the planned steps (GEP's code: 0.5 0.75) [default: none]")
    add("--lr_decay", type=float, default=defaults.lr_decay,
        help="the factor applied at each --lr_milestones fraction")
    add("--clip", type=float, default=defaults.clip, help="C, the per-example L2 clip")
    add("--topk", type=float, default=defaults.topk, help="NormTopK fraction k in (0, 1]")
    add("--clip_embedding", type=float, default=defaults.clip_embedding, help="GEP S1")
    add("--clip_residual", type=float, default=defaults.clip_residual, help="GEP S2")
    add("--num_bases", type=int, default=defaults.num_bases, help="GEP: anchor bases k")
    add("--num_groups", type=int, default=defaults.num_groups, help="GEP: parameter groups")
    add("--anchors", type=int, default=defaults.anchors,
        help="GEP: anchor images (random labels)")
    add("--anchor_source", choices=("held_out", "noise"), default=defaults.anchor_source,
        help="GEP: anchors are held-out training images (removed from the private set) "
             "or uniform-noise images that touch no record")
    add("--validation", type=int, default=defaults.validation,
        help="held-out training images the evaluation epoch is chosen on")
    add("--activation", choices=("relu", "tanh"), default=defaults.activation)
    common_flags.add_seed(parser)
    add("--checkpoint_every", type=int, default=defaults.checkpoint_every)
    add("--eval_every", type=int, default=defaults.eval_every,
        help="steps between evaluations (0: once per epoch)")


def config_from_args(args: argparse.Namespace) -> DpsgdConfig:
    """The run's settings from parsed flags (raises ``DpsgdConfigError`` naming a bad one).

    With neither ``--target_eps`` nor ``--sigma`` the budget is the config's default
    epsilon; ``--sigma`` alone means no budget to calibrate to.
    """
    target, sigma = common_flags.budget_from_args(args, default_eps=DpsgdConfig().target_eps)
    return DpsgdConfig(
        method=args.method, dataset=args.dataset, data_dir=args.data_dir,
        max_records=args.max_records, training_records=args.training_records,
        target_eps=target, sigma=sigma,
        delta=args.delta, conversion=args.conversion, batch_size=args.batch_size,
        epochs=args.epochs, learning_rate=args.learning_rate, momentum=args.momentum,
        lr_milestones=tuple(args.lr_milestones), lr_decay=args.lr_decay,
        clip=args.clip, topk=args.topk, clip_embedding=args.clip_embedding,
        clip_residual=args.clip_residual, num_bases=args.num_bases,
        num_groups=args.num_groups, anchors=args.anchors,
        anchor_source=args.anchor_source, validation=args.validation,
        activation=args.activation, seed=args.seed,
        checkpoint_every=args.checkpoint_every, eval_every=args.eval_every)
