"""The paper's analysis tables (4-7) as rows of :func:`dclens.experiments.reproduce.reproduce`.

Every row of a table runs at one shared scale (teachers, epochs cap, samples), differing
from the Table 1 config only by what the paper's row changes (aggregation, beta, top-k,
teachers), so the comparison is fair; the report puts the paper's number beside ours.

Paper values (Wang et al., DataLens, CCS 2021; its Tables 4, 5 and 7):
accuracy at epsilon = 1, delta = 1e-5.  Table 6 is the time per epoch of Table 5's rows
(the paper's on one Tesla T4; ours on this machine's CPU).

Rows run one after the other; each is an ordinary reproduction (resumable: a row whose
report exists is read back, an unfinished run is resumed), so a table may take several
sessions at the paper scale. A row run for one table counts for every table that has it
(rows are named by their options), ``only`` runs some rows and leaves the others, and the
table files are rewritten after every row with the rows not yet run marked so.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Collection

from dclens.data import splits
from dclens.datalens import config as cfg
from dclens.common import export, reporting
from dclens.experiments import reproduce
from dclens.experiments import paper_rows


@dataclasses.dataclass(frozen=True)
class Row:
    """One row: its label, the options it changes, the paper's value per dataset."""

    label: str
    changes: dict
    paper: dict[str, float]
    paper_seconds_per_epoch: dict[str, float] | None = None


def _row(label, paper, paper_seconds=None, **changes) -> Row:
    return Row(label, changes, paper, paper_seconds)


