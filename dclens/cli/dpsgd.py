"""Trains a classifier privately on the real data: DP-SGD, TopAgg for DP-SGD, or GEP.

  python scripts/dpsgd.py --method gm --target_eps 1 --run_dir runs/dpsgd/gm-eps1
  python scripts/dpsgd.py --method topagg --topk 0.8 --target_eps 1 --run_dir runs/dpsgd/t1
  python scripts/dpsgd.py --method gep --target_eps 2 --momentum 0.9 --run_dir runs/dpsgd/g2
  python scripts/dpsgd.py --method gm --sigma 1.1 --epochs 5 --run_dir runs/dpsgd/s

Methods: gm (DP-SGD, the Gaussian mechanism on the clipped sum), topagg (DataLens App. A
Alg. 4: NormTopK of each clipped gradient, sensitivity sqrt(k) C), topagg_dimension
(Table 9: keep a fraction k of the coordinates; sensitivity C), gep / bgep (Gradient
Embedding Perturbation; anchors are held-out training images with random labels).

Privacy: Poisson sampling at q = batch_size / n, epsilon for adding or removing one of
the n private examples at --delta (dp_accounting RDP). --target_eps calibrates sigma so
that all steps fit; --sigma takes it as given. The --validation (and GEP --anchors)
images are held out of the private set and used without privacy, which every output
says. A run directory is resumed when the command is repeated (--restart starts over).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from dclens.cli import common_flags, interrupted
from dclens.common import tf_env
from dclens.cli.dpsgd_flags import add_config_arguments
from dclens import data
from dclens.runs import rundir
from dclens.runs.checkpoint import CheckpointError
from dclens.dpsgd import train
from dclens.cli.dpsgd_flags import config_from_args
from dclens.dpsgd.config import DpsgdConfigError
from dclens.runs.journal import JournalError


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(
        prog="dpsgd.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    common_flags.add_run_dir(parser)
    add_config_arguments(parser)
    common_flags.add_quiet(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    try:
        config = config_from_args(args)
    except DpsgdConfigError as error:
        parser.error(str(error))
    log = (lambda _: None) if args.quiet else (lambda line: print(line, flush=True))
    try:
        report = train.train_private_classifier(config, args.run_dir, restart=args.restart,
                                                progress=not args.quiet, log=log)
    except (DpsgdConfigError, data.DataError, rundir.RunDirError, JournalError,
            CheckpointError) as error:
        print(f"dpsgd.py: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted.report("dpsgd.py", args.run_dir, argv)
    accuracy, privacy = report["accuracy"], report["privacy"]
    print(f"{report['method']}: test {accuracy['test_at_chosen']:.4f} (epoch "
          f"{accuracy['chosen_epoch']:.1f}, chosen on validation) | epsilon "
          f"{privacy['epsilon']['epsilon']:.4f} at delta {privacy['delta']:g} | report "
          f"{pathlib.Path(args.run_dir) / 'report.json'}")
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
