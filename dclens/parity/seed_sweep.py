"""The lockstep comparison over many seeds: how far each compared quantity lies from its
tolerance across draws, not only on one.

Each seed gives the authors' NumPy draws, dclens' initial weights and the replayed noise
(:class:`dclens.parity.config.SideBySideConfig`'s ``seed``), so each is a different,
exactly repeatable comparison.  :func:`run_seeds` records, per seed and step, the
quantities :func:`dclens.parity.compare.compare_step` holds to
:data:`dclens.parity.compare.TOLERANCES` and those it only reports, and summarises each
over the seeds (median, maximum, and the seed of the maximum) with the tolerance beside
it: the margin of every check in one table.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import numpy as np

from dclens.parity.compare import TOLERANCES
from dclens.parity.config import SideBySideConfig, SideBySideError
from dclens.parity.side_by_side import run_side_by_side

#: What is recorded of every step: name -> (how to read it from a report row, the
#: tolerance it is held to, or None where it is reported only).
QUANTITIES: dict[str, tuple[Callable[[dict], float], float | None]] = {
    "teacher_loss_same_weights": (lambda row: row["same_inputs"]["teacher_loss"]["max_rel"],
                                  TOLERANCES["teacher_loss"]),
    "teacher_loss_run": (lambda row: row["teacher_loss"]["max_rel"], None),
    "teacher_movement_max_reach": (lambda row: row["teacher_movement"]["max"],
                                   TOLERANCES["adam_max"]),
    "teacher_outlier_fraction": (lambda row: row["teacher_movement"]["outlier_fraction"],
                                 TOLERANCES["adam_outlier_fraction"]),
    "image_gradients_same_weights": (
        lambda row: row["same_inputs"]["image_gradients"]["max_rel"],
        TOLERANCES["image_gradients"]),
    "image_gradients_run": (lambda row: row["image_gradients"]["max_rel"], None),
    "vote_sum_mismatches_unexplained": (
        lambda row: row["votes"]["vote_sum_mismatches_unexplained"], 0),
    "epsilon_rel": (lambda row: row["epsilon"]["rel"], TOLERANCES["epsilon"]),
}


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per step and quantity: median and maximum over the seeds, the seed of the maximum,
    and the tolerance (None: reported only)."""
    summary: dict[str, dict[str, Any]] = {}
    steps = min(len(entry["steps"]) for entry in per_seed)
    for step in range(steps):
        rows = {}
        for name, (_, tolerance) in QUANTITIES.items():
            values = np.array([entry["steps"][step][name] for entry in per_seed], float)
            worst = int(np.argmax(values))
            rows[name] = {"median": float(np.median(values)), "max": float(values[worst]),
                          "seed_of_max": per_seed[worst]["seed"], "tolerance": tolerance}
        summary[f"step {step}"] = rows
    return summary


def run_seeds(config: SideBySideConfig, authors_repo: str | os.PathLike, seeds: int, *,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """The lockstep comparison of ``config`` at seeds ``config.seed`` ...
    ``config.seed + seeds - 1``; returns every seed's quantities, their summary and which
    seeds disagreed."""
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise SideBySideError(f"--seeds must be an integer >= 1, got {seeds!r}")
    started = time.perf_counter()
    per_seed = []
    for seed in range(config.seed, config.seed + seeds):
        report = run_side_by_side(dataclasses.replace(config, seed=seed), authors_repo,
                                  log=lambda line: None)
        entry = {"seed": seed, "agree": report["agree"],
                 "failed": {row["step"]: [c for c, ok in row["checks"].items() if not ok]
                            for row in report["steps"] if not row["agree"]},
                 "steps": [{name: float(read(row)) for name, (read, _) in QUANTITIES.items()}
                           for row in report["steps"]]}
        per_seed.append(entry)
        first = entry["steps"][0]
        log(f"seed {seed}: {'agree' if entry['agree'] else 'DISAGREE ' + str(entry['failed'])}"
            f"  step 0: loss {first['teacher_loss_same_weights']:.1e}"
            f" (run {first['teacher_loss_run']:.1e}),"
            f" teachers {first['teacher_movement_max_reach']:.2f} reach"
            f" ({first['teacher_outlier_fraction']:.0e} beyond 0.01)")
    return {"config": dataclasses.asdict(config), "seeds": seeds,
            "authors_repo": str(authors_repo), "tolerances": TOLERANCES,
            "disagreeing_seeds": [entry["seed"] for entry in per_seed if not entry["agree"]],
            "summary": summarise(per_seed), "per_seed": per_seed,
            "seconds": time.perf_counter() - started}