TABLES: dict[str, tuple[str, list[Row]]] = {
    "7": ("Table 7: ablation of TopAgg's components (epsilon = 1)", [
        _row("full TopAgg", {"mnist": 0.7123, "fashion_mnist": 0.6478,
                             "celebA-gender": 0.7058}),
        _row("- top-k (all D coordinates vote)", {"mnist": 0.5170, "fashion_mnist": 0.4775,
                                                  "celebA-gender": 0.6134},
             aggregation="no_topk"),
        _row("- stochastic quantisation (deterministic sign)",
             {"mnist": 0.6741, "fashion_mnist": 0.6159, "celebA-gender": 0.6889},
             aggregation="topk_sign"),
        _row("- threshold (beta = 0)", {"mnist": 0.6361, "fashion_mnist": 0.5859,
                                        "celebA-gender": 0.6860}, thresh=0.0),
    ]),
    "5": ("Tables 5-6: TopAgg vs D2P-Fed vs FetchSGD (epsilon = 1; seconds per epoch)", [
        _row("TopAgg", {"mnist": 0.7123, "fashion_mnist": 0.6478, "celebA-gender": 0.7058},
             {"mnist": 338.34, "fashion_mnist": 340.84, "celebA-gender": 1196.60}),
        _row("D2P-Fed (klevel, L = 4)", {"mnist": 0.1424, "fashion_mnist": 0.1667,
                                         "celebA-gender": 0.4445},
             {"mnist": 492.43, "fashion_mnist": 471.02, "celebA-gender": 3683.22},
             aggregation="klevel"),
        _row("FetchSGD (proven accounting)", {"mnist": 0.6935, "fashion_mnist": 0.6387,
                                              "celebA-gender": 0.6552},
             {"mnist": 785.34, "fashion_mnist": 775.35, "celebA-gender": 2622.40},
             aggregation="fetchsgd"),
    ]),
    "4k": ("Table 4(a): top-k (epsilon = 1)", [
        _row(f"top-k = {k}", {"mnist": m, "fashion_mnist": f}, topk=k)
        for k, m, f in ((100, 0.5889, 0.5738), (200, 0.7123, 0.6478), (300, 0.6753, 0.6088))
    ]),
    "4t": ("Table 4(a): number of teachers (epsilon = 1)", [
        _row(f"{n} teachers", {"mnist": m, "fashion_mnist": f}, teachers=n)
        for n, m, f in ((2000, 0.5841, 0.5608), (3000, 0.7061, 0.5952), (4000, 0.7123, 0.6478))
    ]),
    "4b": ("Table 4(a): threshold beta (epsilon = 1)", [
        _row(f"beta = {b:g}", {"mnist": m, "fashion_mnist": f}, thresh=b)
        for b, m, f in ((0.0, 0.6361, 0.5859), (0.1, 0.6450, 0.6103), (0.3, 0.6890, 0.6060),
                        (0.5, 0.6921, 0.6122), (0.7, 0.7123, 0.6213), (0.9, 0.6956, 0.6478))
    ]),
    "levers": ("Beyond the paper: levers screened on the tuning split", [
        _row("the paper's settings", {}),
        _row("exact accounting (pld: the steps it allows the paper config)", {},
             conversion="pld"),
        _row("generator average (EMA 0.9)", {}, generator_ema=0.9),
        _row("generator average (EMA 0.97)", {}, generator_ema=0.97),
        _row("exact accounting + generator average (EMA 0.97)", {}, conversion="pld",
             generator_ema=0.97),
        _row("top-k = 300 (k of the trade-off at equal epsilon)", {}, topk=300),
        _row("beta = 0.5 (a lower vote threshold)", {}, thresh=0.5),
        _row("learning rate 5e-4 (teachers, generator, voted step)", {},
             learning_rate=5e-4),
        _row("learning rate 2e-3 (teachers, generator, voted step)", {},
             learning_rate=2e-3),
        _row("class guidance 1 (each teacher's vote also descends its label "
             "cross-entropy)", {}, class_guidance=1.0),
        _row("class guidance 10", {}, class_guidance=10.0),
        _row("class guidance 1, margin form (the teachers' terms add up to their summed "
             "logits' margin)", {}, class_guidance=1.0, class_guidance_form="margin"),
        _row("matching-aware teachers (5 of 15 fake slots: the teacher's own records "
             "under a wrong label)", {}, mismatch_negatives=5),
        _row("matching-aware teachers, 10 of 15 fake slots", {}, mismatch_negatives=10),
        _row("matching-aware teachers + class guidance 1, margin form", {},
             mismatch_negatives=5, class_guidance=1.0, class_guidance_form="margin"),
        _row("sigma x 1.5 (more, noisier steps at equal epsilon)", {}, sigma_factor=1.5),
        _row("sigma x 2 (4x the steps at equal epsilon)", {}, sigma_factor=2.0),
        _row("sigma x 0.7 (fewer, less noisy steps at equal epsilon)", {}, sigma_factor=0.7),
        _row("batch 5 (a third of the queries per step: 3x the steps at equal epsilon)", {},
             batch_size=5),
        _row("top-k = 500 (k of the trade-off at equal epsilon)", {}, topk=500),
        _row("shared teacher initialisation (every teacher starts from the same weights)",
             {}, shared_teacher_init=True),
        _row("6000 teachers (1.5x the paper's: smaller partitions, a larger vote sum)", {},
             teachers=6000),
        _row("top-k = 300 + sigma x 1.5 (more coordinates voted, and steps back)", {},
             topk=300, sigma_factor=1.5),
        _row("top-k = 500 + sigma x 1.5", {}, topk=500, sigma_factor=1.5),
        _row("top-k = 784 (every coordinate votes) + sigma x 2", {}, topk=784,
             sigma_factor=2.0),
        _row("4 teacher steps per generator step (the paper's 2; privacy-free, 2x the "
             "teachers' compute)", {}, teacher_steps=4),
        _row("generator half as wide (32 filters, 512 dense units; data-independent)", {},
             generator_width=0.5),
        _row("generator twice as wide (128 filters, 2048 dense units)", {},
             generator_width=2.0),
        _row("5 queries per round (a third of the batch; the teachers keep their 15: 3x the "
             "steps at equal epsilon)", {}, query_batch=5),
        _row("teachers half as wide (16 filters, 128 dense units; data-independent)", {},
             teacher_width=0.5),
        _row("teachers twice as wide (64 filters, 512 dense units; 2x the teachers' "
             "compute)", {}, teacher_width=2.0),
        _row("2000 teachers (half the paper's: partitions twice as large, half the vote "
             "sum at the same noise)", {}, teachers=2000),
        _row("3000 teachers (3/4 of the paper's: larger partitions)", {}, teachers=3000),
        _row("generator with resize-convolutions (nearest-neighbour resize + convolution "
             "instead of transposed convolutions: no checkerboard; data-independent)", {},
             generator_upsampling="resize"),
        _row("generator with 4x4 transposed convolutions (an even overlap: no checkerboard "
             "from the layer, no resize's smoothing; data-independent)", {},
             generator_upsampling="transpose4"),
    ]),
}
TABLE_6 = "5"    # Table 6 is Table 5's rows' time per epoch
#: Tables that choose hyper-parameters: they run on the tuning split only.
SCREENING_TABLES = frozenset({"levers"})


