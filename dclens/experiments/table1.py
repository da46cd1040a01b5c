"""Table 1 across independent runs: every protocol's accuracy as mean and standard deviation.

A Table 1 row (dataset, epsilon) is reproduced several times at the paper config, each run
with its own OS-entropy noise and generator initialisation (``scripts/reproduce.py ...
--run_dir runs/reproduce/<name>-run<N> --out results/<name>-run<N>``). This module reads
their ``report.json`` files, keeps those at the paper config, groups them by row and
summarises each protocol over the runs that finished it:

* ``val`` (the headline: classifier epoch chosen on held-out synthetic data),
* ``sen`` (best real-test accuracy over the classifier's epochs: test-set selection),
* ``authors`` with ``--range 1`` and ``--range 10`` (the authors' evaluation script:
  600 epochs of SGD, best real-test accuracy).

Mean and *sample* standard deviation (``ddof = 1``; none for a single run) per protocol;
every run's own values, commit, CPU and generator initialisation are listed too, so a
reader can see which runs a mean is over. The markdown goes between two marker lines of
a hand-written file (the explanation around the table stays as written).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

from dclens.datalens import config as cfg
from dclens.common import export
from dclens.common.reporting import mean_sd, write_marked_section

#: The method of a row whose :attr:`RunFacts.method` is not given: the paper's.
DATALENS = "DataLens"

BEGIN_MARK = "<!-- table1:begin (written by scripts/table1.py; edit outside the markers) -->"
END_MARK = "<!-- table1:end -->"

#: (protocol key, column heading) in table order.
PROTOCOLS = (("val", "`val` (headline)"), ("sen", "`sen`"),
             ("authors_range1", "`authors`, range 1"),
             ("authors_range10", "`authors`, range 10"))

#: (sample-quality key, column heading, digits): the domain classifier's, beside the
#: accuracies (dclens.evaluation.quality: FID, label agreement, and the per-class scores).
QUALITY = (("fid", "FID", 1), ("label_agreement", "label agreement", 3),
           ("intra_fid", "intra-class FID", 1), ("spread_ratio", "spread ratio", 2))


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """One paper-config run's report, reduced to what the table shows."""

    name: str
    dataset: str
    eps: int
    paper: float | None
    accuracy: dict[str, float | None]         # protocol key -> accuracy (None: not run)
    unfinished: dict[str, str]                # protocol key -> "N of M epochs"
    epsilon: float | None
    steps: int | None
    commit: str
    cpu: str
    generator_init: str
    partition: str                            # "index" (proven) or "class-balanced"
    fake_rendering: str                       # "class_grid" (dclens) or "teacher_labels"
    curves: dict[str, dict]                   # protocol key -> {"epoch": [...], "test": [...]}
    fid: float | None = None                  # domain-classifier FID to the real test set
    label_agreement: float | None = None      # share of samples classified as their label
    intra_fid: float | None = None            # mean over classes of the class's FID
    spread_ratio: float | None = None         # mean over classes of its spread / the real one
    configuration: str = ""                   # "" the paper's; else a tuned one's name
    method: str = DATALENS                    # another method's rows sort after DataLens'

    @property
    def row_key(self) -> tuple[bool, str, str, str, int, str, str]:
        """Runs are averaged only with runs of the same method, row, fidelity options and
        configuration (DataLens first, the paper's settings first within it)."""
        return (self.method != DATALENS, self.method, self.configuration, self.dataset,
                self.eps, self.partition, self.fake_rendering)


class ReportError(ValueError):
    """A report.json under the results folder cannot be read (the message names it)."""


def read_report(path: str) -> RunFacts:
    """The facts of one ``report.json``.

    Raises:
      ReportError: the file is unreadable, not JSON, or lacks a field (named).
    """
    try:
        return _facts(path, _load_report(path))
    except (KeyError, TypeError, AttributeError, IndexError) as error:
        problem = f"no {error}" if isinstance(error, KeyError) else str(error)
        raise ReportError(unreadable_message(path, problem)) from error


def unreadable_message(path: str, problem: str) -> str:
    return (f"{path} is not a readable reproduction report ({problem}); restore it from the "
            "run that wrote it (scripts/reproduce.py), or move its folder out of --results")


