"""The GS-WGAN results table (``results/gswgan/README.md``), written from the published
runs' own ``report.json`` and ``evaluation.json`` so that no number in it is typed by hand.

Layout of the results folder: one sub-folder per published run holding copies of its
``report.json`` (run report: config, ledger summary, curves), ``evaluation.json``
(``scripts/evaluate.py``: ``val``, ``sen``, the authors' protocol when run, domain
IS/FID) and, when present, ``config.json``, ``privacy.json``, ``evaluation.png`` and
``samples.png``.  The 60,000 released images are not copied (~190 MB).

Each row states what its epsilon is worth, because the table mixes kinds of run:

* **proven**: the iteration-level accounting (one subsampled Gaussian per iteration;
  replace-one adjacency) of a run that discards the DP phase's critic updates, noise
  from OS entropy, more than one discriminator;
* **NOT proven**: the released code's per-sample composition (``per_sample_paper``), or
  a run that keeps the critic updates (``critic_updates`` keep, which every run made
  before the setting existed did: :data:`dclens.gswgan.config.IMPLIED_BY_OLDER_RUNS`),
  whatever its accounting -- the verdict is recomputed from the settings, not read from
  the run's own ``accounting_proven``, which older runs wrote from the accounting alone;
* **reference, NOT private**: one discriminator holds every record and is drawn at
  every iteration, so nothing is amplified (the ledger's epsilon is astronomically
  large); such runs isolate what the noise costs with a perfect critic;
* **seeded noise, NOT private**: ``--seed`` fixed the DP noise.

Every row also shows the epsilon the *other* accounting gives for the same spends
(``privacy.for_comparison`` of the report), and how its scale differs from the paper's
configuration (the defaults of :class:`dclens.gswgan.config.GswganConfig`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

from dclens.gswgan.accounting import Accounting, CriticUpdates, is_proven
from dclens.gswgan.config import IMPLIED_BY_OLDER_RUNS, GswganConfig
from dclens.common.reporting import ReportError, copy_once, write_marked_section

BEGIN_MARK = "<!-- gswgan:begin (written by scripts/gswgan_report.py; edit outside the markers) -->"
END_MARK = "<!-- gswgan:end -->"

#: Files copied from a run folder: the first two must exist.
REQUIRED_FILES = ("report.json", "evaluation.json")
OPTIONAL_FILES = ("config.json", "privacy.json", "evaluation.png", "samples.png")

#: The settings that set a run's scale, in the order the table names them, with the
#: short name the table uses.
SCALE_SETTINGS = (("num_discriminators", "N_D"), ("model_dim", "m"),
                  ("warm_iterations", "warm"), ("iterations", "DP it."),
                  ("batch_size", "B"), ("max_records", "records"))


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """One published run: what its report and its evaluation say."""

    name: str
    config: dict
    privacy: dict
    evaluation: dict

    @property
    def epsilon(self) -> float:
        return float(self.privacy["epsilon"]["epsilon"])

    @property
    def delta(self) -> float:
        return float(self.privacy["delta"])

    @property
    def critic_updates(self) -> CriticUpdates:
        """The run's setting; a run made before it existed kept the updates."""
        return CriticUpdates(self.config.get("critic_updates",
                                             IMPLIED_BY_OLDER_RUNS["critic_updates"]))

    def proven(self, accounting: str) -> bool:
        """Whether ``accounting``'s epsilon is proven for this run's algorithm."""
        return is_proven(Accounting(accounting), self.critic_updates)

    @property
    def kind(self) -> str:
        """What the epsilon is worth (see the module docstring); the table's sort key."""
        if int(self.config["num_discriminators"]) == 1:
            return "reference, NOT private"
        if self.config.get("seed") is not None or self.privacy.get("reproducible_noise"):
            return "seeded noise, NOT private"
        return "proven" if self.proven(self.privacy["accounting"]) else "NOT proven"

    def protocol(self, key: str) -> float | None:
        entry = self.evaluation.get("protocols", {}).get(key)
        return None if entry is None else float(entry["accuracy"])

    def quality(self, key: str) -> float | None:
        value = (self.evaluation.get("quality") or {}).get(key)
        return None if value is None else float(value)


def scale_description(config: dict) -> str:
    """``paper config`` or the settings that differ from it, e.g.
    ``N_D 200 (paper 1000), m 8 (64), warm 10 (2000), DP it. 500 (20000)``."""
    paper = GswganConfig()
    differences = []
    for name, short in SCALE_SETTINGS:
        ours, theirs = config.get(name), getattr(paper, name)
        if ours != theirs:
            theirs_text = "all" if theirs is None else theirs
            differences.append(f"{short} {ours} ({'paper ' if not differences else ''}"
                               f"{theirs_text})")
    return ", ".join(differences) or "paper config"