def row_options(base: paper_rows.ReproduceOptions, row: Row) -> paper_rows.ReproduceOptions:
    """The row's options: the shared ones with the row's changes.

    A row that sets its own teacher count (Table 4t: 2000, 3000, 4000 of the paper's 4000)
    gets it in proportion to the shared scale, so a reduced-scale table keeps the paper's
    ratios (at 200 shared teachers: 100, 150, 200); the shared ``sigma_scale`` stays, so
    the rows differ in teachers only, as in the paper.
    """
    changes = dict(row.changes)
    if "teachers" in changes:
        paper = _paper_teachers(base)
        shared = base.resolved_teachers(paper)
        changes["teachers"] = max(1, int(round(changes["teachers"] * shared / paper)))
        changes["scale"] = None
    return dataclasses.replace(base, **changes)


def _paper_teachers(options: paper_rows.ReproduceOptions) -> int:
    return cfg.paper_preset(options.dataset, options.eps).train.num_teachers


def matched_noise(base: paper_rows.ReproduceOptions) -> paper_rows.ReproduceOptions:
    """``base`` with ``sigma_scale`` = its teachers / the paper's: every row keeps the
    paper's noise relative to the vote sum and TopAgg's number of steps, at the larger
    epsilon those steps then cost (:func:`dclens.experiments.paper_rows.matched_budget`, the same for
    every row, as the paper's rows share epsilon = 1).

    At eps = 1 with the paper's sigma a reduced ensemble is swamped by the noise (200
    teachers: val 0.09, chance): every row of an analysis table would tie at chance. A
    noise-matched reduced scale is the small model of the paper run in which the rows'
    differences can show; its epsilon is NOT the paper's.
    """
    paper = _paper_teachers(base)
    teachers = base.resolved_teachers(paper)
    if teachers >= paper:
        raise paper_rows.ReproduceError(
            f"matched noise is for a reduced scale; these options run {teachers} teachers "
            f"(the paper's {paper}): give --teachers N < {paper} or --scale below 1")
    return dataclasses.replace(base, sigma_scale=teachers / paper)


#: Config keys that choose how a run computes or where it reads, not what it computes.
NOT_ALGORITHM = frozenset({"teacher_chunk", "data_dir", "conv_path"})


def _with_defaults(config: dict) -> dict:
    """A report's config with every field it predates at its default (what resuming that
    run reads too), so a field added later with the paper's value as default matches."""
    try:
        return cfg.DataLensConfig.from_dict(config).to_dict()
    except (TypeError, ValueError):
        return config


def check_row_report(report: dict, options: paper_rows.ReproduceOptions, path: str) -> None:
    """Refuses a finished row's report whose training config is not the row's.

    A row's report may come from a run made outside the table (e.g. a Table 1 run copied
    in as Table 7's "full TopAgg" row): it is read back only if every config field
    (budget, mechanism, training; except :data:`NOT_ALGORITHM`) equals the one the row
    would run.
    """
    want = paper_rows.build_config(options)[0].to_dict()
    have = _with_defaults(report.get("config") or {})
    differences = []
    for section in sorted(set(want) | set(have)):
        mine, theirs = want.get(section), have.get(section)
        if not (isinstance(mine, dict) and isinstance(theirs, dict)):
            if mine != theirs:
                differences.append(f"{section}: {theirs!r} (row: {mine!r})")
            continue
        for key in sorted(set(mine) | set(theirs)):
            if key not in NOT_ALGORITHM and mine.get(key) != theirs.get(key):
                differences.append(f"{section}.{key}: {theirs.get(key)!r} "
                                   f"(row: {mine.get(key)!r})")
    if differences:
        raise paper_rows.ReproduceError(
            f"{path} is not this row's run: " + "; ".join(differences)
            + ". Move it away to run the row afresh")


