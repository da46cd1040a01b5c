"""Choosing the downstream classifier's schedule on the tuning split (issue 39).

Under the ``val`` protocol (:mod:`dclens.evaluation.evaluate`) the classifier trains on
synthetic samples and the epoch is chosen on held-out *synthetic* samples. On DataLens'
samples that choice is poor: in every screening and paper-scale run so far the real
accuracy peaks within the first epochs and then falls while the held-out synthetic
accuracy climbs to 0.85-0.99 -- the classifier learns features of the generator that real
images do not have, and the synthetic held-out part rewards them. How the classifier is
trained (learning rate, epochs) is post-processing of the released samples, so it may be
chosen freely **as long as the choice looks at neither the private records nor the test
set**. This module makes that choice on screening runs -- runs trained on the tuning
split and scored on its holdout (:mod:`dclens.data.splits`) -- and only on them:

1. :func:`evaluate_candidates`: each candidate schedule evaluates each screening run's
   samples under the usual protocols, scored on the tuning holdout (one JSON per run and
   candidate, written atomically: an interrupted call resumes where it stopped);
2. :func:`summarise` / :func:`choose`: the candidate with the highest mean ``val`` over the
   screening runs (ties: the earlier candidate; the first is the default schedule);
3. the chosen schedule is then used *unchanged* on private runs (``scripts/evaluate.py
   --learning_rate ...``); its ``val`` there is as honest as the default's.

Runs whose ``config.json`` does not say ``training_records: tuning`` are refused by name:
a choice read from their scores would look at records a private run may hold, or at the
test set.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Sequence

from dclens.common import export, reporting
from dclens.evaluation import classifiers, evaluate
from dclens.evaluation.synthetic_input import EvaluationError, run_dir_config
from dclens.runs import rundir

#: What the chosen candidate maximises: the honest protocol.
CRITERION = "val"


class TuningError(ValueError):
    """A classifier-tuning input that cannot be used (quoted in the message)."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One classifier schedule to try, under a short name used in file names."""

    name: str
    schedule: classifiers.Schedule

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in "/\\ ") or self.name.startswith("."):
            raise TuningError(f"candidate name {self.name!r} must be non-empty without "
                              "slashes, spaces or a leading dot (it names a file)")


def learning_rate_candidates(learning_rates: Sequence[float], *,
                             base: classifiers.Schedule = classifiers.DEFAULT_SCHEDULE
                             ) -> list[Candidate]:
    """The default schedule with each learning rate (``lr<value>``), in the order given."""
    if not learning_rates:
        raise TuningError("give at least one learning rate")
    if len(set(learning_rates)) != len(learning_rates):
        raise TuningError(f"learning rates repeat: {list(learning_rates)!r}")
    return [Candidate(f"lr{rate:g}", dataclasses.replace(base, learning_rate=rate))
            for rate in learning_rates]


def screening_run(run_dir: str) -> str:
    """``run_dir`` if it is a screening run with samples (trained on the tuning split);
    else :class:`TuningError` saying why, so no choice ever reads a private run's scores."""
    samples = os.path.join(run_dir, "samples.npz")
    if not os.path.isfile(samples):
        raise TuningError(f"{run_dir!r} has no samples.npz: give run directories of "
                          "finished screening runs (scripts/tables.py --training_records "
                          "tuning)")
    try:
        config = run_dir_config(samples)
    except (OSError, json.JSONDecodeError) as error:
        raise TuningError(f"{run_dir!r}: cannot read its config.json ({error})") from error
    records = None if config is None else config.get("train", {}).get("training_records")
    if records != "tuning":
        raise TuningError(
            f"{run_dir!r} trained on training_records {records!r}, not 'tuning': the "
            "classifier's schedule may be chosen only on screening runs (trained on the "
            "tuning split, scored on its holdout), never on a run whose scores read "
            "private records or the test set")
    return run_dir


