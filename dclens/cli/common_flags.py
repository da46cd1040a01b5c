"""Flags every dclens tool spells the same way, defined once.

* the run directory: ``--run_dir`` (``main.py`` also takes the authors' ``--checkpoint_dir``)
  and ``--restart``, which sets an existing run aside (renamed, never deleted);
* ``--quiet``: no progress bars or log lines;
* the data: ``--data_dir``, ``--max_records``;
* ``--seed``: fixes every draw, DP noise included, so a seeded run is not for publication;
* a private trainer's budget: ``--target_eps`` (sigma calibrated to it) or ``--sigma``
  (taken as given), never both.

Booleans are ``store_true`` switches (``--quiet``, ``--restart``); ``main.py`` keeps the
authors' ``--flag`` / ``--noflag`` style for their flags, which is its contract.
"""

from __future__ import annotations

import argparse

from dclens.data.splits import TrainingRecords

SEED_HELP = "fix every random draw, DP noise included (NOT for publication)"


def add_run_dir(parser: argparse.ArgumentParser, *, required: bool = True,
                help_text: str = "run directory (resumed if it holds this run)",
                restart: bool = True) -> None:
    """``--run_dir`` and, for tools that resume, ``--restart``."""
    parser.add_argument("--run_dir", required=required, help=help_text)
    if restart:
        parser.add_argument("--restart", action="store_true",
                            help="set an existing run aside (renamed, never deleted) and "
                                 "start over")


def add_quiet(parser: argparse.ArgumentParser,
              help_text: str = "no progress bars or log lines") -> None:
    parser.add_argument("--quiet", action="store_true", help=help_text)


def add_data(parser: argparse.ArgumentParser, *, what: str = "") -> None:
    """``--data_dir`` and ``--max_records`` (``what``: whose records, for the help)."""
    parser.add_argument("--data_dir", help="data root (default: the dataset's default "
                                           "location)")
    parser.add_argument("--max_records", type=int,
                        help=f"use the first N training records{what} only")


#: --generator_upsampling's help, shared by scripts/main.py and scripts/reproduce.py.
GENERATOR_UPSAMPLING_HELP = (
    "beyond the paper for other values: how the generator doubles its feature maps: the "
    "authors' stride-2 5x5 transposed convolutions, a nearest-neighbour resize then a "
    "convolution (resize: no checkerboard), or 4x4 transposed convolutions (transpose4: an "
    "even overlap); data-independent, the same sensitivity")
#: --warm_start's help, shared by scripts/main.py and scripts/reproduce.py.
WARM_START_HELP = (
    "beyond the paper: start the generator from a finished DP-MERF run on the same records "
    "(scripts/merf.py --run_dir RUN); its release is counted in this run's ledger, so the "
    "budget covers both [default: the paper's random initialisation]")
TRAINING_RECORDS_HELP = (
    "which training records: all (the paper's); private (all but the last 10,000, the "
    "tuning split, which this run never reads: for a configuration tuned on that split); "
    "tuning (the tuning split's first 8,000: a screening run, not a private release of "
    "the private records)")


def add_training_records(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """``--training_records`` (:mod:`dclens.data.splits`)."""
    parser.add_argument("--training_records", choices=[r.value for r in TrainingRecords],
                        default=default, help=TRAINING_RECORDS_HELP)


def add_seed(parser: argparse.ArgumentParser, help_text: str = SEED_HELP) -> None:
    parser.add_argument("--seed", type=int, help=help_text)


def add_budget(parser: argparse.ArgumentParser, *, default_eps: float) -> None:
    """``--target_eps`` or ``--sigma``, mutually exclusive; neither: ``default_eps``
    (:func:`budget_from_args`)."""
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--target_eps", type=float,
                        help=f"epsilon to calibrate sigma to [default: {default_eps}]")
    budget.add_argument("--sigma", type=float, help="the noise multiplier, as given")


def budget_from_args(args: argparse.Namespace, *,
                     default_eps: float) -> tuple[float | None, float | None]:
    """(target_eps, sigma): ``--sigma`` alone means no budget to calibrate to; neither
    flag means ``default_eps``."""
    if args.sigma is not None:
        return None, args.sigma
    return (default_eps if args.target_eps is None else args.target_eps), None
