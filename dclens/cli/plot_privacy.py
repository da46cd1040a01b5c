"""Epsilon per generator step of a run (paper Fig. 2): the spent, data-independent bound
and, for runs with --signsgd_dept, the authors' data-dependent analysis (never spent).

  python scripts/plot_privacy.py runs/demo                 # writes runs/demo/epsilon.png
  python scripts/plot_privacy.py runs/fig2 --out fig2.png

Reads the run's privacy.json (epsilon_per_step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from dclens.common import export


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False,
                                     prog="plot_privacy.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run directory (its privacy.json)")
    parser.add_argument("--out", help="PNG to write (default: <run_dir>/epsilon.png)")
    return parser


def plot(privacy: dict, path: str, title: str = "") -> dict[str, float | None]:
    """Writes the figure; returns the last epsilon of each curve."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    curve = privacy.get("epsilon_per_step") or []
    if not curve:
        raise ValueError("privacy.json has no epsilon_per_step: the run spent nothing yet")
    steps = [point["step"] for point in curve]
    spent = [point["epsilon"] for point in curve]
    analysis = [point.get("epsilon_data_dependent_analysis") for point in curve]
    figure = pyplot.figure(figsize=(6.0, 3.8), dpi=100)
    axes = figure.add_subplot(1, 1, 1)
    axes.plot(steps, spent, color="tab:blue",
              label=f"data-independent (spent, {privacy.get('conversion', '?')})")
    if any(value is not None for value in analysis):
        axes.plot(steps, analysis, color="tab:orange", linestyle="--",
                  label="data-dependent (authors' analysis, classic; NOT spent)")
    axes.set_xlabel("generator step")
    axes.set_ylabel(f"epsilon at delta {privacy.get('delta')}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title(title or "epsilon per step", fontsize=9)
    figure.tight_layout()
    export.atomic_write(path, lambda s: figure.savefig(s, format="png"))
    pyplot.close(figure)
    return {"data_independent": spent[-1], "data_dependent_analysis": analysis[-1]}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    source = os.path.join(args.run_dir, "privacy.json")
    try:
        with open(source) as stream:
            privacy = json.load(stream)
        out = args.out or os.path.join(args.run_dir, "epsilon.png")
        last = plot(privacy, out, title=os.path.basename(os.path.normpath(args.run_dir)))
    except (OSError, ValueError) as error:
        print(f"plot_privacy.py: {error}", file=sys.stderr)
        return 2
    print(f"wrote {out}: last epsilon {last['data_independent']:.4f} (spent)"
          + ("" if last["data_dependent_analysis"] is None else
             f", {last['data_dependent_analysis']:.4f} (data-dependent analysis, not spent)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