def run_label(run_dir: str) -> str:
    """A screening run's name in records and tables: its folder's name, or, for an extra
    sample set of a run (``<run>/samples-<n>``), ``<run>-samples-<n>``."""
    folder = os.path.normpath(run_dir)
    parent = rundir.run_of_sample_set(folder)
    if parent is None:
        return os.path.basename(folder)
    return f"{os.path.basename(parent)}-{os.path.basename(folder)}"


def evaluate_candidates(run_dirs: Sequence[str], candidates: Sequence[Candidate], *,
                        out_dir: str, settings: evaluate.EvalSettings | None = None,
                        log: Callable[[str], None] = print) -> list[dict]:
    """Evaluates every (run, candidate) on the tuning holdout; returns the records.

    ``settings``: everything but the schedule (default: the usual settings without IS/FID,
    which the schedule does not change); always scored on the tuning holdout. A record
    already in ``out_dir/<run>/<candidate>.json`` with the same settings is read, not
    recomputed; one with other settings is refused (``--out`` elsewhere).
    """
    if not run_dirs:
        raise TuningError("give at least one screening run directory")
    check_out_dir(out_dir)
    if not candidates:
        raise TuningError("give at least one candidate schedule")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise TuningError(f"candidate names repeat: {names!r}")
    runs = [screening_run(run) for run in run_dirs]
    labels = [run_label(run) for run in runs]
    if len(set(labels)) != len(labels):
        raise TuningError(f"two runs share a folder name: {labels!r}")
    base = (settings or evaluate.EvalSettings(quality=False)).for_screening()
    records = []
    for run, label in zip(runs, labels):
        for candidate in candidates:
            run_settings = base.replace(schedule=candidate.schedule)
            path = os.path.join(out_dir, label, f"{candidate.name}.json")
            record = _cached(path, run_settings)
            if record is None:
                log(f"[tune] {label}: {candidate.name} ({_describe(candidate.schedule)})")
                try:
                    record = evaluate.evaluate_path(run, settings=run_settings, log=log)
                except EvaluationError as error:
                    raise TuningError(f"{run!r}, candidate {candidate.name}: {error}") from error
                record = {"run": label, "run_dir": os.path.abspath(run),
                          "candidate": candidate.name, "evaluation": record}
                os.makedirs(os.path.dirname(path), exist_ok=True)
                export.write_json(path, record)
            records.append(record)
    return records


def _describe(schedule: classifiers.Schedule) -> str:
    return (f"{schedule.optimizer} lr {schedule.learning_rate:g}, batch "
            f"{schedule.batch_size}, {schedule.epochs} epochs")


def _cached(path: str, settings: evaluate.EvalSettings) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as stream:
        record = json.load(stream)
    if record["evaluation"]["settings"] != json.loads(json.dumps(settings.to_dict())):
        raise TuningError(f"{path!r} was written with other evaluation settings; give "
                          "another --out or remove it")
    return record


def summarise(records: Sequence[dict], candidates: Sequence[Candidate]) -> dict:
    """Per candidate (in the given order): the ``val`` and ``sen`` of each run, their
    means and sds, the epochs ``val`` chose; and the choice (:func:`choose`)."""
    rows = []
    for candidate in candidates:
        mine = [r for r in records if r["candidate"] == candidate.name]
        val = [r["evaluation"]["protocols"]["val"]["accuracy"] for r in mine]
        sen = [r["evaluation"]["protocols"]["sen"]["accuracy"] for r in mine]
        _, val_mean, val_sd = reporting.mean_sd(val)
        _, sen_mean, sen_sd = reporting.mean_sd(sen)
        rows.append({
            "candidate": candidate.name, "schedule": candidate.schedule.to_dict(),
            "runs": [r["run"] for r in mine], "val": val, "sen": sen,
            "val_epochs": [r["evaluation"]["protocols"]["val"]["epoch"] for r in mine],
            "val_mean": val_mean, "val_sd": val_sd, "sen_mean": sen_mean, "sen_sd": sen_sd,
        })
    samples = sorted({r["evaluation"]["input"]["samples"] for r in records
                      if "input" in r["evaluation"]})
    return {"criterion": CRITERION, "scored_on": evaluate.TUNING_HOLDOUT, "rows": rows,
            "samples_per_run": samples, "chosen": choose(rows)}