def _read_report(path: str, options: paper_rows.ReproduceOptions) -> dict:
    with open(path, encoding="utf-8") as stream:
        report = json.load(stream)
    check_row_report(report, options, path)
    return report


def _sibling_row(out_dir: str, name: str) -> str | None:
    """A finished row folder of the same name in another table's directory beside
    ``out_dir`` (rows are named by every option that changes the result, so Table 7's
    "- threshold" row is Table 4(b)'s "beta = 0" row), or None."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    if not os.path.isdir(parent):
        return None
    for table_dir in sorted(os.listdir(parent)):
        folder = os.path.join(parent, table_dir, name)
        if (os.path.abspath(os.path.join(parent, table_dir)) != os.path.abspath(out_dir)
                and os.path.isfile(os.path.join(folder, "report.json"))):
            return folder
    return None


def _adopt_row(source: str, target: str) -> None:
    """Copies a finished row's published files (report, plots) into this table. The copy
    is not refreshed when its source later gains a measure (``--add_authors``): delete
    the copied folder and render again to take the newer report."""
    for entry in sorted(os.listdir(source)):
        path = os.path.join(source, entry)
        if os.path.isfile(path):
            reporting.copy_once(path, os.path.join(target, entry))


def _row_entry(row: Row, options: paper_rows.ReproduceOptions, base_dataset: str,
               reports: list[dict] | dict | None) -> dict:
    """One line of ``table.json``: the paper's numbers, and ours if the row has run: the
    mean over its runs (``reports``: one per repeat), with the sd where there are several."""
    reports = [] if reports is None else [reports] if isinstance(reports, dict) else reports
    entry = {"row": row.label, "name": options.default_name(), "changes": row.changes,
             "paper": row.paper.get(base_dataset),
             "paper_seconds_per_epoch": (row.paper_seconds_per_epoch or {}).get(base_dataset),
             "status": "not run", "runs": 0, "val": None, "val_sd": None, "sen": None,
             "sen_sd": None, "authors": None, "label_agreement": None,
             "epsilon": None, "steps": None, "seconds_per_epoch": None, "deviations": []}
    if not reports:
        return entry

    def mean_sd(values):
        _, mean, sd = reporting.mean_sd(v for v in values if v is not None)
        return mean, sd

    def seconds_per_epoch(report):
        steps = report["privacy"].get("steps") or 0
        train_seconds = report["seconds"].get("train")
        steps_per_epoch = max(1, (report.get("partition_size") or 0)
                              // max(1, report.get("batch") or 1))
        return train_seconds / steps * steps_per_epoch if train_seconds and steps else None

    first = reports[0]
    val, val_sd = mean_sd(r["accuracy"]["val"] for r in reports)
    sen, sen_sd = mean_sd(r["accuracy"]["sen"] for r in reports)
    entry.update({
        "status": "finished", "runs": len(reports),
        "val": val, "val_sd": val_sd, "sen": sen, "sen_sd": sen_sd,
        "authors": first["accuracy"].get("authors") if len(reports) == 1 else None,
        "label_agreement": mean_sd((r.get("quality") or {}).get("label_agreement")
                                   for r in reports)[0],
        "epsilon": max((r["privacy"].get("epsilon") or {}).get("epsilon") or 0.0
                       for r in reports) or None,
        "steps": first["privacy"].get("steps") or 0,
        "seconds_per_epoch": mean_sd(seconds_per_epoch(r) for r in reports)[0],
        "deviations": first["deviations"],
    })
    return entry


def table_row_names(table: str, base: paper_rows.ReproduceOptions) -> list[str]:
    """The run names of ``table``'s rows at the shared options ``base``, in table order."""
    if table not in TABLES:
        raise paper_rows.ReproduceError(f"unknown table {table!r}; use one of {sorted(TABLES)}")
    return [row_options(base, row).default_name() for row in TABLES[table][1]]


