"""The whole-run study's report: ``README.md``, ``summary.json``, ``curves.png`` and each
finished run's small JSON, generated from :func:`dclens.parity.whole_run_study.summarize`
(never written by hand: rerun ``scripts/side_by_side.py --whole_runs ...`` to refresh it)."""

from __future__ import annotations

import json
import math
import os
import numpy as np

from dclens.common import export, reporting
from dclens.parity.whole_run import SIDES
from dclens.parity.whole_run_study import (AUTHORS_PROTOCOL_FILE, EVALUATION_FILE, RUN_FILE,
                                           welch_interval)

#: Accuracy measures the equivalence statement is made for (higher is better).
ACCURACIES = ("val", "sen", "authors_range1", "label_agreement")

#: Curves drawn as bands: (run.json key, axis title).
CURVE_PANELS = (("pass_fraction", "share of coordinates passing the threshold"),
                ("generator_loss", "generator loss (before its update)"),
                ("teacher_loss", "teachers' loss after their training (mean)"))


def _number(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "--"
    return f"{value:.{digits}f}"


def _side_cell(stats: dict, digits: int) -> str:
    if not stats["n"]:
        return "not run"
    if stats["sd"] is None:
        return f"{stats['mean']:.{digits}f} (1 run)"
    return f"{stats['mean']:.{digits}f} +- {stats['sd']:.{digits}f} ({stats['n']})"


def _digits(key: str) -> int:
    return {"fid": 2, "steps": 0, "seconds_per_step": 2}.get(key, 4)


def comparison_table(summary: dict) -> list[str]:
    lines = ["| measure | authors' code | dclens | dclens - authors, 95% interval (Welch) |",
             "|---|---|---|---|"]
    for key, entry in summary["comparison"].items():
        digits = _digits(key)
        difference = entry.get("difference")
        cell = "--"
        if difference is not None:
            cell = (f"{difference['dclens_minus_authors']:+.{digits}f} "
                    f"[{_number(difference['low'], digits)}, "
                    f"{_number(difference['high'], digits)}]")
        lines.append(f"| {entry['label']} | {_side_cell(entry['authors'], digits)} | "
                     f"{_side_cell(entry['dclens'], digits)} | {cell} |")
    return lines


def equivalence(summary: dict) -> list[str]:
    """Per accuracy measure: the largest difference the 95% interval allows, and whether
    it contains zero."""
    lines = []
    for key in ACCURACIES:
        entry = summary["comparison"].get(key, {})
        difference = entry.get("difference")
        if difference is None or math.isnan(difference["low"]):
            continue
        bound = max(abs(difference["low"]), abs(difference["high"]))
        contains = difference["low"] <= 0 <= difference["high"]
        lines.append(f"* {entry['label']}: the two differ by at most **{bound:.3f}** "
                     f"(95% Welch interval [{difference['low']:+.3f}, "
                     f"{difference['high']:+.3f}]; "
                     + ("it contains 0: no difference shows beyond the seed spread)"
                        if contains else "it excludes 0: **the two differ**)"))
    return lines


#: Runs a side below which a verdict is only preliminary (the study's minimum).
RUNS_FOR_VERDICT = 5

#: The family-wise error rate of the verdict over the accuracy measures.
VERDICT_ERROR = 0.05


def _compared(summary: dict) -> dict[str, tuple[list[float], list[float]]]:
    """The accuracy measures with at least two values a side: (authors', dclens')."""
    compared = {}
    for key in ACCURACIES:
        entry = summary["comparison"].get(key, {})
        theirs = entry.get("authors", {}).get("values", [])
        ours = entry.get("dclens", {}).get("values", [])
        if len(theirs) >= 2 and len(ours) >= 2:
            compared[key] = (theirs, ours)
    return compared


def verdict_intervals(summary: dict) -> dict[str, tuple[float, float]]:
    """Per compared accuracy measure, the Welch interval of dclens minus the authors at
    level 1 - VERDICT_ERROR / m (Bonferroni over the m measures compared), so that the
    chance that any of them excludes 0 when the two sides do not differ is at most
    VERDICT_ERROR."""
    compared = _compared(summary)
    level = verdict_level(len(compared))
    return {key: welch_interval(theirs, ours, level)[1:3]
            for key, (theirs, ours) in compared.items()}


def verdict_level(measures: int) -> float:
    """The confidence level of each of ``measures`` verdict intervals (Bonferroni)."""
    return 1 - VERDICT_ERROR / max(measures, 1)


def agreement(summary: dict, intervals: dict[str, tuple[float, float]] | None = None
              ) -> bool | None:
    """True when every Bonferroni-adjusted accuracy interval (:func:`verdict_intervals`,
    or ``intervals`` already computed from it) contains 0, False when one excludes it,
    None when none exists yet (fewer than two runs a side)."""
    if intervals is None:
        intervals = verdict_intervals(summary)
    if not intervals:
        return None
    return all(low <= 0 <= high for low, high in intervals.values())


def runs_for_verdict(summary: dict) -> int:
    """The fewest runs with a value, over the compared accuracy measures and both sides."""
    compared = _compared(summary)
    return min((len(values) for pair in compared.values() for values in pair), default=0)


def step_seconds(run: dict) -> float:
    """A run's median seconds per generator step after the first (the first holds the
    pretraining and TensorFlow's set-up); the median shrugs off a transient load."""
    return float(np.median(run["curves"]["seconds"][1:] or run["curves"]["seconds"]))


def speed(summary: dict) -> list[str]:
    """Each side's fastest run (the least disturbed: other load only adds time), by its
    median step; every run's figure is in the per-run table."""
    runs = summary["runs"]
    if not runs["authors"] or not runs["dclens"]:
        return []
    theirs = min(step_seconds(run) for run in runs["authors"])
    ours = min(step_seconds(run) for run in runs["dclens"])
    machines = {json.dumps(run.get("machine"), sort_keys=True) for side in SIDES
                for run in runs[side] if run.get("machine")}
    cpu = next((run["machine"] for run in runs["dclens"] if run.get("machine")), None)
    where = f" ({cpu['cpu']}, oneDNN {'on' if cpu['onednn'] else 'off'})" if cpu else ""
    setup = {side: np.mean([run["setup_seconds"] for run in runs[side]]) for side in SIDES}
    first = {side: np.mean([run["curves"]["seconds"][0] for run in runs[side]])
             for side in SIDES}
    return [f"Seconds per generator step{where}, each side's fastest run by its median "
            f"step after the first (run i of each side trained back to back): the "
            f"authors' code **{theirs:.2f} s**, dclens **{ours:.2f} s**: dclens takes "
            f"**{ours / theirs:.3f}x** the authors' time per step ({theirs / ours:.1f}x "
            f"faster). The first step (teachers' pretraining; TensorFlow building their "
            f"executors, tracing ours) takes {first['authors']:.0f} s and "
            f"{first['dclens']:.0f} s on average, and setting up (their graph, our "
            f"model) {setup['authors']:.0f} s and {setup['dclens']:.0f} s."
            + ("" if len(machines) <= 1 else " NOTE: the runs were made on more than one "
               "machine; the ratio mixes them.")]


def per_run_table(summary: dict) -> list[str]:
    keys = ("val", "sen", "authors_range1", "fid", "label_agreement", "epsilon",
            "seconds_per_step")
    lines = ["| side | run | seed | " + " | ".join(keys) + " | median s/step |",
             "|---|---|---|" + "---|" * (len(keys) + 1)]
    for side in SIDES:
        for run in summary["runs"][side]:
            cells = [_number(run["values"][key], _digits(key)) for key in keys]
            cells.append(_number(step_seconds(run), 2))
            lines.append(f"| {side} | {run['index']} | {run['seed']} | "
                         + " | ".join(cells) + " |")
    return lines


def plot_curves(summary: dict, path: str) -> None:
    """Per step, each side's mean +- sd over its runs, one panel per curve."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(1, len(CURVE_PANELS), figsize=(5 * len(CURVE_PANELS), 3.6))
    for axis, (key, title) in zip(axes, CURVE_PANELS):
        for side, colour in zip(SIDES, ("tab:orange", "tab:blue")):
            curves = [run["curves"][key] for run in summary["runs"][side]]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            values = np.array([c[:length] for c in curves], float)
            mean = values.mean(axis=0)
            sd = values.std(axis=0, ddof=1) if len(values) > 1 else np.zeros(length)
            steps = np.arange(1, length + 1)
            axis.plot(steps, mean, color=colour, label=f"{side} ({len(values)} runs)")
            axis.fill_between(steps, mean - sd, mean + sd, color=colour, alpha=0.25)
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("generator step")
        axis.legend(fontsize=8)
    figure.tight_layout()
    export.atomic_write(path, lambda stream: figure.savefig(stream, format="png", dpi=90))
    plt.close(figure)


def render(summary: dict, *, command: str, date: str) -> str:
    settings = summary["settings"]
    config = settings["config"]
    lock = config["lockstep"]
    intervals = verdict_intervals(summary)
    verdict = agreement(summary, intervals)
    finished = {side: len(summary["runs"][side]) for side in SIDES}
    lines = [
        "# Whole runs side by side: the authors' code and dclens",
        "",
        f"Generated {date} by `{command}` from the runs' reports "
        "(`dclens/parity/whole_run_report.py`); do not edit by hand.",
        "",
        f"{finished['authors']} of {settings['runs']} runs of the authors' code and "
        f"{finished['dclens']} of {settings['runs']} of dclens have finished training.",
        "",
        "## The configuration (both sides)",
        "",
        f"{lock['teachers']} teachers x {lock['records']} records (a class-balanced subset "
        f"of the real Fashion-MNIST training set, split by the authors' partitioner), batch "
        f"{lock['batch_size']}, k = {lock['topk']}, sigma = {lock['sigma']:g}, beta = "
        f"{lock['thresh']}, {'stochastic' if lock['stochastic'] else 'deterministic'} sign, "
        f"d_step {lock['d_step']} (pretraining {lock['pretrain_teacher']}), z_dim "
        f"{lock['z_dim']}, learning rate {lock['learning_rate']:g}, beta1 {lock['beta1']}; "
        f"budget epsilon {config['max_eps']:.4g} at delta {lock['delta']:g} "
        f"({config['steps']} generator steps), {config['samples']} samples per run. "
        f"Each run has its own seed (root seed {settings['root_seed']}): the authors' "
        "numpy global seed and TF graph seed (their own initialisers), dclens' root seed. "
        "Both sides draw fresh noise: the epsilons are real and equal. The teachers' loss "
        "curve below is a noise-free function of the training records, published here "
        "because they are the public Fashion-MNIST and this is a parity study; a private "
        "run keeps it to its own TensorBoard.",
        "",
        "## The comparison",
        "",
        *comparison_table(summary),
        "",
        *equivalence(summary),
        "",
    ]
    how = (f"Welch intervals at {100 * verdict_level(len(intervals)):.4g}% "
           f"for each of the {len(intervals)} accuracy measures compared (Bonferroni: a "
           f"{100 * VERDICT_ERROR:g}% chance in all of a difference shown where there is "
           f"none): " + "; ".join(f"{key} [{low:+.3f}, {high:+.3f}]"
                                  for key, (low, high) in intervals.items()))
    fewest = runs_for_verdict(summary)
    label = ("Verdict" if fewest >= RUNS_FOR_VERDICT else
             f"Preliminary verdict ({fewest} runs on the smaller side; the study's verdict "
             f"needs {RUNS_FOR_VERDICT} a side, and so few runs can understate a side's "
             f"spread)")
    if verdict is True:
        lines += [f"**{label}: the two agree** within the seed spread on every accuracy "
                  f"measure. {how}.", ""]
    elif verdict is False:
        lines += [f"**{label}: they differ** on at least one accuracy measure beyond the "
                  f"seed spread. {how}.", ""]
    else:
        lines += ["**No verdict yet:** a Welch interval needs at least two finished runs a "
                  "side (five a side make the comparison; run the command again to add "
                  "them).", ""]
    lines += ["## Per-step curves", "", "![curves](curves.png)", "",
              "Mean +- sd over each side's runs.", "", "## Speed", "", *speed(summary), "",
              "## Every run", "", *per_run_table(summary), ""]
    return "\n".join(lines)


def copy_run_reports(study_dir: str, out_dir: str) -> list[str]:
    """Each finished run's small JSON files (``run.json``, ``evaluation.json``,
    ``authors_protocol.json``; not its samples) into ``out_dir/runs/<side>-<i>/``, so a
    published study keeps its evidence when ``runs/`` is lost."""
    copied = []
    for folder in sorted(os.listdir(study_dir)):
        source = os.path.join(study_dir, folder)
        if not (os.path.isdir(source) and os.path.exists(os.path.join(source, RUN_FILE))):
            continue
        for name in (RUN_FILE, EVALUATION_FILE, AUTHORS_PROTOCOL_FILE):
            if os.path.exists(os.path.join(source, name)):
                copied.append(reporting.copy_once(
                    os.path.join(source, name), os.path.join(out_dir, "runs", folder, name),
                    replace=True))
    return copied


def publish(summary: dict, out_dir: str, *, command: str, date: str,
            study_dir: str | None = None) -> str:
    """Writes README.md, summary.json, curves.png (and with ``study_dir`` every finished
    run's JSON, :func:`copy_run_reports`) into ``out_dir``; returns the README path."""
    os.makedirs(out_dir, exist_ok=True)
    if study_dir is not None:
        copy_run_reports(study_dir, out_dir)
    export.write_json(os.path.join(out_dir, "summary.json"), summary)
    plot_curves(summary, os.path.join(out_dir, "curves.png"))
    path = os.path.join(out_dir, "README.md")
    text = render(summary, command=command, date=date)
    export.atomic_write(path, lambda stream: stream.write(text), mode="w")
    return path