def read_run(folder: str) -> PublishedRun:
    """A published (or finished and evaluated) run folder; raises ``ReportError`` naming
    what is missing or wrong."""
    documents = {}
    for file in REQUIRED_FILES:
        path = os.path.join(folder, file)
        try:
            with open(path, encoding="utf-8") as handle:
                documents[file] = json.load(handle)
        except FileNotFoundError:
            hint = ("the run has not finished: repeat its scripts/gswgan.py command to "
                    "resume it" if file == "report.json" else
                    f"evaluate it first: python scripts/evaluate.py {folder}/samples.npz "
                    f"--protocol authors --range 1")
            raise ReportError(f"{folder!r} has no {file}: {hint}") from None
        except ValueError as error:
            raise ReportError(f"{path} is not valid JSON ({error})") from None
    report = documents["report.json"]
    if report.get("method") != "gswgan":
        raise ReportError(f"{folder}/report.json is a {report.get('method')!r} report, not "
                          f"a GS-WGAN one (method 'gswgan')")
    try:
        run = PublishedRun(os.path.basename(os.path.normpath(folder)), report["config"],
                           report["privacy"], documents["evaluation.json"])
        run.epsilon, run.kind, run.protocol("val")   # the fields the table needs
    except (KeyError, TypeError, ValueError) as error:
        raise ReportError(f"{folder}: report.json or evaluation.json lacks {error}; is it "
                          f"from scripts/gswgan.py and scripts/evaluate.py?") from None
    return run


def collect(results_dir: str) -> list[PublishedRun]:
    """Every published run under ``results_dir`` (sub-folders with a report.json)."""
    folders = sorted(os.path.dirname(path)
                     for path in glob.glob(os.path.join(results_dir, "*", "report.json")))
    return [read_run(folder) for folder in folders]


def _number(value: float | None, digits: int = 4) -> str:
    return "--" if value is None else f"{value:.{digits}f}"


def _epsilon(value: float) -> str:
    return f"{value:.4g}"


def _other_accounting(run: PublishedRun) -> str:
    other = run.privacy.get("for_comparison")
    if not other:
        return "--"
    caveat = "" if run.proven(other["accounting"]) else ", NOT proven"
    return f"{_epsilon(float(other['epsilon']))} ({other['accounting']}{caveat})"


_KIND_ORDER = ("proven", "NOT proven", "seeded noise, NOT private", "reference, NOT private")


def render(runs: list[PublishedRun]) -> str:
    """The markdown table, proven runs first, then by epsilon and name."""
    runs = sorted(runs, key=lambda r: (_KIND_ORDER.index(r.kind), r.epsilon, r.name))
    lines = [
        "| run | epsilon is | epsilon (delta) | critic updates | same spends, other "
        "accounting | scale vs the paper | sigma | `val` | `sen` | authors range 1 | domain "
        "FID | label agreement |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| [{run.name}]({run.name}/) | {run.kind} | {_epsilon(run.epsilon)} "
            f"({run.delta:g}, {run.privacy['accounting']}) | {run.critic_updates.value} | "
            f"{_other_accounting(run)} | "
            f"{scale_description(run.config)} | {float(run.privacy['sigma']):.4g} | "
            f"{_number(run.protocol('val'))} | {_number(run.protocol('sen'))} | "
            f"{_number(run.protocol('authors_range1'))} | "
            f"{_number(run.quality('fid'), 1)} | {_number(run.quality('label_agreement'), 3)} |")
    lines.append("")
    lines.append(f"{len(runs)} runs. `val`: real-test accuracy at the epoch chosen on "
                 f"held-out synthetic data (the headline); `sen`: best real-test accuracy "
                 f"over the epochs (selects on the test set); critic updates: `discard` "
                 f"drops a discriminator's DP-phase steps after its iteration (the proof "
                 f"needs it), `keep` is the released code's and makes every epsilon of the "
                 f"run NOT proven; authors range 1: their "
                 f"evaluation script exactly (best test accuracy over 600 SGD epochs); FID "
                 f"and label agreement use the domain classifier, not Inception. `--`: not "
                 f"measured.")
    return "\n".join(lines)


def publish_run(run_dir: str, results_dir: str, name: str | None = None) -> str:
    """Copies a finished, evaluated run's files to ``results_dir/<name>/`` (default name:
    the run folder's). A folder of that name must hold the same run (the same
    report.json) or nothing; its other files are replaced (a run evaluated again, e.g.
    with the authors' protocol added, is published again). Returns the folder."""
    read_run(run_dir)                                # finished, evaluated, a GS-WGAN run
    target = os.path.join(results_dir, name or os.path.basename(os.path.normpath(run_dir)))
    copy_once(os.path.join(run_dir, "report.json"), os.path.join(target, "report.json"))
    for file in REQUIRED_FILES[1:] + OPTIONAL_FILES:
        source = os.path.join(run_dir, file)
        if os.path.exists(source):
            copy_once(source, os.path.join(target, file), replace=True)
    return target


def write(results_dir: str) -> str:
    """Rewrites the generated section of ``results_dir/README.md``; returns its path."""
    markdown = os.path.join(results_dir, "README.md")
    write_marked_section(markdown, render(collect(results_dir)), BEGIN_MARK, END_MARK)
    return markdown
