"""DP-MERF: one private release of the class-conditional mean embedding, a generator fitted to it.

  python scripts/merf.py --target_eps 1 --run_dir runs/merf/eps1
  python scripts/merf.py --sigma 8.34 --training_records private --run_dir runs/merf/warm
  python scripts/merf.py --sigma 8.34 --noise_scale 0.05 --training_records tuning \
      --max_records 3000 --num_samples 20000 --run_dir runs/merf/screen

Privacy: the release is one Gaussian mechanism on the sum over records of
phi(x) e_y^T (random Fourier features of unit norm times the one-hot label), L2
sensitivity 2 for replacing one record; --target_eps calibrates its noise multiplier
(--sigma takes it as given). Fitting and sampling the generator read only the release.
--noise_scale < 1 is a screening run's noise-matched scale (its epsilon is larger; it says
so). A DataLens run can start from the fitted generator and count this release in its own
ledger: scripts/main.py --warm_start RUN_DIR. Repeating the command resumes the run.
"""

from __future__ import annotations

import argparse
import sys

from dclens import data
from dclens.cli import common_flags, interrupted
from dclens.common import tf_env
from dclens.datalens.merf import train
from dclens.datalens.merf.config import MerfConfig, MerfConfigError
from dclens.runs import rundir
from dclens.runs.journal import JournalError

_DEFAULTS = MerfConfig()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="merf.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    common_flags.add_run_dir(parser)
    parser.add_argument("--dataset", default=_DEFAULTS.dataset,
                        choices=["fashion_mnist", "mnist"])
    common_flags.add_data(parser)
    common_flags.add_training_records(parser, default=_DEFAULTS.training_records.value)
    common_flags.add_budget(parser, default_eps=_DEFAULTS.target_eps)
    parser.add_argument("--noise_scale", type=float, default=_DEFAULTS.noise_scale,
                        help="the noise multiplier times this factor in (0, 1]: a "
                             "screening run's noise-matched scale (NOT the budget's epsilon)")
    parser.add_argument("--delta", type=float, default=_DEFAULTS.delta)
    parser.add_argument("--conversion", default=_DEFAULTS.conversion.value,
                        choices=["classic", "dp_accounting", "pld"],
                        help="how the release's epsilon is computed (pld: exact for one "
                             "Gaussian mechanism)")
    parser.add_argument("--num_features", type=int, default=_DEFAULTS.num_features,
                        help="random Fourier features D (even)")
    parser.add_argument("--lengthscale", type=float, default=_DEFAULTS.lengthscale,
                        help="the Gaussian kernel's length scale (images in [0, 1])")
    parser.add_argument("--fit_steps", type=int, default=_DEFAULTS.fit_steps)
    parser.add_argument("--fit_batch", type=int, default=_DEFAULTS.fit_batch,
                        help="generated images per fit step (a multiple of the classes)")
    parser.add_argument("--learning_rate", type=float, default=_DEFAULTS.learning_rate)
    parser.add_argument("--z_dim", type=int, default=_DEFAULTS.z_dim)
    parser.add_argument("--gf_dim", type=int, default=_DEFAULTS.generator_filters,
                        help="the generator's filters (the authors' flag name; "
                             "scripts/reproduce.py --generator_width W is --gf_dim 64W "
                             "--gfc_dim 1024W): a DataLens warm start needs the same")
    parser.add_argument("--gfc_dim", type=int, default=_DEFAULTS.generator_dense,
                        help="the generator's dense units (the authors' flag name)")
    parser.add_argument("--generator_upsampling", default=_DEFAULTS.generator_upsampling.value,
                        choices=["transpose", "resize", "transpose4"],
                        help=common_flags.GENERATOR_UPSAMPLING_HELP)
    parser.add_argument("--num_samples", type=int, default=_DEFAULTS.num_samples,
                        help="samples written to samples.npz; a finished run given another "
                        "number draws them from its saved generator (no new spend)")
    parser.add_argument("--log_every", type=int, default=_DEFAULTS.log_every,
                        help="fit steps between progress lines")
    common_flags.add_seed(parser)
    common_flags.add_quiet(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> MerfConfig:
    target_eps, sigma = common_flags.budget_from_args(args, default_eps=_DEFAULTS.target_eps)
    return MerfConfig(
        dataset=args.dataset, data_dir=args.data_dir, max_records=args.max_records,
        training_records=args.training_records, target_eps=target_eps, sigma=sigma,
        noise_scale=args.noise_scale, delta=args.delta, conversion=args.conversion,
        num_features=args.num_features, lengthscale=args.lengthscale,
        fit_steps=args.fit_steps, fit_batch=args.fit_batch,
        learning_rate=args.learning_rate, z_dim=args.z_dim,
        generator_filters=args.gf_dim, generator_dense=args.gfc_dim,
        generator_upsampling=args.generator_upsampling, num_samples=args.num_samples,
        seed=args.seed, log_every=args.log_every)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except MerfConfigError as error:
        parser.error(str(error))
    log = (lambda _: None) if args.quiet else (lambda line: print(line, flush=True))
    try:
        report = train.train_merf(config, args.run_dir, restart=args.restart, log=log)
    except (MerfConfigError, data.DataError, rundir.RunDirError, JournalError) as error:
        print(f"merf.py: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return interrupted.report("merf.py", args.run_dir, argv)
    print(f"DP-MERF: epsilon {report['epsilon']['epsilon']:.4f} | samples "
          f"{args.run_dir}/samples.npz | evaluate: python scripts/evaluate.py {args.run_dir}")
    return 0


if __name__ == "__main__":
    tf_env.prepare_cli_environment()
    tf_env.import_tensorflow_quietly()
    sys.exit(main())
