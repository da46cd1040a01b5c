"""Trains GS-WGAN (Chen et al., NeurIPS 2020) on dclens' data, ledger and journal.

  python scripts/gswgan.py --run_dir runs/gswgan/eps10                  # paper config, eps 10
  python scripts/gswgan.py --run_dir runs/gswgan/eps1 --target_eps 1
  python scripts/gswgan.py --run_dir runs/gswgan/paper --sigma 1.07 \\
      --accounting per_sample_paper --critic_updates keep       # the released code, NOT proven
  python scripts/gswgan.py --run_dir runs/gswgan/small --num_discriminators 100 \\
      --model_dim 16 --warm_iterations 20 --iterations 2000 --target_eps 10

Then evaluate the released samples like any other synthetic data:
  python scripts/evaluate.py runs/gswgan/eps10/samples.npz
  python scripts/evaluate.py runs/gswgan/eps10/samples.npz --protocol authors --range 1

Privacy: one of --num_discriminators disjoint shards is sampled per DP iteration and B
sanitized image gradients are released (clip C, noise 2 C sigma each); epsilon is for
replacing one training example, at --delta.  --accounting iteration (default) is the
provable one (the B releases share the sampled discriminator); per_sample_paper is the
released code's composition, NOT proven, for comparison with the paper only -- every
output names which produced its epsilon.  The proof also needs --critic_updates discard
(default): a discriminator's DP-phase critic steps are dropped after its iteration; keep
(the released code's) makes every epsilon of the run NOT proven.  --target_eps calibrates sigma to the budget
over --iterations; --sigma takes it as given.  The warm-start (--warm_iterations per
discriminator, the paper's 2000) is non-private by design: each discriminator sees only
its own shard.  A run directory is resumed when the command is repeated.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from dclens.cli import common_flags, interrupted
from dclens.common import tf_env
from dclens.privacy.accounting import Conversion
from dclens.gswgan.accounting import Accounting, CriticUpdates
from dclens import data
from dclens.data.splits import TrainingRecords
from dclens.runs import rundir
from dclens.runs.checkpoint import CheckpointError
from dclens.gswgan import train
from dclens.gswgan.config import GswganConfig, GswganConfigError
from dclens.runs.journal import JournalError

_HELP = {
    "num_discriminators": "N_D, disjoint shards (paper 1000; sampling rate 1/N_D)",
    "clip": "C, the per-image clip of the sanitizer",
    "batch_size": "B, images per generator step (and per critic batch)",
    "critic_iters": "critic steps per iteration",
    "model_dim": "network width m (paper 64)",
    "warm_iterations": "non-private warm-start iterations per discriminator (paper 2000)",
    "iterations": "DP iterations (paper 20000)",
    "warm_chunk": "discriminators warm-started together in one graph (speed / memory)",
    "num_samples": "images released at the end (paper 60000)",
    "seed": "fix every draw, DP noise included (NOT for publication)",
    "max_records": "use the first N training records only",
    "training_records": common_flags.TRAINING_RECORDS_HELP,
    "critic_updates": "discard: each DP iteration trains a copy of the drawn discriminator "
                      "and drops it (provable); keep: the released code's, D keeps its "
                      "updates (NOT proven under any accounting)",
}


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(
        prog="gswgan.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    common_flags.add_run_dir(parser)
    common_flags.add_quiet(parser)
    defaults = GswganConfig()
    common_flags.add_budget(parser, default_eps=defaults.target_eps)
    choices = {"accounting": [a.value for a in Accounting],
               "critic_updates": [c.value for c in CriticUpdates],
               "conversion": [c.value for c in Conversion],
               "training_records": [r.value for r in TrainingRecords],
               "dataset": ["fashion_mnist", "mnist"]}
    for field in dataclasses.fields(GswganConfig):
        if field.name in ("target_eps", "sigma"):
            continue
        default = getattr(defaults, field.name)
        shown = default.value if hasattr(default, "value") else default
        kind = type(shown) if shown is not None else (str if field.name == "data_dir" else int)
        parser.add_argument(f"--{field.name}", type=kind, default=shown,
                            choices=choices.get(field.name),
                            help=f"{_HELP.get(field.name, '')} [default: {shown}]".strip())
    return parser


def main(argv: list[str] | None = None, *, fault_hook=None) -> int:
    """Runs the command line; ``fault_hook`` is for fault-injection tests (scripts/faults.py)."""
    parser = build_parser()
    args = parser.parse_args(argv)

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(GswganConfig)}
    values["target_eps"], values["sigma"] = common_flags.budget_from_args(
        args, default_eps=GswganConfig().target_eps)
    try:
        config = GswganConfig(**values)
    except GswganConfigError as error:
        parser.error(str(error))
    log = (lambda _: None) if args.quiet else (lambda line: print(line, flush=True))
    try:
        report = train.train_gswgan(config, args.run_dir, restart=args.restart,
                                    progress=not args.quiet, log=log,
                                    **({"hook": fault_hook} if fault_hook else {}))
    except (GswganConfigError, data.DataError, rundir.RunDirError, JournalError,
            CheckpointError, OSError) as error:
        print(f"gswgan.py: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted.report("gswgan.py", args.run_dir, argv)
    privacy = report["privacy"]
    proven = "" if privacy["accounting_proven"] else " (NOT proven)"
    print(f"gswgan: epsilon {privacy['epsilon']['epsilon']:.4f} at delta {privacy['delta']:g}, "
          f"{privacy['accounting']} accounting, critic updates "
          f"{privacy['critic_updates']}{proven} | samples {report['samples']} | "
          f"evaluate: python scripts/evaluate.py {report['samples']}")
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
