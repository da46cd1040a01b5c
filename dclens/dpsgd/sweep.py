"""A hyper-parameter grid of private classifier runs, chosen on the held-out validation set.

Each grid point is an ordinary :func:`dclens.dpsgd.train.train_private_classifier` run in
its own directory under the sweep's root (so every point resumes, and a finished point is
read back instead of retrained). The chosen point is the one with the best validation
accuracy at its validation-chosen epoch; the test set never takes part in a choice.

Privacy: each point's epsilon is what that run spent on its own private examples. Choosing
among the points is a further use of the private data that no point's epsilon covers (the
choice itself can leak; Papernot & Steinke, ICLR 2022). The summary says so; a grid is for
finding settings, and the published number should come from fresh runs at the chosen
settings, or from settings fixed before looking at the data.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from typing import Any, Callable

from dclens.common import export
from dclens.dpsgd.config import DpsgdConfig, DpsgdConfigError
from dclens.dpsgd.train import train_private_classifier
from dclens.runs.rundir import RunPaths

#: The settings a grid may vary (the optimisation, the mechanism's parameters, the
#: budget, the model's activation) and the type of their values.
GRID_SETTINGS = {"learning_rate": float, "clip": float, "momentum": float, "epochs": float,
                 "batch_size": int, "topk": float, "clip_embedding": float,
                 "clip_residual": float, "num_bases": int, "sigma": float,
                 "target_eps": float, "activation": str}

SELECTION_CAVEAT = (
    "each point's epsilon covers that run alone; choosing among the points on validation "
    "accuracy is a further use of the private data that no epsilon here covers (the choice "
    "can leak: Papernot & Steinke, ICLR 2022). Use the chosen settings for fresh runs, or "
    "fix settings before looking at the data, for a published number.")


class SweepError(ValueError):
    """A grid specification is malformed (the message quotes it and says the form)."""


def parse_grid(specs: list[str]) -> dict[str, tuple]:
    """``["learning_rate=0.5,2", "clip=1,4"]`` -> ``{"learning_rate": (0.5, 2.0), ...}``.

    Each setting may appear once, with at least one value, and must be one of
    :data:`GRID_SETTINGS`.
    """
    grid: dict[str, tuple] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep or not values.strip():
            raise SweepError(f"--grid {spec!r}: write NAME=V1,V2,... e.g. "
                             f"learning_rate=0.5,2,4")
        if name not in GRID_SETTINGS:
            raise SweepError(f"--grid {spec!r}: {name!r} cannot be varied; choose from "
                             f"{sorted(GRID_SETTINGS)}")
        if name in grid:
            raise SweepError(f"--grid {spec!r}: {name} is given twice; list all its values "
                             f"in one --grid")
        kind = GRID_SETTINGS[name]
        try:
            parsed = tuple(kind(value) for value in values.split(","))
        except ValueError:
            raise SweepError(f"--grid {spec!r}: every value of {name} must be "
                             f"{'an integer' if kind is int else 'a number'}") from None
        if len(set(parsed)) != len(parsed):
            raise SweepError(f"--grid {spec!r}: a value repeats")
        grid[name] = parsed
    if "sigma" in grid and "target_eps" in grid:
        raise SweepError("--grid varies both sigma and target_eps: a run takes one of them")
    return grid


def point_name(settings: dict[str, Any]) -> str:
    """The directory name of one grid point, e.g. ``learning_rate-0.5_clip-1``."""
    return "_".join(f"{name}-{value:g}" if not isinstance(value, str) else f"{name}-{value}"
                    for name, value in settings.items()) or "base"


def expand(base: DpsgdConfig, grid: dict[str, tuple]) -> list[tuple[dict[str, Any], DpsgdConfig]]:
    """Every combination of the grid's values applied to ``base`` (checked as a config).

    Varying ``sigma`` turns the base's ``target_eps`` off (and the reverse), since a run
    takes exactly one of them.
    """
    names = list(grid)
    points = []
    for values in itertools.product(*(grid[name] for name in names)):
        settings = dict(zip(names, values))
        changes = dict(settings)
        if "sigma" in settings:
            changes["target_eps"] = None
        if "target_eps" in settings:
            changes["sigma"] = None
        try:
            points.append((settings, dataclasses.replace(base, **changes)))
        except DpsgdConfigError as error:
            raise SweepError(f"grid point {point_name(settings)}: {error}") from None
    return points


def summarise(points: list[tuple[dict[str, Any], dict]]) -> dict:
    """The sweep's summary from ``(settings, report)`` pairs: one row per point and the
    point with the best validation accuracy (ties: the first listed)."""
    if not points:
        raise SweepError("an empty sweep has nothing to choose from")
    rows = []
    for settings, report in points:
        accuracy, privacy = report["accuracy"], report["privacy"]
        rows.append({"settings": settings, "name": point_name(settings),
                     "validation_at_chosen": accuracy["validation_at_chosen"],
                     "test_at_chosen": accuracy["test_at_chosen"],
                     "chosen_epoch": accuracy["chosen_epoch"],
                     "test_final": accuracy["test_final"],
                     "epsilon": privacy["epsilon"]["epsilon"], "sigma": privacy["sigma"],
                     "seconds": report.get("seconds_this_call")})
    best = max(range(len(rows)), key=lambda i: (rows[i]["validation_at_chosen"], -i))
    return {"rows": rows, "chosen": rows[best],
            "selection": "the point with the best held-out validation accuracy (the test "
                         "set takes no part)",
            "privacy_of_the_choice": SELECTION_CAVEAT}


def run_sweep(base: DpsgdConfig, grid: dict[str, tuple], root: str, *,
              train: Callable[..., dict] | None = None,
              log: Callable[[str], None] = print, progress: bool = False) -> dict:
    """Trains (or resumes, or reads back) every grid point under ``root``; writes and
    returns ``root/sweep.json``, rewritten after every point so a stopped sweep shows
    what it has."""
    if train is None:
        train = train_private_classifier
    points = expand(base, grid)
    done: list[tuple[dict[str, Any], dict]] = []
    os.makedirs(root, exist_ok=True)
    summary: dict = {}
    for index, (settings, config) in enumerate(points, 1):
        run_dir = os.path.join(root, point_name(settings))
        report_path = RunPaths(run_dir).report
        report = _finished_report(report_path, config)
        if report is None:
            log(f"[{index}/{len(points)}] {point_name(settings)}: training in {run_dir}")
            report = train(config, run_dir, progress=progress, log=lambda line: None)
        else:
            log(f"[{index}/{len(points)}] {point_name(settings)}: finished before, read back")
        done.append((settings, report))
        log(f"[{index}/{len(points)}] {point_name(settings)}: validation "
            f"{report['accuracy']['validation_at_chosen']:.4f}, test "
            f"{report['accuracy']['test_at_chosen']:.4f}")
        summary = {"base": base.to_dict(), "grid": {k: list(v) for k, v in grid.items()},
                   "points_planned": len(points), **summarise(done)}
        export.write_json(os.path.join(root, "sweep.json"), summary)
    return summary


def _finished_report(path: str, config: DpsgdConfig) -> dict | None:
    """A finished point's report if it was made with exactly this config, else None (then
    training resumes the run, or refuses a directory holding another config)."""
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        report = json.load(handle)
    return report if report.get("config") == config.to_dict() else None
