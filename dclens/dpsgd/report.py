"""The private-classifier results table (``results/dpsgd/README.md``), written from the
runs' own ``report.json`` files so that no number in it is typed by hand.

Layout of the results folder: one ``<name>.json`` per published run (a copy of its
``report.json``) and ``sweeps/<name>.json`` per published settings sweep (its
``sweep.json``).  Runs with the same method, budget and settings form one row, with the
mean and sample standard deviation of their test accuracy (each run's evaluation chosen on
its held-out validation images) over the runs, i.e. over their independent noise draws.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

from dclens.common.reporting import ReportError, copy_once, mean_sd, mean_sd_cell, write_marked_section
from dclens.dpsgd.config import DpsgdConfig
from dclens.dpsgd.mechanisms import Method
from dclens.runs.rundir import RunPaths

BEGIN_MARK = "<!-- dpsgd:begin (written by scripts/dpsgd_report.py; edit outside the markers) -->"
END_MARK = "<!-- dpsgd:end -->"

#: Settings that make two runs one row (besides method and budget); the method decides
#: which of them apply (:func:`_settings`).
_COMMON = ("learning_rate", "lr_milestones", "lr_decay", "momentum", "epochs", "batch_size",
           "activation", "validation", "dataset", "max_records", "delta", "conversion")
#: Settings added after runs were published, with the value those runs had (no schedule).
_ADDED_LATER = {"lr_milestones": (), "lr_decay": 0.1}


def _hashable(value: object) -> object:
    """A JSON list (e.g. lr_milestones) as a tuple, so settings can key a row."""
    return tuple(value) if isinstance(value, list) else value


@dataclasses.dataclass(frozen=True)
class Run:
    """One published run, as its report says."""

    name: str
    method: str
    target_eps: float | None
    sigma_given: float | None
    settings: tuple[tuple[str, object], ...]
    test: float
    validation: float
    test_final: float
    epsilon: float
    sigma: float
    seeded: bool

    @property
    def row_key(self) -> tuple:
        return (self.method, self.target_eps or 0.0, self.sigma_given or 0.0, self.settings)


def _settings(config: dict) -> tuple[tuple[str, object], ...]:
    names = list(_COMMON)
    method = config["method"]
    if method in ("gm", "topagg", "topagg_dimension"):
        names.append("clip")
    if method.startswith("topagg"):
        names.append("topk")
    if method in ("gep", "bgep"):
        names += ["clip_embedding", "clip_residual", "num_bases", "num_groups", "anchors",
                  "anchor_source"]
    return tuple((name, _hashable(config.get(name, _ADDED_LATER.get(name)))) for name in names)


def read_run(path: str) -> Run:
    """A published run from its report (raises ``ReportError`` naming what is missing)."""
    with open(path, encoding="utf-8") as handle:
        report = json.load(handle)
    try:
        config, accuracy, privacy = report["config"], report["accuracy"], report["privacy"]
        return Run(name=os.path.splitext(os.path.basename(path))[0],
                   method=report["method"], target_eps=config.get("target_eps"),
                   sigma_given=config.get("sigma"), settings=_settings(config),
                   test=accuracy["test_at_chosen"],
                   validation=accuracy["validation_at_chosen"],
                   test_final=accuracy["test_final"],
                   epsilon=privacy["epsilon"]["epsilon"], sigma=privacy["sigma"],
                   seeded=config.get("seed") is not None)
    except KeyError as missing:
        raise ReportError(f"{path}: not a private-classifier report.json (no {missing}); "
                          f"publish a run with scripts/dpsgd_report.py add RUN_DIR") from None


def collect(results_dir: str) -> list[Run]:
    """Every ``<results_dir>/*.json`` run, by name."""
    return [read_run(p) for p in sorted(glob.glob(os.path.join(results_dir, "*.json")))]


def _describe(settings: tuple[tuple[str, object], ...], defaults: dict) -> str:
    """The settings that differ from ``scripts/dpsgd.py``'s defaults for the method (as
    they are now), e.g. ``lr 4``."""
    short = {"learning_rate": "lr", "momentum": "momentum", "clip": "C", "topk": "k",
             "epochs": "epochs", "batch_size": "B", "clip_embedding": "S1",
             "clip_residual": "S2", "num_bases": "bases", "anchors": "anchors",
             "lr_milestones": "lr decayed at (of the steps)", "lr_decay": "lr decay"}
    parts = []
    for name, value in settings:
        if _hashable(defaults.get(name)) != value:
            shown = (f"{value:g}" if isinstance(value, float) else
                     "/".join(f"{v:g}" for v in value) if isinstance(value, tuple) else
                     str(value))
            parts.append(f"{short.get(name, name)} {shown}")
    return ", ".join(parts) or "defaults"


def render(runs: list[Run], sweeps: list[dict] | None = None) -> str:
    """The markdown between the markers: one row per (method, budget, settings), then one
    line per sweep."""

    defaults = {m.value: DpsgdConfig(method=m).to_dict() for m in Method}
    chosen = {f"{sweep['name']}-{sweep['chosen']['name']}" for sweep in sweeps or []}
    rows: dict[tuple, list[Run]] = {}
    for run in runs:
        rows.setdefault(run.row_key, []).append(run)
    lines = ["| method | budget | settings (not the defaults) | runs | test accuracy "
             "(evaluation chosen on validation) | validation | final test | epsilon spent "
             "| sigma | files |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2], str(k[3]))):
        members = rows[key]
        first = members[0]
        budget = (f"eps {first.target_eps:g}" if first.target_eps is not None
                  else f"sigma {first.sigma_given:g} given")
        files = ", ".join(f"`{m.name}`" + (" (seeded)" if m.seeded else "")
                          + (" (chosen on validation in its sweep)" if m.name in chosen else "")
                          for m in members)
        epsilon = max(m.epsilon for m in members)
        lines.append(
            f"| {first.method} | {budget} | {_describe(first.settings, defaults[first.method])} | "
            f"{len(members)} | {mean_sd_cell([m.test for m in members])} | "
            f"{mean_sd(m.validation for m in members)[1]:.4f} | "
            f"{mean_sd(m.test_final for m in members)[1]:.4f} | <= {epsilon:.4f} | "
            f"{mean_sd(m.sigma for m in members)[1]:.3f} | {files} |")
    lines.append("")
    lines.append("Mean +- sample standard deviation (ddof = 1) over the runs of a row, each "
                 "with its own noise; epsilon at delta = 1e-5 unless the settings say "
                 "otherwise, for adding or removing one private example.")
    for sweep in sweeps or []:
        best = sweep["chosen"]
        points = ", ".join(f"{row['name']}: val {row['validation_at_chosen']:.4f} / test "
                           f"{row['test_at_chosen']:.4f}" for row in sweep["rows"])
        lines += ["", f"**Sweep `{sweep['name']}`** ({sweep['base']['method']}, "
                      f"{len(sweep['rows'])} of {sweep['points_planned']} points): {points}. "
                      f"Chosen on validation: **{best['name']}**. "
                      f"{sweep['privacy_of_the_choice'][0].upper()}"
                      f"{sweep['privacy_of_the_choice'][1:]}"]
    return "\n".join(lines)



def collect_sweeps(results_dir: str) -> list[dict]:
    """Every ``<results_dir>/sweeps/*.json``, with its ``name`` (the file's stem)."""
    sweeps = []
    for path in sorted(glob.glob(os.path.join(results_dir, "sweeps", "*.json"))):
        with open(path, encoding="utf-8") as handle:
            sweep = json.load(handle)
        if "chosen" not in sweep or "rows" not in sweep:
            raise ReportError(f"{path}: not a sweep.json of scripts/dpsgd_sweep.py")
        sweep["name"] = os.path.splitext(os.path.basename(path))[0]
        sweeps.append(sweep)
    return sweeps


def publish_run(run_dir: str, results_dir: str, name: str | None = None) -> str:
    """Copies ``run_dir/report.json`` to ``results_dir/<name>.json`` (default name: the
    run folder's); refuses an unfinished run and an existing different file."""
    source = RunPaths(run_dir).report
    if not os.path.exists(source):
        raise ReportError(f"{run_dir!r} has no report.json: the run has not finished "
                          f"(repeat its scripts/dpsgd.py command to resume it)")
    read_run(source)                                  # it must be a report we can read
    name = name or os.path.basename(os.path.normpath(run_dir))
    return copy_once(source, os.path.join(results_dir, f"{name}.json"))


def publish_sweep(root: str, results_dir: str, name: str | None = None) -> list[str]:
    """Copies a sweep's ``sweep.json`` to ``results_dir/sweeps/<name>.json`` and each
    finished point's report to ``results_dir/<name>-<point>.json``. A sweep published
    before with fewer points (same base settings, the same results for the points it had)
    is replaced by the grown one; any other sweep of that name is an error."""
    source = os.path.join(root, "sweep.json")
    if not os.path.exists(source):
        raise ReportError(f"{root!r} has no sweep.json: no point of the sweep has finished")
    name = name or os.path.basename(os.path.normpath(root))
    with open(source, encoding="utf-8") as handle:
        sweep = json.load(handle)
    target = os.path.join(results_dir, "sweeps", f"{name}.json")
    written = [copy_once(source, target, replace=_grown_from(sweep, target))]
    for row in sweep["rows"]:
        written.append(publish_run(os.path.join(root, row["name"]), results_dir,
                                   f"{name}-{row['name']}"))
    return written


def _grown_from(sweep: dict, target: str) -> bool:
    """Whether ``sweep`` is the sweep published at ``target`` with more points: the same
    base settings, and every published point again with the same results (a sweep whose
    grid was extended and re-run under the same root). Such a sweep replaces its copy."""
    if not os.path.exists(target):
        return False
    try:
        with open(target, encoding="utf-8") as handle:
            published = json.load(handle)
    except (OSError, ValueError):
        return False
    rows = {row["name"]: row for row in sweep.get("rows", [])}
    return (published.get("base") == sweep.get("base")
            and all(rows.get(row["name"]) == row for row in published.get("rows", [])))


def write(results_dir: str) -> str:
    """Rewrites the generated section of ``results_dir/README.md``; returns its path."""
    markdown = os.path.join(results_dir, "README.md")
    write_marked_section(markdown, render(collect(results_dir), collect_sweeps(results_dir)),
                         BEGIN_MARK, END_MARK)
    return markdown