def choose(rows: Sequence[dict]) -> str:
    """The candidate with the highest mean ``val`` over the same runs; the earlier on a
    tie. Every candidate must cover the same runs (else the means are not comparable)."""
    if not rows:
        raise TuningError("no candidates to choose from")
    runs = [sorted(row["runs"]) for row in rows]
    if any(r != runs[0] for r in runs) or not runs[0]:
        raise TuningError("candidates were evaluated on different runs ("
                          + "; ".join(f"{row['candidate']}: {row['runs']}" for row in rows)
                          + "); evaluate every candidate on every run")
    best = rows[0]
    for row in rows[1:]:
        if row["val_mean"] > best["val_mean"]:
            best = row
    return best["candidate"]


def render(summary: dict) -> str:
    """The markdown table of a summary (generated; nothing typed in by hand)."""
    lines = [
        "# The downstream classifier's schedule, chosen on the tuning split",
        "",
        "Generated by `scripts/tune_classifier.py` from the records beside this file. Each "
        "candidate schedule trained the authors' classifier on every screening run's "
        "samples (runs trained on the tuning split); accuracies are on the tuning "
        "holdout (2,000 real records no run trained on), never on the test set or the "
        "private records. `val` chooses the epoch on held-out synthetic samples; `sen` is "
        "the best holdout accuracy over epochs (selects on what it reports; for "
        "comparison only). The chosen schedule is the highest mean `val`.",
        "",
        f"Samples per run: {', '.join(str(n) for n in summary.get('samples_per_run', []))} "
        "(a choice holds for this many: evaluate a larger run with `--max_samples` set to "
        "it to keep the classifier's steps the same).",
        "",
        "| candidate | schedule | `val` (mean +- sd) | `sen` (mean +- sd) | epochs `val` chose | runs |",
        "|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        mark = " (chosen)" if row["candidate"] == summary["chosen"] else ""
        schedule = classifiers.Schedule(**row["schedule"])
        lines.append(
            f"| {row['candidate']}{mark} | {_describe(schedule)} | "
            f"{reporting.mean_sd_cell(row['val'], 3)} | {reporting.mean_sd_cell(row['sen'], 3)}"
            f" | {', '.join(str(e) for e in row['val_epochs'])} | {len(row['runs'])} |")
    lines += ["", "Per run (`val`):", "",
              "| run | " + " | ".join(r["candidate"] for r in summary["rows"]) + " |",
              "|---|" + "---|" * len(summary["rows"])]
    runs = summary["rows"][0]["runs"]
    for run in runs:
        cells = []
        for row in summary["rows"]:
            cells.append(f"{row['val'][row['runs'].index(run)]:.3f}")
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def check_out_dir(out_dir: str) -> None:
    """Refuses an ``out_dir`` holding a README.md that is not a choice's own (no
    summary.json beside it): :func:`write_summary` would overwrite a file it did not
    write."""
    readme = os.path.join(out_dir, "README.md")
    if os.path.exists(readme) and not os.path.exists(os.path.join(out_dir, "summary.json")):
        raise TuningError(f"{readme!r} exists and was not written by a classifier choice "
                          "(no summary.json beside it); give an empty or new --out folder")


def write_summary(summary: dict, out_dir: str) -> None:
    """``summary.json`` and ``README.md`` in ``out_dir`` (atomically)."""
    os.makedirs(out_dir, exist_ok=True)
    export.write_json(os.path.join(out_dir, "summary.json"), summary)
    markdown = render(summary)
    export.atomic_write(os.path.join(out_dir, "README.md"),
                        lambda out: out.write(markdown), mode="w")
