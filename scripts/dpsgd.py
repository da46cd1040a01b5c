#!/usr/bin/env python
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from dclens import tf_env  # noqa: E402  (after the sys.path insertion above)


def build_parser() -> argparse.ArgumentParser:
    from dclens.dpsgd.config import DpsgdConfig
    from dclens.dpsgd.mechanisms import Method

    defaults = DpsgdConfig()
    parser = argparse.ArgumentParser(
        prog="dpsgd.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    add = parser.add_argument
    add("--method", choices=[m.value for m in Method], default=defaults.method.value)
    add("--run_dir", required=True, help="run directory (resumed if it holds this run)")
    add("--dataset", choices=("fashion_mnist", "mnist"), default=defaults.dataset)
    add("--data_dir", help="data root (default: the dataset's default location)")
    add("--max_records", type=int, help="use the first N training records only")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--target_eps", type=float, help=f"epsilon to calibrate sigma to "
                        f"[default: {defaults.target_eps}]")
    budget.add_argument("--sigma", type=float, help="the noise multiplier, as given")
    add("--delta", type=float, default=defaults.delta)
    add("--conversion", choices=("dp_accounting", "classic"), default=defaults.conversion.value)
    add("--batch_size", type=int, default=defaults.batch_size,
        help="expected Poisson batch size B (q = B / n)")
    add("--epochs", type=float, default=defaults.epochs)
    add("--learning_rate", type=float, default=defaults.learning_rate)
    add("--momentum", type=float, default=defaults.momentum)
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
    add("--seed", type=int, help="fix every draw, DP noise included (NOT for publication)")
    add("--checkpoint_every", type=int, default=defaults.checkpoint_every)
    add("--eval_every", type=int, default=defaults.eval_every,
        help="steps between evaluations (0: once per epoch)")
    add("--restart", action="store_true", help="set an existing run aside and start over")
    add("--quiet", action="store_true", help="no progress bar or log lines")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from dclens import data, rundir
    from dclens.checkpoint import CheckpointError
    from dclens.dpsgd import train
    from dclens.dpsgd.config import DpsgdConfig, DpsgdConfigError
    from dclens.journal import JournalError

    target = args.target_eps if args.sigma is not None or args.target_eps is not None else 1.0
    if args.sigma is not None:
        target = None
    try:
        config = DpsgdConfig(
            method=args.method, dataset=args.dataset, data_dir=args.data_dir,
            max_records=args.max_records, target_eps=target, sigma=args.sigma,
            delta=args.delta, conversion=args.conversion, batch_size=args.batch_size,
            epochs=args.epochs, learning_rate=args.learning_rate, momentum=args.momentum,
            clip=args.clip, topk=args.topk, clip_embedding=args.clip_embedding,
            clip_residual=args.clip_residual, num_bases=args.num_bases,
            num_groups=args.num_groups, anchors=args.anchors,
            anchor_source=args.anchor_source, validation=args.validation,
            activation=args.activation, seed=args.seed,
            checkpoint_every=args.checkpoint_every, eval_every=args.eval_every)
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