def repeated(options: paper_rows.ReproduceOptions,
             repeats: int) -> list[paper_rows.ReproduceOptions]:
    """A row's runs: its options, then the same options as repeat 2, 3, ... ``repeats``."""
    return [options] + [dataclasses.replace(options, repeat=r) for r in range(2, repeats + 1)]


def run_table(table: str, base: paper_rows.ReproduceOptions, *, out_dir: str,
              run_root: str = os.path.join("runs", "tables"),
              log: Callable[[str], None] = print, only: Collection[str] | None = None,
              train: bool = True, repeats: int = 1, **reproduce_kwargs) -> dict:
    """Runs (or reads back) the rows of ``table``; writes ``table.json`` and ``table.md``.

    With ``repeats`` > 1 each row is run that many times (independent seeds; the runs
    after the first are named ``-rep2``, ...) and shows the mean and sd of its runs.

    A row is read back from its report in ``out_dir``, else adopted (copied) from a
    finished row of the same name in another table's directory beside ``out_dir``, else
    trained -- only if ``train`` and (``only`` is None or names it). A row that is none
    of these stays "not run". The table files are rewritten after every row, so a table
    that spans sessions always shows what has finished.
    """
    if base.eps != 1:
        raise paper_rows.ReproduceError("the paper's analysis tables are at epsilon = 1")
    if table in SCREENING_TABLES and not base.screening:
        raise paper_rows.ReproduceError(
            f"table {table} chooses hyper-parameters, so it runs on the tuning split and "
            f"is scored on its holdout, never on the private records or the test set: "
            f"pass --training_records tuning (got {base.records.value!r})")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise paper_rows.ReproduceError(f"repeats must be an integer >= 1, got {repeats!r}")
    title, rows = TABLES[table]
    row_runs = [[run.default_name() for run in repeated(row_options(base, row), repeats)]
                for row in rows]
    run_names = [name for names in row_runs for name in names]
    unknown = sorted(set(only or ()) - set(run_names))
    if unknown:
        raise paper_rows.ReproduceError(
            f"no row named {', '.join(map(repr, unknown))} in table {table} at these "
            f"options; its runs are {', '.join(run_names)} (scripts/tables.py --dry_run "
            f"lists them)")
    only = _with_repeats(only, row_runs)
    entries = [_row_entry(row, row_options(base, row), base.dataset, None) for row in rows]
    summary = {"table": table, "title": title, "dataset": base.dataset,
               "options": dataclasses.asdict(base), "rows": entries}
    for index, row in enumerate(rows):
        reports = []
        for options in repeated(row_options(base, row), repeats):
            report = _row_run(row, options, out_dir, run_root, log, only, train,
                              reproduce_kwargs)
            if report is not None:
                reports.append(report)
                entries[index] = _row_entry(row, row_options(base, row), base.dataset,
                                            reports)
                _write_table(out_dir, summary, render(summary))
        # Repeats beyond ``repeats`` that a former call finished stay in the row: a table
        # regenerated without --repeats never drops a finished run from a mean.
        more = _finished_repeats(row_options(base, row), repeats + 1, out_dir, log)
        if reports and more:
            entries[index] = _row_entry(row, row_options(base, row), base.dataset,
                                        reports + more)
    _write_table(out_dir, summary, render(summary))
    log(f"table: {os.path.join(out_dir, 'table.md')}")
    return summary


def _with_repeats(only: Collection[str] | None,
                  row_runs: list[list[str]]) -> set[str] | None:
    """``only`` with, for each row it names by its first run's name, all of that row's
    run names (``row_runs``: each row's runs, first then its repeats), so ``--row NAME
    --repeats 3`` trains NAME's missing runs; a repeat's own name, ``NAME-rep2``, selects
    that run alone."""
    if only is None:
        return None
    selected = set(only)
    for names in row_runs:
        if names[0] in selected:
            selected.update(names)
    return selected


def _finished_repeats(options: paper_rows.ReproduceOptions, first: int, out_dir: str,
                      log: Callable[[str], None]) -> list[dict]:
    """The reports of repeats ``first``, ``first + 1``, ... of ``options`` finished in
    ``out_dir``, up to the first missing one."""
    reports = []
    repeat = max(first, 2)
    while True:
        run = dataclasses.replace(options, repeat=repeat)
        path = os.path.join(out_dir, run.default_name(), "report.json")
        if not os.path.exists(path):
            return reports
        log(f"reading the finished repeat {path}")
        reports.append(_read_report(path, run))
        repeat += 1


