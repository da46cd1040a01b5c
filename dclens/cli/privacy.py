"""Privacy calculator for DataLens' TopAgg: epsilon, step budget or calibrated sigma.

Each generator step makes ``--queries_per_step`` TopAgg calls (one per fake image), each
a Gaussian mechanism with noise multiplier sigma / (2 sqrt(topk)). Three modes:

  epsilon after --steps steps (needs --sigma and --steps):
    python scripts/privacy.py --sigma 5000 --topk 200 --queries_per_step 30 \\
        --steps 43 --delta 1e-5
  steps that fit within a budget (needs --sigma, --max_eps):
    python scripts/privacy.py --sigma 5000 --topk 200 --queries_per_step 30 \\
        --max_eps 1 --delta 1e-5
  smallest sigma meeting a budget (needs --steps, --target_eps):
    python scripts/privacy.py --topk 200 --queries_per_step 30 --steps 43 \\
        --target_eps 1 --delta 1e-5

Every result names how it turned the composition into (epsilon, delta) ("classic": RDP with
the DataLens authors' conversion; "dp_accounting": RDP with a tighter one; "pld": no RDP,
the exact epsilon of the composed Gaussian mechanism, the tightest). ``--json`` prints one
JSON object instead.

GS-WGAN (``gswgan`` first): sigma for a budget, or epsilon for a sigma, under both of its
accountings ("iteration", provable; "per_sample_paper", the released code's, NOT proven):
    python scripts/privacy.py gswgan --target_eps 10 --iterations 20000 \
        --num_discriminators 1000 --batch_size 32
    python scripts/privacy.py gswgan --sigma 1.07 --iterations 20000
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from dclens.privacy import accounting
from dclens.gswgan import accounting as gs_accounting
from dclens.gswgan.config import GswganConfig, GswganConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False,
        prog="privacy.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sigma", type=float,
                        help="noise std per vote coordinate (not with --target_eps)")
    parser.add_argument("--topk", type=int, required=True,
                        help="coordinates each teacher votes on (sensitivity 2*sqrt(topk))")
    parser.add_argument("--queries_per_step", type=int, required=True,
                        help="TopAgg calls per generator step (the fake batch size)")
    parser.add_argument("--steps", type=int,
                        help="generator steps taken (not with --max_eps)")
    parser.add_argument("--delta", type=float, default=1e-5,
                        help="delta of the (epsilon, delta) guarantee (default 1e-5, the authors')")
    parser.add_argument("--conversion", default="all",
                        choices=[c.value for c in accounting.Conversion] + ["all", "both"],
                        help="(epsilon, delta) conversion: classic, dp_accounting, pld, or "
                             "all of them (default; 'both' is its older name)")
    parser.add_argument("--orders", type=int, default=None,
                        help="use the authors' orders 1.1, 2, ..., ORDERS-1 for every "
                             "conversion (default: classic uses 1.1, 2..199, "
                             "dp_accounting its own default orders)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--max_eps", type=float,
                      help="print the largest number of steps with epsilon <= MAX_EPS")
    mode.add_argument("--target_eps", type=float,
                      help="print the smallest sigma with epsilon <= TARGET_EPS after "
                           "--steps steps")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _orders_label(conversion: accounting.Conversion, max_order: int | None) -> str:
    if not conversion.uses_rdp:
        return "exact, no RDP orders"
    if max_order is not None:
        return f"classic_orders({max_order}): 1.1, 2..{max_order - 1}"
    if conversion is accounting.Conversion.CLASSIC:
        return "classic_orders(200): 1.1, 2..199"
    return "dp_accounting default orders"


def _compute(args: argparse.Namespace, conversion: accounting.Conversion,
             orders: Sequence[float] | None) -> dict[str, Any]:
    common = dict(topk=args.topk, queries_per_step=args.queries_per_step,
                  delta=args.delta, conversion=conversion, orders=orders)
    if args.target_eps is not None:
        sigma = accounting.calibrate_sigma(target_epsilon=args.target_eps,
                                           steps=args.steps, **common)
        report = accounting.epsilon_for(sigma=sigma, steps=args.steps, **common)
        return {"sigma": sigma,
                "noise_multiplier": accounting.topagg_noise_multiplier(
                    sigma=sigma, topk=args.topk),
                **report.to_dict()}
    if args.max_eps is not None:
        steps = accounting.max_steps_within(sigma=args.sigma, max_eps=args.max_eps,
                                            **common)
        report = accounting.epsilon_for(sigma=args.sigma, steps=steps, **common)
        following = accounting.epsilon_for(sigma=args.sigma, steps=steps + 1, **common)
        return {"max_steps": steps, "queries": steps * args.queries_per_step,
                **report.to_dict(), "epsilon_next_step": following.epsilon}
    report = accounting.epsilon_for(sigma=args.sigma, steps=args.steps, **common)
    return {"steps": args.steps, "queries": args.steps * args.queries_per_step,
            **report.to_dict()}


def _where(result: dict[str, Any]) -> str:
    """"order 7; classic_orders(200): ..." or, without RDP, what was used instead."""
    if result["order"] is None:
        return result["orders"]
    return f"order {result['order']:g}; {result['orders']}"


def _describe(mode: str, result: dict[str, Any], args: argparse.Namespace) -> str:
    name = f"{result['conversion']:<13}"
    if mode == "calibrate_sigma":
        return (f"{name}  sigma = {result['sigma']:.6g} "
                f"(noise multiplier {result['noise_multiplier']:.6g}) gives epsilon = "
                f"{result['epsilon']:.8f} <= {args.target_eps:g} after {args.steps} steps "
                f"({_where(result)})")
    if mode == "max_steps":
        return (f"{name}  {result['max_steps']} steps "
                f"({result['queries']} queries) fit within max_eps = {args.max_eps:g}: "
                f"epsilon = {result['epsilon']:.8f}; one more step would give "
                f"{result['epsilon_next_step']:.8f}  ({_where(result)})")
    return f"{name}  epsilon = {result['epsilon']:.8f}  ({_where(result)})"


def gswgan_main(argv: Sequence[str]) -> int:
    """``privacy.py gswgan ...``: GS-WGAN's sigma or epsilon under each accounting."""

    parser = argparse.ArgumentParser(allow_abbrev=False, prog="privacy.py gswgan",
                                     description="GS-WGAN: sigma for a budget, or epsilon "
                                                 "for a sigma, under each accounting")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--target_eps", type=float, help="print the smallest sigma within it")
    mode.add_argument("--sigma", type=float, help="print epsilon after --iterations")
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--num_discriminators", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--conversion", default="dp_accounting",
                        choices=[c.value for c in accounting.Conversion])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:        # the settings' own checks, as scripts/gswgan.py applies them
        GswganConfig(target_eps=args.target_eps, sigma=args.sigma,
                     iterations=args.iterations, num_discriminators=args.num_discriminators,
                     batch_size=args.batch_size, delta=args.delta, conversion=args.conversion)
    except GswganConfigError as error:
        parser.error(str(error))
    common = dict(num_discriminators=args.num_discriminators, batch_size=args.batch_size,
                  iterations=args.iterations, delta=args.delta, conversion=args.conversion)
    results = {}
    try:
        for method in gs_accounting.Accounting:
            sigma = (args.sigma if args.sigma is not None else gs_accounting.calibrate_sigma(
                accounting=method, target_epsilon=args.target_eps, **common))
            results[method.value] = {
                "sigma": sigma, "proven": method.proven,
                "epsilon": gs_accounting.epsilon(accounting=method, sigma=sigma, **common),
                "description": method.description}
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    if args.json:
        print(json.dumps({"method": "gswgan", "inputs": vars(args), "results": results}))
        return 0
    print(f"GS-WGAN: {args.iterations} iterations, N_D = {args.num_discriminators}, "
          f"B = {args.batch_size}, delta = {args.delta:g}, {args.conversion} conversion")
    for name, result in results.items():
        print(f"  {name:<17} sigma = {result['sigma']:.4f} -> epsilon = "
              f"{result['epsilon']:.4f}{'' if result['proven'] else '  (NOT proven)'}")
    print("  (proven only for a run that discards the DP phase's critic updates, "
          "scripts/gswgan.py's default; with --critic_updates keep no epsilon is proven)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gswgan"]:
        return gswgan_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.queries_per_step < 1:
        parser.error(f"--queries_per_step must be an integer >= 1, got "
                     f"{args.queries_per_step}; it is the number of TopAgg calls per "
                     "generator step (the fake batch size, e.g. 30).")
    if args.target_eps is not None:
        mode = "calibrate_sigma"
        if args.sigma is not None:
            parser.error(f"--sigma {args.sigma!r} cannot be combined with --target_eps, "
                         "which computes sigma; drop one of them.")
        if args.steps is None:
            parser.error("--target_eps needs --steps (the steps the budget must cover).")
    elif args.max_eps is not None:
        mode = "max_steps"
        if args.steps is not None:
            parser.error(f"--steps {args.steps!r} cannot be combined with --max_eps, "
                         "which computes the number of steps; drop one of them.")
        if args.sigma is None:
            parser.error("--max_eps needs --sigma.")
    else:
        mode = "epsilon"
        if args.sigma is None or args.steps is None:
            parser.error("give --sigma and --steps (or --max_eps / --target_eps).")

    conversions = (list(accounting.Conversion) if args.conversion in ("all", "both")
                   else [accounting.Conversion(args.conversion)])
    try:
        orders = None if args.orders is None else accounting.classic_orders(args.orders)
        results = {}
        for conversion in conversions:
            result = _compute(args, conversion, orders)
            result["orders"] = _orders_label(conversion, args.orders)
            results[conversion.value] = result
        noise_multiplier = (None if args.sigma is None else
                            accounting.topagg_noise_multiplier(sigma=args.sigma,
                                                               topk=args.topk))
    except (ValueError, TypeError) as error:
        parser.error(str(error))

    inputs = {"sigma": args.sigma, "topk": args.topk,
              "queries_per_step": args.queries_per_step, "steps": args.steps,
              "delta": args.delta, "max_eps": args.max_eps,
              "target_eps": args.target_eps, "noise_multiplier": noise_multiplier}
    if args.json:
        print(json.dumps({"mode": mode, "inputs": inputs, "results": results}))
        return 0
    if mode != "calibrate_sigma":
        print(f"TopAgg: sigma = {args.sigma:g}, topk = {args.topk} -> noise multiplier "
              f"sigma / (2 sqrt(topk)) = {noise_multiplier:.6g}; "
              f"{args.queries_per_step} queries per step; delta = {args.delta:g}")
    else:
        print(f"TopAgg: topk = {args.topk}, {args.queries_per_step} queries per step; "
              f"delta = {args.delta:g}")
    if mode == "epsilon":
        print(f"after {args.steps} steps ({args.steps * args.queries_per_step} queries):")
    for result in results.values():
        print("  " + _describe(mode, result, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
