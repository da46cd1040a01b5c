"""``results/beyond/README.md``: DataLens beyond the paper, generated from the reports.

Five parts, each read from files the runs wrote (nothing typed in by hand):

1. the faithful reproduction at the paper scale (the Table 1 reports of the index
   partition under ``results/``: :func:`dclens.experiments.table1.collect`), the baseline;
2. tuned configurations at the paper scale: every ``report.json`` under
   ``results/beyond/paper-scale/<run>/``, grouped into rows by the run's options without
   its seed (mean +- sd over runs);
3. the screen: every levers table (``table.json`` of ``scripts/tables.py --table levers``)
   under ``results/beyond/``, one row per lever with its change against the table's
   first row (the paper's settings);
4. DP-MERF at the paper scale (``merf/<run>/evaluation.json`` and ``privacy.json``) and
   its screen rows (``rescored/<group>/summary.json`` of :data:`MERF_SCREEN_GROUPS`);
5. the downstream classifier's schedule: every ``summary.json`` of
   ``scripts/tune_classifier.py`` under ``results/beyond/classifier/`` (candidates scored
   on screening runs' samples, the chosen one marked).

The screen also shows each lever's ``val`` under the classifier schedule the paper-scale
rows are scored with (:func:`rescoring_rate`), where its runs' samples were scored so
(:func:`rescored_val`: ``scripts/tune_classifier.py`` records under ``classifier/`` or
``rescored/``): with that schedule ``val`` varies far less between seeds than with the
default, so smaller differences between levers show.

Each row says its epsilon, accountant (the conversion), evaluation protocol and records.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re

from dclens.common import export, reporting
from dclens.evaluation import classifiers
from dclens.experiments import table1
from dclens.experiments.paper_rows import ReproduceOptions

#: Issue 39's goals: honest ``val`` at epsilon 1 and 10 (mean of >= 3 runs).
GOALS = {1: 0.65, 10: 0.75}
MIN_RUNS = 3
PAPER_SCALE_DIR = "paper-scale"
CLASSIFIER_DIR = "classifier"
#: Screening runs' samples scored again with the paper-scale rows' classifier schedule
#: (``scripts/tune_classifier.py RUN... --learning_rates R --out results/beyond/rescored/G``).
RESCORED_DIR = "rescored"


def _read(path: str) -> dict:
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)


def faithful_rows(results_dir: str) -> list[dict]:
    """The Table 1 rows of the index partition (dclens' default), the baseline."""
    rows = table1.summarise(table1.collect(results_dir))
    return [row for row in rows if row["partition"] == "index"
            and row["fake_rendering"] == "class_grid"]


def _evaluated_with(report: dict) -> str:
    """How a report's samples were scored, where it is not the default classifier
    schedule (e.g. `` (classifier learning rate 0.0001, 20000 samples)``): part of a tuned row's
    name, since the schedule is part of the tuned configuration."""
    settings = report["evaluation"]["settings"]
    schedule = settings.get("schedule", {})
    default = classifiers.DEFAULT_SCHEDULE.to_dict()
    changed = [f"{name.replace('_', ' ')} "
               f"{format(value, 'g') if isinstance(value, float) else value}"
               for name, value in sorted(schedule.items()) if value != default.get(name)]
    parts = [f"classifier {', '.join(changed)}"] if changed else []
    if settings.get("max_samples") is not None:
        parts.append(f"{settings['max_samples']} samples")
    return f" ({', '.join(parts)})" if parts else ""


def configuration_name(report: dict) -> str:
    """A paper-scale run's configuration: its options without the seed, and the
    classifier schedule that scored it (``fashion_mnist-eps1-private (classifier learning
    rate 3e-05, 20000 samples)``); runs of one name form one row."""
    options = ReproduceOptions(**{**report["options"], "seed": None})
    return options.default_name() + _evaluated_with(report)


def tuned_runs(beyond_dir: str) -> list[table1.RunFacts]:
    """Every paper-scale run under ``beyond_dir/paper-scale/`` (folder order), its
    :attr:`~dclens.experiments.table1.RunFacts.configuration` set to its name.

    Raises:
      table1.ReportError: a report cannot be read (named).
    """
    runs = []
    for path in sorted(glob.glob(os.path.join(beyond_dir, PAPER_SCALE_DIR, "*",
                                              "report.json"))):
        facts = table1.read_report(path)
        try:
            name = configuration_name(_read(path))
        except (KeyError, TypeError) as error:
            raise table1.ReportError(table1.unreadable_message(path, f"no {error}")) from error
        runs.append(dataclasses.replace(facts, configuration=name))
    return runs


def tuned_rows(beyond_dir: str) -> list[dict]:
    """Paper-scale runs of tuned configurations, grouped by their options but the seed
    and by the classifier schedule that scored them."""
    groups: dict[str, list[table1.RunFacts]] = {}
    reports: dict[str, list[dict]] = {}
    for facts in tuned_runs(beyond_dir):
        groups.setdefault(facts.configuration, []).append(facts)
        reports.setdefault(facts.configuration, []).append(_read(os.path.join(
            beyond_dir, PAPER_SCALE_DIR, facts.name, "report.json")))
    rows = []
    for name, facts in sorted(groups.items()):
        report = reports[name][0]
        rows.append({
            "name": name, "dataset": report["dataset"], "eps": report["eps"],
            "runs": [f.name for f in facts],
            "val": reporting.mean_sd(f.accuracy.get("val") for f in facts),
            "sen": reporting.mean_sd(f.accuracy.get("sen") for f in facts),
            "label_agreement": reporting.mean_sd(f.label_agreement for f in facts
                                                 if f.label_agreement is not None),
            "epsilon": max(f.epsilon for f in facts if f.epsilon is not None),
            "conversion": report["config"]["budget"]["conversion"],
            "records": report["config"]["train"].get("training_records", "all"),
            "deviations": group_deviations([f.name for f in facts],
                                           [r["deviations"] for r in reports[name]])})
    return rows


def group_deviations(runs: list[str], deviations: list[list[str]]) -> list[str]:
    """The deviations of a group of runs: each shared by every run once, in order; one
    that only some runs have (e.g. the warm start's DP-MERF folder, one per seed) with the
    runs it belongs to in brackets."""
    owners: dict[str, list[str]] = {}
    for run, texts in zip(runs, deviations):
        for text in texts:
            owners.setdefault(text, []).append(run)
    return [text if len(held) == len(runs) else f"{text} ({', '.join(held)})"
            for text, held in owners.items()]


def rescoring_rate(beyond_dir: str) -> float | None:
    """The classifier learning rate every paper-scale tuned run was scored with, if they
    share one that is not the default schedule's; else None (nothing to rescore with)."""
    rates = set()
    for path in glob.glob(os.path.join(beyond_dir, PAPER_SCALE_DIR, "*", "report.json")):
        schedule = _read(path)["evaluation"]["settings"].get("schedule", {})
        rates.add(schedule.get("learning_rate", classifiers.DEFAULT_SCHEDULE.learning_rate))
    if len(rates) != 1:
        return None
    rate = rates.pop()
    return None if rate == classifiers.DEFAULT_SCHEDULE.learning_rate else float(rate)


def rescored_records(beyond_dir: str, rate: float) -> dict[str, float]:
    """Run name -> ``val`` of every run whose samples ``scripts/tune_classifier.py`` scored
    with learning rate ``rate`` (its ``lr<rate>.json`` records under ``classifier/*/`` or
    ``rescored/*/``; a run scored in several sets counts once, the first in path order)."""
    values: dict[str, float] = {}
    for folder in (CLASSIFIER_DIR, RESCORED_DIR):
        for path in sorted(glob.glob(os.path.join(beyond_dir, folder, "*", "*",
                                                  f"lr{rate:g}.json"))):
            run = os.path.basename(os.path.dirname(path))
            if run not in values:
                values[run] = _read(path)["evaluation"]["protocols"]["val"]["accuracy"]
    return values


def _row_val(records: dict[str, float], name: str) -> tuple[int, float | None, float | None]:
    """(runs, mean, sd) of ``records``' ``val`` over the levers row ``name``'s runs: ``name``
    and its ``-rep<r>`` repeats."""
    run_pattern = re.compile(re.escape(name) + r"(-rep\d+)?")
    return reporting.mean_sd(val for run, val in records.items() if run_pattern.fullmatch(run))


def rescored_val(beyond_dir: str, name: str, rate: float) -> tuple[int, float | None,
                                                                   float | None]:
    """(runs, mean, sd) of ``val`` over the runs of the levers row ``name`` (``name`` and
    its ``-rep<r>`` repeats) rescored at ``rate`` (:func:`rescored_records`)."""
    return _row_val(rescored_records(beyond_dir, rate), name)


def lever_tables(beyond_dir: str) -> list[dict]:
    """Every levers table under ``beyond_dir`` (its table.json), by folder name."""
    found = []
    for path in sorted(glob.glob(os.path.join(beyond_dir, "*", "table.json"))):
        table = _read(path)
        if table.get("table") == "levers":
            found.append({"folder": os.path.basename(os.path.dirname(path)), **table})
    return found


def classifier_choices(beyond_dir: str) -> list[dict]:
    """Every ``scripts/tune_classifier.py`` summary under ``beyond_dir/classifier/``."""
    return [{"folder": os.path.basename(os.path.dirname(path)), **_read(path)}
            for path in sorted(glob.glob(os.path.join(beyond_dir, CLASSIFIER_DIR, "*",
                                                      "summary.json")))]


#: Classifier epochs shown in the screen's accuracy-by-epoch line.
PROFILE_EPOCHS = (1, 2, 5, 10, 20)


def screen_epoch_profile(beyond_dir: str) -> dict | None:
    """Over every screening report under ``beyond_dir/levers-*/``: the mean holdout
    accuracy after each classifier epoch, the mean ``val``, and the range of the last
    epoch's held-out synthetic accuracy (None without reports)."""
    curves, vals, synthetic = [], [], []
    for path in sorted(glob.glob(os.path.join(beyond_dir, "levers-*", "*", "report.json"))):
        evaluation = _read(path)["evaluation"]
        curves.append(evaluation["curves"]["test_accuracy"])
        synthetic.append(evaluation["curves"]["val_accuracy"][-1])
        vals.append(evaluation["protocols"]["val"]["accuracy"])
    epochs = min((len(c) for c in curves), default=0)
    if not epochs:
        return None
    return {"runs": len(curves), "val_mean": sum(vals) / len(vals),
            "synthetic_last": (min(synthetic), max(synthetic)),
            "by_epoch": {e: sum(c[e - 1] for c in curves) / len(curves)
                         for e in PROFILE_EPOCHS if e <= epochs}}


def _classifier_lines(beyond_dir: str) -> list[str]:
    choices = classifier_choices(beyond_dir)
    if not choices:
        return []
    lines = ["## The downstream classifier's schedule (post-processing, tuning split)", ""]
    profile = screen_epoch_profile(beyond_dir)
    if profile is not None:
        by_epoch = ", ".join(f"{accuracy:.3f} after epoch {epoch}"
                             for epoch, accuracy in profile["by_epoch"].items())
        low, high = profile["synthetic_last"]
        lines += [f"Over the {profile['runs']} screening runs above, the classifier that "
                  f"scores the samples (default schedule) reaches on average {by_epoch} on "
                  f"the tuning holdout, while its accuracy on held-out synthetic samples "
                  f"ends at {low:.2f}-{high:.2f}; their mean `val` is "
                  f"{profile['val_mean']:.3f}. It learns the generator's artefacts after "
                  "the samples' real structure, and `val`, choosing by synthetic samples, "
                  "reports a late epoch.", ""]
    lines += ["The classifier's learning rate is post-processing of the released samples, "
              "chosen here on screening runs only (`scripts/tune_classifier.py`; scored on "
              "the tuning holdout) and then used unchanged; a choice made on one group of "
              "runs is checked on another.", ""]
    for choice in choices:
        folder = f"{CLASSIFIER_DIR}/{choice['folder']}"
        runs = choice["rows"][0]["runs"] if choice["rows"] else []
        lines += [f"`{folder}` ([table](./{folder}/README.md), {len(runs)} runs: "
                  f"{', '.join(f'`{run}`' for run in runs)}):", "",
                  "| learning rate | `val` | `sen` | chosen |", "|---|---|---|---|"]
        for row in choice["rows"]:
            lines.append(
                f"| {row['schedule']['learning_rate']:g} | "
                f"{_stat(reporting.mean_sd(row['val']), 3)} | "
                f"{_stat(reporting.mean_sd(row['sen']), 3)} | "
                f"{'yes' if row['candidate'] == choice['chosen'] else ''} |")
        lines.append("")
    return lines


#: Where DP-MERF's paper-scale evaluations go (``merf/<run>/evaluation.json`` beside the
#: run's ``privacy.json``), and the screen's rescored groups of the DP-MERF rows, in order.
MERF_DIR = "merf"
MERF_SCREEN_GROUPS = {
    "merf-alone": "DP-MERF alone, the whole budget (one release, z = 3.73)",
    "merf-share0.2": "DP-MERF alone with a fifth of the budget's mu^2 (z = 8.34)",
    "warm-start": "DataLens warm-started from that fifth (pld; TopAgg gets the other four "
                  "fifths: 119 steps)",
}


#: DP-MERF's name in the rows it shares with DataLens (results/README.md's table).
MERF_METHOD = "DP-MERF"


def merf_runs(beyond_dir: str) -> list[table1.RunFacts]:
    """DP-MERF's paper-scale runs (``merf/<run>/evaluation.json`` beside the run's
    ``privacy.json`` and ``config.json``), in folder order, as Table 1's runs: their
    :attr:`~dclens.experiments.table1.RunFacts.configuration` is the run's name without
    its ``-seed<N>``, their epsilon the release's and their "steps" its releases.

    Raises:
      table1.ReportError: a record cannot be read or lacks a field (named).
    """
    return [facts for facts, _ in _merf_records(beyond_dir)]


def _merf_records(beyond_dir: str) -> list[tuple[table1.RunFacts, dict]]:
    """(facts, privacy.json) of every DP-MERF paper-scale run, in folder order."""
    runs = []
    for path in sorted(glob.glob(os.path.join(beyond_dir, MERF_DIR, "*", "evaluation.json"))):
        folder = os.path.dirname(path)
        try:
            privacy = _read(os.path.join(folder, "privacy.json"))
            runs.append((_merf_facts(folder, _read(path), privacy), privacy))
        except (OSError, ValueError, KeyError, TypeError) as error:
            problem = f"no {error}" if isinstance(error, KeyError) else str(error)
            raise table1.ReportError(
                f"{folder} is not a readable DP-MERF record ({problem}); restore its "
                "evaluation.json and privacy.json from the run (scripts/merf.py, "
                "scripts/evaluate.py), or move the folder out of results/beyond/merf") from error
    return runs


def _merf_facts(folder: str, evaluation: dict, privacy: dict) -> table1.RunFacts:
    name = os.path.basename(folder)
    configuration = re.sub(r"-seed\d+$", "", name)
    config_path = os.path.join(folder, "config.json")
    config = _read(config_path) if os.path.exists(config_path) else {}
    budget = re.search(r"-eps(\d+)-", configuration)
    quality = evaluation.get("quality") or {}
    per_class = quality.get("per_class") or {}
    curve = evaluation.get("curves") or {}
    curves = ({"val": {"epoch": curve["epoch"], "test": curve["test_accuracy"],
                       "chosen": evaluation["protocols"]["val"]["epoch"]}}
              if curve.get("epoch") else {})
    provenance = config.get("provenance") or {}
    commit = (provenance.get("git") or {}).get("commit") or "unknown"
    return table1.RunFacts(
        name=name, dataset=evaluation.get("dataset") or config.get("config", {}).get(
            "dataset", "fashion_mnist"),
        eps=(int(budget.group(1)) if budget
             else round(privacy["epsilon"]["epsilon"])),
        paper=None,
        accuracy={"val": evaluation["protocols"]["val"]["accuracy"],
                  "sen": evaluation["protocols"]["sen"]["accuracy"]},
        unfinished={}, epsilon=privacy["epsilon"]["epsilon"],
        steps=privacy.get("releases", 1), commit=commit[:7],
        cpu=table1.cpu_label(provenance.get("machine")),
        generator_init="independent seed per layer", partition="--", fake_rendering="--",
        curves=curves, fid=quality.get("fid"), label_agreement=quality.get("label_agreement"),
        intra_fid=per_class.get("intra_fid"), spread_ratio=per_class.get("spread_ratio"),
        configuration=configuration, method=MERF_METHOD)


def merf_rows(beyond_dir: str) -> list[dict]:
    """DP-MERF's paper-scale runs (:func:`merf_runs`) grouped by their configuration:
    mean +- sd of ``val``, ``sen``, label agreement and FID."""
    groups: dict[str, list[tuple[table1.RunFacts, dict]]] = {}
    for facts, privacy in _merf_records(beyond_dir):
        groups.setdefault(facts.configuration, []).append((facts, privacy))
    rows = []
    for name, runs in groups.items():
        facts = [run for run, _ in runs]
        rows.append({
            "name": name, "runs": len(runs), "eps": facts[0].eps,
            "val": reporting.mean_sd(f.accuracy["val"] for f in facts),
            "sen": reporting.mean_sd(f.accuracy["sen"] for f in facts),
            "label_agreement": reporting.mean_sd(f.label_agreement for f in facts
                                                 if f.label_agreement is not None),
            "fid": reporting.mean_sd(f.fid for f in facts if f.fid is not None),
            "epsilon": max(f.epsilon for f in facts),
            "conversion": runs[0][1]["conversion"],
            "records": runs[0][1]["training_records"]})
    return rows


def merf_screen_rows(beyond_dir: str, rate: float) -> list[tuple[str, tuple]]:
    """(label, ``val`` mean +- sd) of each DP-MERF screen group rescored at ``rate``."""
    rows = []
    for group, label in MERF_SCREEN_GROUPS.items():
        path = os.path.join(beyond_dir, RESCORED_DIR, group, "summary.json")
        if not os.path.exists(path):
            continue
        for row in _read(path)["rows"]:
            if math.isclose(row["schedule"]["learning_rate"], rate):
                rows.append((label, reporting.mean_sd(row["val"])))
    return rows


def _merf_lines(beyond_dir: str, rate: float | None) -> list[str]:
    paper_scale = merf_rows(beyond_dir)
    screen = [] if rate is None else merf_screen_rows(beyond_dir, rate)
    if not paper_scale and not screen:
        return []
    lines = ["## DP-MERF: alone, and as DataLens' warm start", "",
             "One Gaussian release of the records' class-conditional mean embedding in "
             "random Fourier features (sensitivity 2 for replacing one record), and "
             "DataLens' generator fitted to it ([docs/merf.md](../../docs/merf.md), "
             f"[merf/README.md](./{MERF_DIR}/README.md)); its settings were fixed before "
             "any run, and only the tuning split was looked at before the private runs. "
             "Scored like the rows above (`val`, classifier lr "
             f"{rate if rate is not None else 'default'}, 20,000 samples)."]
    if paper_scale:
        lines += ["", "| configuration | runs | `val` | `sen` | label agreement | FID | "
                  "epsilon | accountant | records |", "|---|---|---|---|---|---|---|---|---|"]
        for row in paper_scale:
            lines.append(f"| `{row['name']}` | {row['runs']} | {_stat(row['val'])} | "
                         f"{_stat(row['sen'])} | {_stat(row['label_agreement'], 3)} | "
                         f"{_stat(row['fid'], 1)} | {_cell(row['epsilon'], 3)} | "
                         f"{row['conversion']} | {row['records']} |")
    if screen:
        lines += ["", "At the screen (noise-matched 200-teacher scale, tuning split; the "
                  "DP-MERF release's noise x 0.05 like TopAgg's, so its mean embedding is "
                  "as noisy as on 60,000 records; against the paper's settings' row above):",
                  "", "| screen row | `val` |", "|---|---|"]
        lines += [f"| {label} | {_stat(stat, 3)} |" for label, stat in screen]
    return lines + [""]


def _stat(stat: tuple[int, float | None, float | None], digits: int = 4) -> str:
    n, mean, sd = stat
    if n == 0 or mean is None:
        return "--"
    if n == 1:
        return f"{mean:.{digits}f} (1 run)"
    return f"{mean:.{digits}f} +- {sd:.{digits}f} ({n} runs)"


def _triple(stat: dict) -> tuple[int, float | None, float | None]:
    return stat["n"], stat["mean"], stat["sd"]


def _cell(value, digits: int = 4, signed: bool = False) -> str:
    if value is None:
        return "--"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _row_conversion(row: dict) -> str:
    return row["changes"].get("conversion") or "classic"


def render(results_dir: str, beyond_dir: str) -> str:
    """The README's Markdown."""
    lines = ["# DataLens beyond the paper", "",
             "Generated by `python scripts/tables.py --table levers ...` from the reports "
             "below it (`dclens.experiments.beyond`); do not edit by hand.", "",
             f"Goal (issue 39): at epsilon = 1, delta = 1e-5, proven accounting (index "
             f"partition), honest `val` >= {GOALS[1]} as the mean of >= {MIN_RUNS} runs; at "
             f"epsilon = 10, >= {GOALS[10]}. `val` chooses the classifier's epoch on held-out "
             "*synthetic* data (no test-set selection); `sen` is the best test accuracy over "
             "the classifier's epochs (the authors' selection), shown for comparison only.",
             "",
             "**Tuning split.** Hyper-parameters are chosen only on the levers tables "
             "below, which train on the tuning split (the last 10,000 Fashion-MNIST training "
             "records but their last 2,000) and are scored on those 2,000 (the tuning "
             "holdout), never on the test set. A tuned configuration's private runs train on "
             "the other 50,000 records (`--training_records private`), so the choice looked "
             "at nothing they protect.", "",
             "## At the paper scale", "",
             "| configuration | eps | runs | `val` | `sen` | label agreement | epsilon | "
             "accountant | records |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in faithful_rows(results_dir):
        protocols, quality = row["protocols"], row["quality"]
        lines.append(
            f"| faithful reproduction (paper's settings) | {row['eps']} | "
            f"{len(row['runs'])} | {_stat(_triple(protocols['val']))} | "
            f"{_stat(_triple(protocols['sen']))} | "
            f"{_stat(_triple(quality['label_agreement']), 3)} | "
            f"{_cell(row['epsilon'], 3)} | classic | all 60,000 |")
    tuned = tuned_rows(beyond_dir)
    for row in tuned:
        lines.append(f"| `{row['name']}` | {row['eps']} | {len(row['runs'])} | "
                     f"{_stat(row['val'])} | {_stat(row['sen'])} | "
                     f"{_stat(row['label_agreement'], 3)} | {_cell(row['epsilon'], 3)} | "
                     f"{row['conversion']} | {row['records']} |")
    for row in merf_rows(beyond_dir):
        lines.append(f"| DP-MERF alone (`{row['name']}`, [below](#dp-merf-alone-and-as-"
                     f"datalens-warm-start)) | {row['eps'] or '--'} | {row['runs']} | "
                     f"{_stat(row['val'])} | {_stat(row['sen'])} | "
                     f"{_stat(row['label_agreement'], 3)} | {_cell(row['epsilon'], 3)} | "
                     f"{row['conversion']} | {row['records']} |")
    if not tuned:
        lines += ["", "No tuned configuration has run at the paper scale yet (its runs go "
                  f"to `results/beyond/{PAPER_SCALE_DIR}/<run>/` with "
                  "`python scripts/reproduce.py ... --training_records private --out "
                  f"results/beyond/{PAPER_SCALE_DIR}/<run>`)."]
    for row in tuned:
        lines += ["", f"* `{row['name']}` ({', '.join(row['runs'])}): "
                  + "; ".join(row["deviations"])]
    lines += ["", "## The screen (reduced scale, tuning split)", ""]
    tables = lever_tables(beyond_dir)
    if not tables:
        lines.append("No levers table has run yet.")
    rate = rescoring_rate(beyond_dir)
    records = {} if rate is None else rescored_records(beyond_dir, rate)
    for table in tables:
        rows = table["rows"]
        base = rows[0]["val"] if rows and rows[0]["status"] == "finished" else None
        rescored = {row["name"]: stat for row in rows if "name" in row
                    for stat in (_row_val(records, row["name"]),) if stat[0]}
        lines += [f"`{table['folder']}` ([table](./{table['folder']}/table.md)): scored "
                  "on the tuning holdout; a row of several runs shows their mean +- sd. "
                  "The first row is the paper's settings at this scale; the change (of the "
                  "means) is against it. One run's `val` moves "
                  "by about 0.07 (sd) between seeds at this kind of scale (the whole-run "
                  "study, `results/side-by-side/whole-runs/`), so single-run differences "
                  "below ~0.15 are not evidence. At a noise-matched reduced scale the "
                  "epsilons are not the paper's (the table says which scale): each row is "
                  "the small model of its configuration at the paper's epsilon = 1, so a row "
                  "accounted by pld runs the steps pld allows the paper config (149, not "
                  "86) and shows the larger epsilon those cost here."]
        rescored_head = rescored_rule = ""
        if rescored:
            lines[-1] += (f" `val`, classifier lr {rate:g}: the same runs' samples scored "
                          f"with the classifier learning rate the paper-scale rows use, "
                          f"where they were (`scripts/tune_classifier.py RUN... "
                          f"--learning_rates {rate:g} --out results/beyond/{RESCORED_DIR}/"
                          f"<group>`); its spread between seeds is far smaller than the "
                          f"default's.")
            rescored_head, rescored_rule = f" `val`, classifier lr {rate:g} |", "---|"
        lines += ["", "| lever | `val` | change |" + rescored_head + " `sen` | label "
                  "agreement | epsilon | steps | accountant |",
                  "|---|---|---|" + rescored_rule + "---|---|---|---|---|"]
        for row in rows:
            rescored_cell = (f" {_stat(rescored.get(row.get('name'), (0, None, None)), 3)} |"
                             if rescored else "")
            if row["status"] != "finished":
                lines.append(f"| {row['row']} | not run | -- |{rescored_cell} -- | -- | -- | "
                             f"-- | {_row_conversion(row)} |")
                continue
            change = None if base is None else row["val"] - base
            runs = row.get("runs", 1)
            val = (_stat((runs, row["val"], row.get("val_sd"))) if runs > 1
                   else _cell(row["val"]))
            lines.append(f"| {row['row']} | {val} | "
                         f"{_cell(change, signed=True)} |{rescored_cell} {_cell(row['sen'])} | "
                         f"{_cell(row.get('label_agreement'), 3)} | "
                         f"{_cell(row['epsilon'])} | {row['steps']} | "
                         f"{_row_conversion(row)} |")
        lines.append("")
    lines += _merf_lines(beyond_dir, rate)
    lines += _classifier_lines(beyond_dir)
    return "\n".join(lines).rstrip() + "\n"


def write_readme(beyond_dir: str, results_dir: str = "results") -> str:
    """Writes ``beyond_dir/README.md`` (atomically); returns its path."""
    path = os.path.join(beyond_dir, "README.md")
    text = render(results_dir, beyond_dir)
    export.atomic_write(path, lambda stream: stream.write(text), mode="w")
    return path