def _row_run(row: Row, options: paper_rows.ReproduceOptions, out_dir: str, run_root: str,
             log: Callable[[str], None], only: Collection[str] | None, train: bool,
             reproduce_kwargs: dict) -> dict | None:
    """One run of a row: read back from its report in ``out_dir``, else adopted from a
    finished run of the same name in a sibling table, else trained (if ``train`` and
    ``only`` allows it); None when it stays not run."""
    name = options.default_name()
    row_out = os.path.join(out_dir, name)
    report_path = os.path.join(row_out, "report.json")
    if os.path.exists(report_path):
        log(f"{row.label}: reading the finished row {report_path}")
        return _read_report(report_path, options)
    if (sibling := _sibling_row(out_dir, name)) is not None:
        log(f"{row.label}: adopting the finished row {sibling}")
        report = _read_report(os.path.join(sibling, "report.json"), options)
        _adopt_row(sibling, row_out)
        return report
    if train and (only is None or name in only):
        log(f"{row.label}: running {name}")
        return reproduce.reproduce(options, out_dir=row_out,
                                   run_dir=os.path.join(run_root, name), log=log,
                                   **reproduce_kwargs)
    log(f"{row.label}: not run ({name})")
    return None


def _accuracy_cell(entry: dict, key: str) -> str:
    """``0.3545`` for one run, ``0.3545 +- 0.0210 (3 runs)`` for several."""
    if entry.get("runs", 1) > 1 and entry.get(f"{key}_sd") is not None:
        return f"{entry[key]:.4f} +- {entry[f'{key}_sd']:.4f} ({entry['runs']} runs)"
    return _cell(entry[key])


def _cell(value, digits: int = 4) -> str:
    return "--" if value is None else f"{value:.{digits}f}"


def _authors_cell(authors: dict | None) -> str:
    """``0.6782 (range 1)``; every range the row has, or ``--``."""
    if not authors:
        return "--"
    return ", ".join(f"{value:.4f} (range {key})" for key, value in
                     sorted(authors.items(), key=lambda item: int(item[0])))