def _load_report(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
    except (OSError, ValueError) as error:
        raise ReportError(unreadable_message(path, str(error))) from error
    if not isinstance(report, dict):
        raise ReportError(unreadable_message(path, f"a JSON {type(report).__name__}, not an object"))
    return report


def _facts(path: str, report: dict) -> RunFacts:
    record = report["evaluation"]
    protocols = record["protocols"]
    accuracy = {"val": protocols["val"]["accuracy"], "sen": protocols["sen"]["accuracy"]}
    unfinished, curves = {}, {}
    test_curve = record["curves"]
    curves["val"] = {"epoch": test_curve["epoch"], "test": test_curve["test_accuracy"],
                     "chosen": protocols["val"]["epoch"]}
    for key, entry in protocols.items():
        if not key.startswith("authors"):
            continue
        done = len(entry["curve"]["epoch"])
        if entry.get("finished", True):
            accuracy[key] = entry["accuracy"]
        else:
            unfinished[key] = f"{done} of {entry['settings']['epochs']} epochs"
        curves[key] = {"epoch": entry["curve"]["epoch"], "test": entry["curve"]["test_accuracy"],
                       "chosen": entry["epoch"]}
    train = report.get("config", {}).get("train", {})
    quality = report.get("quality") or {}
    return RunFacts(
        name=os.path.basename(os.path.dirname(os.path.abspath(path))),
        dataset=report["dataset"], eps=report["eps"],
        paper=report["accuracy"].get("paper"), accuracy=accuracy, unfinished=unfinished,
        epsilon=(report["privacy"].get("epsilon") or {}).get("epsilon"),
        steps=report["privacy"].get("steps"),
        commit=(report["provenance"].get("commit") or "unknown")[:7],
        cpu=cpu_label(report["provenance"].get("machine")),
        generator_init=report.get("generator_init") or "not recorded",
        partition=cfg.partition_kind(train),
        fake_rendering=train.get("fake_rendering", cfg.FakeRendering.CLASS_GRID.value),
        curves=curves, fid=quality.get("fid"),
        label_agreement=quality.get("label_agreement"),
        intra_fid=(quality.get("per_class") or {}).get("intra_fid"),
        spread_ratio=(quality.get("per_class") or {}).get("spread_ratio"))


def cpu_label(machine: dict | None) -> str:
    """The CPU of a run's recorded machine by name, with its two widest vector extensions
    (e.g. "AMD EPYC (AVX-512, AVX2)"); "not recorded" for a run that did not record it."""
    machine = machine or {}
    cpu = machine.get("cpu") or "not recorded"
    extensions = machine.get("cpu_vector_extensions") or []
    widest = [label for flag, label in (("amx_tile", "AMX"), ("avx512f", "AVX-512"),
                                        ("avx2", "AVX2")) if flag in extensions]
    if widest:
        cpu += f" ({', '.join(widest[:2])})"
    return cpu


def collect(results_dir: str) -> list[RunFacts]:
    """Every paper-config report under ``results_dir`` (one folder per run), by name.

    Raises:
      ReportError: a report cannot be read (every report is read, so that a damaged one
        is named rather than silently left out).
    """
    runs = []
    paths = glob.glob(os.path.join(results_dir, "*", "report.json"))
    for path in sorted(paths, key=lambda p: os.path.basename(os.path.dirname(p))):
        if _load_report(path).get("paper_config"):
            runs.append(read_report(path))
    return runs


def summarise(runs: list[RunFacts]) -> list[dict]:
    """One dictionary per Table 1 row: its runs, each protocol's (n, mean, sd) and each
    sample-quality measure's (n, mean, sd), over the runs that have the value."""
    def stat(values) -> dict:
        n, mean, sd = mean_sd(v for v in values if v is not None)
        return {"n": n, "mean": mean, "sd": sd}

    rows: dict[tuple, list[RunFacts]] = {}
    for run in runs:
        rows.setdefault(run.row_key, []).append(run)
    out = []
    for _, members in sorted(rows.items()):
        first = members[0]
        out.append({"dataset": first.dataset, "eps": first.eps, "partition": first.partition,
                    "fake_rendering": first.fake_rendering,
                    "configuration": first.configuration, "method": first.method,
                    "paper": first.paper,
                    "runs": [r.name for r in members],
                    "protocols": {key: stat(r.accuracy.get(key) for r in members)
                                  for key, _ in PROTOCOLS},
                    "quality": {key: stat(getattr(r, key) for r in members)
                                for key, _, _ in QUALITY},
                    "epsilon": mean_sd(r.epsilon for r in members if r.epsilon is not None)[1]})
    return out


def _row_label(row: dict) -> str:
    if row.get("method", DATALENS) != DATALENS:
        return (f"{row['dataset']}, eps = {row['eps']}, **beyond the paper, another "
                f"method**: {row['method']}, `{row['configuration']}`")
    label = (f"{row['dataset']}, eps = {row['eps']}, "
             + ("index partition" if row["partition"] == "index" else
                "class-balanced partition (the authors'; epsilon NOT a proven guarantee)"))
    if row["fake_rendering"] != cfg.FakeRendering.CLASS_GRID.value:
        label += f", fake batches rendered {row['fake_rendering']} (the authors')"
    if row.get("configuration"):
        label += f", **beyond the paper**: `{row['configuration']}`"
    return label


def _cell(stat: dict, digits: int = 4, absent: str = "not run") -> str:
    if stat["n"] == 0:
        return absent
    if stat["sd"] is None:
        return f"{stat['mean']:.{digits}f} (1 run)"
    return f"{stat['mean']:.{digits}f} +- {stat['sd']:.{digits}f} ({stat['n']} runs)"


def _value(run: RunFacts, key: str) -> str:
    if key in run.unfinished:
        return f"unfinished ({run.unfinished[key]})"
    value = run.accuracy.get(key)
    return "--" if value is None else f"{value:.4f}"


def render(runs: list[RunFacts], figure: str | None = None) -> str:
    """The markdown between the markers: the summary table, then one line per run."""
    lines = ["| row | paper (Table 1) | runs | " + " | ".join(h for _, h in PROTOCOLS)
             + " | " + " | ".join(h for _, h, _ in QUALITY) + " |",
             "|---" * (3 + len(PROTOCOLS) + len(QUALITY)) + "|"]
    for row in summarise(runs):
        paper = "--" if row["paper"] is None else f"{row['paper']:.4f}"
        lines.append(f"| {_row_label(row)} | {paper} | {len(row['runs'])} | "
                     + " | ".join(_cell(row["protocols"][k]) for k, _ in PROTOCOLS) + " | "
                     + " | ".join(_cell(row["quality"][k], digits, "not measured")
                                  for k, _, digits in QUALITY) + " |")
    lines += ["", "Mean +- sample standard deviation (ddof = 1) over the runs that finished the "
              "protocol; every run at the paper config with its own OS-entropy noise. "
              "FID and label agreement (the share of samples the domain classifier assigns "
              "to their own label) are the domain classifier's, on 10,000 samples; so are "
              "the intra-class FID (each label's samples against the real test images of "
              "that class, averaged over the classes) and the spread ratio (the RMS distance "
              "of a class's samples from their mean over the real class's, averaged; below 1 "
              "is less diverse than the real data)."
              + (" A row marked **beyond the paper** is a tuned configuration at the paper "
                 "scale (`results/beyond/README.md`: chosen on a tuning split its runs never "
                 "read; the name says its settings and the classifier schedule that scored "
                 "it), its runs listed below by folder under `results/`."
                 if any(run.configuration for run in runs) else "")
              + (" A row marked **another method** is not DataLens: "
                 + ", ".join(sorted({run.method for run in runs if run.method != DATALENS}))
                 + " on the same private records, with the same accountant and the same "
                 "evaluation (`results/beyond/README.md` says how it was run; it has no "
                 "teachers, so no partition or fake batches)."
                 if any(run.method != DATALENS for run in runs) else ""), "",
              "| run (`results/...`) | epsilon (steps) | " + " | ".join(h for _, h in PROTOCOLS)
              + " | " + " | ".join(h for _, h, _ in QUALITY)
              + " | partition | fake batches | generator init | commit | CPU |",
              "|---" * (7 + len(PROTOCOLS) + len(QUALITY)) + "|"]
    for run in runs:
        steps = (f"{run.steps}" if run.method == DATALENS
                 else f"{run.steps} release{'s' if run.steps != 1 else ''}")
        eps = "--" if run.epsilon is None else f"{run.epsilon:.4f} ({steps})"
        lines.append(f"| `{run.name}` | {eps} | "
                     + " | ".join(_value(run, k) for k, _ in PROTOCOLS) + " | "
                     + " | ".join("--" if v is None else f"{v:.{d}f}" for v, d in
                                  ((getattr(run, k), d) for k, _, d in QUALITY))
                     + f" | {run.partition} | {run.fake_rendering} | {run.generator_init} | "
                     f"`{run.commit}` | "
                     f"{run.cpu} |")
    if figure:
        lines += ["", f"![real-test accuracy per classifier epoch, every protocol and run]"
                      f"({figure})"]
    return "\n".join(lines)


def plot(runs: list[RunFacts], path: str) -> None:
    """Real-test accuracy per classifier epoch: one panel per row, one colour per protocol,
    one line per run, the protocol's chosen epoch marked."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = sorted({(r.dataset, r.eps) for r in runs})
    figure = pyplot.figure(figsize=(6.4, 3.6 * max(1, len(rows))), dpi=100)
    colours = {"val": "tab:blue", "authors_range1": "tab:green",
               "authors_range10": "tab:purple"}
    labels = {"val": "val/sen classifier (Adam, 20 epochs)",
              "authors_range1": "authors, range 1", "authors_range10": "authors, range 10"}
    for i, (dataset, eps) in enumerate(rows):
        axes = figure.add_subplot(len(rows), 1, i + 1)
        shown = set()
        for run in (r for r in runs if (r.dataset, r.eps) == (dataset, eps)):
            for key, curve in run.curves.items():
                colour = colours.get(key, "tab:gray")
                axes.plot(curve["epoch"], curve["test"], color=colour, linewidth=0.8,
                          alpha=0.8, label=None if key in shown else labels.get(key, key))
                chosen = curve["chosen"] - 1
                axes.plot([curve["epoch"][chosen]], [curve["test"][chosen]], marker="o",
                          color=colour, markersize=4)
                shown.add(key)
        axes.set_xscale("log")
        axes.set_xlabel("classifier epoch (log scale)")
        axes.set_ylabel("real test accuracy")
        axes.set_title(f"{dataset}, eps = {eps}: every run (dots: the protocol's chosen "
                       "epoch)", fontsize=9)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    export.atomic_write(path, lambda s: figure.savefig(s, format="png"))
    pyplot.close(figure)


def write_section(markdown_path: str, body: str) -> None:
    """Replaces the text between the table1 markers of ``markdown_path`` (atomically); a
    file without the markers gets them, with ``body``, at its end."""
    write_marked_section(markdown_path, body, BEGIN_MARK, END_MARK)