def render(summary: dict) -> str:
    """The table as Markdown: paper beside ours under each protocol; rows that have not
    run yet say so."""
    finished = sum(r["status"] == "finished" for r in summary["rows"])
    lines = [f"# {summary['title']} -- {summary['dataset']}", "",
             "Ours: `val` (headline, epoch chosen on held-out synthetic data), `sen` (best "
             "test accuracy over the classifier's epochs, the authors' selection), "
             "`authors` (their evaluation script's protocol, where run). Every row "
             "shares the scale below; each row's deviations from the paper's Table 1 config "
             "are listed under the table.", "",
             *_matched_noise_note(summary["options"]),
             *_screening_note(summary["options"]),
             f"{finished} of {len(summary['rows'])} rows finished.", "",
             "| row | paper | val | sen | authors | label agreement | epsilon | steps "
             "| s/epoch (ours) | s/epoch (paper, T4) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        paper_time = _cell(r["paper_seconds_per_epoch"], 1)
        if r["status"] != "finished":
            lines.append(f"| {r['row']} | {_cell(r['paper'])} | not run | not run | "
                         f"not run | not run | -- | -- | -- | {paper_time} |")
            continue
        lines.append(f"| {r['row']} | {_cell(r['paper'])} | {_accuracy_cell(r, 'val')} | "
                     f"{_accuracy_cell(r, 'sen')} | {_authors_cell(r['authors'])} | "
                     f"{_cell(r.get('label_agreement'))} | {_cell(r['epsilon'])} | {r['steps']} | "
                     f"{_cell(r['seconds_per_epoch'], 1)} | {paper_time} |")
    lines += ["", "Shared options: `" + json.dumps(
        {k: v for k, v in summary["options"].items() if v is not None}) + "`", ""]
    for r in summary["rows"]:
        if r["status"] != "finished":
            lines.append(f"* {r['row']} (`{r['name']}`): not run yet")
            continue
        lines.append(f"* {r['row']} (`{r['name']}`): " + ("; ".join(r["deviations"])
                                                          or "the paper's Table 1 config"))
    return "\n".join(lines) + "\n"


def _screening_note(options: dict) -> list[str]:
    """The paragraph a table run on the tuning split opens with (none otherwise)."""
    records = options.get("training_records")
    if records != splits.TrainingRecords.TUNING.value:
        return []
    total = paper_rows.TRAIN_RECORDS[options["dataset"]]
    return ["**Screening on the tuning split.** Every row is trained on "
            + splits.describe(records, total)
            + (f", the first {options['max_records']} of them" if options.get("max_records")
               else "")
            + ". `val` and `sen` are accuracies on that holdout and label agreement uses a "
            "domain classifier trained on the tuning split: nothing here looked at the "
            "private records or the test set, so these rows may choose a configuration "
            "for private runs on the other records (`--training_records private`).", ""]


def _matched_noise_note(options: dict) -> list[str]:
    """The paragraph a noise-matched reduced-scale table opens with (none otherwise)."""
    scale = options.get("sigma_scale")
    if not scale or scale == 1:
        return []
    dataset, eps = options["dataset"], options["eps"]
    sigma = cfg.paper_preset(dataset, eps).topagg.sigma
    budget = paper_rows.matched_budget(dataset, eps, sigma * scale)
    return [f"**A noise-matched reduced scale, NOT epsilon = {eps}.** Every row runs "
            f"sigma = {sigma * scale:g} ({scale:g} x the paper's "
            f"{sigma:g}) under one budget, epsilon {budget:.4g} (what the "
            f"paper config's {paper_rows.paper_steps(dataset, eps)} TopAgg steps "
            f"cost at that sigma; a row accounted by another conversion, e.g. pld, gets the "
            f"budget of the steps the paper config runs under it): with {scale:g} x the "
            f"paper's teachers the noise relative "
            "to the vote sum is the paper's, and each mechanism runs the steps its own "
            "sensitivity allows, as at the paper scale. With the paper's sigma a reduced "
            "ensemble is swamped by the noise and every row ties at chance. The paper's "
            "column is at epsilon = 1 and 4000 teachers: compare the ordering of the rows, "
            "not their values.", ""]


# ------------------------------------------------------------------ Table 6 (time)

def table6(bench_report: dict, dataset: str) -> dict:
    """Table 6 (seconds per epoch of Table 5's mechanisms) from a ``scripts/bench.py``
    report that ran one configuration with several ``--aggregation`` values.

    At the paper configs one epoch is one generator step (15 records per teacher, batch
    15), so seconds per epoch = seconds per step: the extrapolated figure where the bench
    ran fewer teachers than the configuration, else the measured one. The ratio to TopAgg
    is taken within the report (one run, one machine); the paper's is on one Tesla T4.
    """
    rows_by_mechanism = {row.changes.get("aggregation", "topk_stochastic_sign"): row
                  for row in TABLES[TABLE_6][1]}
    rows = []
    for result in bench_report["results"]:
        if "error" in result:
            raise paper_rows.ReproduceError(f"the bench of {result.get('aggregation')} "
                                           f"failed: {result['error']}")
        part = result.get("extrapolated") or result["measured"]
        seconds = part.get("seconds_per_step", part.get("seconds_per_step_median"))
        phases = part.get("phases_seconds", part.get("phases_median_seconds"))
        paper = rows_by_mechanism.get(result["aggregation"])
        rows.append({
            "aggregation": result["aggregation"], "config": result["config"],
            "row": paper.label if paper else f"{result['aggregation']} (not in Table 6)",
            "teachers": part["num_teachers"],
            "measured_teachers": result["measured"]["num_teachers"],
            "seconds_per_epoch": seconds,
            "vote_and_release_seconds": phases.get("voting", 0.0) + phases.get("noise", 0.0),
            "cpu_share_of_machine": result["measured"].get("cpu_share_of_machine"),
            "paper_seconds_per_epoch": ((paper.paper_seconds_per_epoch or {}).get(dataset)
                                        if paper else None)})
    configs = {row["config"] for row in rows}
    if len(configs) != 1:
        raise paper_rows.ReproduceError(f"Table 6 compares mechanisms at one configuration; "
                                       f"the bench report ran {sorted(configs)}")
    base = [r for r in rows if r["aggregation"] == "topk_stochastic_sign"]
    if not base:
        raise paper_rows.ReproduceError("the bench report has no TopAgg run "
                                       "(--aggregation topk_stochastic_sign), the baseline "
                                       "of Table 6's ratios")
    paper_base = base[0]["paper_seconds_per_epoch"]
    for row in rows:
        row["ratio_to_topagg"] = row["seconds_per_epoch"] / base[0]["seconds_per_epoch"]
        row["paper_ratio_to_topagg"] = (row["paper_seconds_per_epoch"] / paper_base
                                        if row["paper_seconds_per_epoch"] and paper_base
                                        else None)
    return {"table": "6", "dataset": dataset, "machine": bench_report["machine"],
            "rows": rows}


def render_table6(summary: dict, source: str) -> str:
    """Table 6 as Markdown: ours beside the paper's, and each as a ratio to TopAgg."""
    machine = summary["machine"]
    lines = [f"# Table 6: seconds per epoch of the aggregation mechanisms -- "
             f"{summary['dataset']}", "",
             f"From `{source}` (`scripts/bench.py`): {machine.get('cpu_model')} with "
             f"{machine.get('cpus')} cores, TensorFlow {machine.get('tensorflow')}, oneDNN "
             f"{'on' if machine.get('onednn_enabled') else 'off'}. One epoch is one generator "
             "step at the paper config. Ours: synthetic data of the right shapes, per-teacher "
             "phases extrapolated linearly where fewer teachers ran; a named mechanism runs "
             "with the budget lifted (a timing, not a private run). The paper's: one Tesla "
             "T4. Compare the ratios, each taken within its own column."
             + _contention_note(summary["rows"]), "",
             "| row | teachers (measured) | s/epoch (ours) | ours / TopAgg | vote + release "
             "s (ours) | s/epoch (paper, T4) | paper / TopAgg |",
             "|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append(f"| {r['row']} | {r['teachers']} ({r['measured_teachers']}) | "
                     f"{_cell(r['seconds_per_epoch'], 1)} | {_cell(r['ratio_to_topagg'], 2)} "
                     f"| {_cell(r['vote_and_release_seconds'], 2)} | "
                     f"{_cell(r['paper_seconds_per_epoch'], 1)} | "
                     f"{_cell(r['paper_ratio_to_topagg'], 2)} |")
    return "\n".join(lines) + "\n"


def _contention_note(rows: list[dict]) -> str:
    shares = [r["cpu_share_of_machine"] for r in rows if r.get("cpu_share_of_machine")]
    if not shares:
        return ""
    return (f" The benchmark's process had {min(shares):.2f}-{max(shares):.2f} of the "
            f"machine's CPU time (1 = all cores to itself): below about 0.9 other work "
            f"shared the cores, so the seconds are inflated and noisy; the vote + release "
            f"column isolates the mechanisms' own cost.")


def write_table6(bench_path: str, dataset: str, out_dir: str) -> dict:
    """Reads a bench report, writes ``table.json`` and ``table.md`` in ``out_dir``."""
    try:
        with open(bench_path, encoding="utf-8") as stream:
            report = json.load(stream)
    except (OSError, ValueError) as error:
        raise paper_rows.ReproduceError(f"cannot read the bench report {bench_path!r}: "
                                       f"{error}; write one with scripts/bench.py --out") \
            from error
    summary = table6(report, dataset)
    summary["source"] = bench_path
    _write_table(out_dir, summary, render_table6(summary, bench_path))
    return summary


def _write_table(out_dir: str, summary: dict, markdown: str) -> None:
    """``table.json`` and ``table.md`` in ``out_dir``, each written atomically."""
    os.makedirs(out_dir, exist_ok=True)
    export.write_json(os.path.join(out_dir, "table.json"), summary)
    export.atomic_write(os.path.join(out_dir, "table.md"), lambda s: s.write(markdown),
                        mode="w")
