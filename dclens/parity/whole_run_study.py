"""A study of whole runs side by side: ``runs`` independent runs of each side
(:mod:`dclens.parity.whole_run`), evaluated alike, compared by their distributions.

The study directory holds ``study.json`` (the configuration, seeds and evaluation settings,
fixed at the first start: a later start with other settings is refused) and one folder per
run, ``authors-<i>`` / ``dclens-<i>``.  Work goes in three phases, each resumable run by run
(a finished piece is a file written atomically last; an interrupted one is redone):

1. training (``run.json``, ``samples.npz``, the authors' pickles): run i of the authors,
   then run i of dclens, back to back on the same machine, so their seconds per step
   compare;
2. evaluation (``evaluation.json``): ``val`` and ``sen`` accuracy, domain-classifier FID and
   label agreement (:func:`dclens.evaluation.evaluate.evaluate`);
3. the authors' evaluation protocol (``authors_protocol.json``; range 1: their script reads
   the first pickle), the slowest, with its own resume file.

Several processes may work on one study at once (each claims the run it trains or
evaluates with the authors' protocol), or on chosen runs only (``Study.only``).  When the
study's directory is lost (``runs/`` does not survive a change of machine), :func:`restore`
seeds a new one from the published reports: every run's files are copied, and a run whose
samples a missing phase needs is retrained from its seed first and checked step for step
against its published record.

:func:`summarize` reads what is finished; :mod:`dclens.parity.whole_run_report` renders it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
from typing import Any, Callable, Iterator

import numpy as np

from dclens import data
from dclens.common import export, reporting
from dclens.evaluation import authors_protocol, evaluate
from dclens.evaluation.synthetic_input import load_synthetic
from dclens.parity.config import SideBySideError
from dclens.parity.whole_run import RUNNERS, SIDES, WholeRunConfig, run_seed

STUDY_FILE = "study.json"
RUN_FILE = "run.json"
EVALUATION_FILE = "evaluation.json"
AUTHORS_PROTOCOL_FILE = "authors_protocol.json"
#: The phases, in the order a study runs them.
PHASES = ("train", "evaluate", "authors_protocol")


@dataclasses.dataclass(frozen=True)
class Study:
    """Where a study lives and what it runs.

    ``evaluation``: the settings of phase 2 (its ``authors`` field is ignored: phase 3 runs
    ``authors`` instead).  ``root_seed``: every run's seed derives from it
    (:func:`dclens.parity.whole_run.run_seed`); the evaluation's own seed is the same for every
    run, so runs differ by their training only.
    """

    directory: str
    config: WholeRunConfig
    repo: str
    runs: int = 5
    root_seed: int = 0
    evaluation: evaluate.EvalSettings = evaluate.EvalSettings()
    authors: authors_protocol.AuthorsProtocol | None = authors_protocol.AuthorsProtocol()
    #: The runs this process works on, as ``<side>-<i>`` names (None: every run).  Not a
    #: setting of the study: it only chooses which of its runs to do now.
    only: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.runs, bool) or not isinstance(self.runs, int) or self.runs < 1:
            raise SideBySideError(f"runs must be an integer >= 1, got {self.runs!r}")
        if self.only is not None:
            names = {self.run_name(side, index) for index in range(self.runs)
                     for side in SIDES}
            unknown = [name for name in self.only if name not in names]
            if unknown or not self.only:
                raise SideBySideError(
                    f"the runs to work on must be named <side>-<i> with side authors or "
                    f"dclens and i below {self.runs} (the study's runs); got "
                    f"{', '.join(map(repr, unknown or self.only)) or 'none'}")
        if self.authors is not None and self.authors.real_rows > self.config.samples:
            raise SideBySideError(
                f"the authors' protocol reads {self.authors.real_rows} samples but each run "
                f"writes {self.config.samples}; raise samples or lower the protocol's rows")

    @staticmethod
    def run_name(side: str, index: int) -> str:
        return f"{side}-{index}"

    def run_dir(self, side: str, index: int) -> str:
        return os.path.join(self.directory, self.run_name(side, index))

    def selected(self) -> list[tuple[str, int]]:
        """(side, index) of the runs to work on, in the order the phases take them:
        run i of the authors, then run i of dclens."""
        return [(side, index) for index in range(self.runs) for side in SIDES
                if self.only is None or self.run_name(side, index) in self.only]

    def settings(self) -> dict[str, Any]:
        """What study.json records (and a resumed study must match)."""
        return {"config": self.config.to_dict(), "runs": self.runs,
                "root_seed": self.root_seed,
                "evaluation": self.evaluation.replace(authors=None).to_dict(),
                "authors_protocol": None if self.authors is None else self.authors.to_dict()}


def open_study(study: Study) -> None:
    """Creates ``study.json``, or checks that the existing one has the same settings (runs
    may grow: more runs of the same configuration extend a study)."""
    os.makedirs(study.directory, exist_ok=True)
    path = os.path.join(study.directory, STUDY_FILE)
    mine = json.loads(json.dumps(study.settings()))
    if os.path.exists(path):
        with open(path) as stream:
            saved = json.load(stream)
        differ = sorted(key for key in mine if key != "runs" and saved.get(key) != mine[key])
        if differ:
            raise SideBySideError(
                f"{path} was started with other settings ({', '.join(differ)} differ): its "
                f"runs would not compare with these; use another directory, or the settings "
                f"it records")
    export.write_json(path, mine)


#: A restored run's published records, kept beside its retraining (:func:`restore`).
EXPECTED_RUN_FILE = "expected_run.json"
#: The per-step curves that decide whether a retrained run is its published one (the
#: step seconds differ between any two runs).
REPRODUCED_CURVES = ("pass_fraction", "generator_loss", "teacher_loss", "epsilon")


def _phase_files(study: Study) -> tuple[str, ...]:
    return (RUN_FILE, EVALUATION_FILE) + (() if study.authors is None else
                                          (AUTHORS_PROTOCOL_FILE,))


def restore(study: Study, published: str, log: Callable[[str], None] = print
            ) -> dict[str, list[str]]:
    """Seeds the study's directory from a published study (the run reports that
    :func:`dclens.parity.whole_run_report.copy_run_reports` wrote to
    ``<published>/runs/<side>-<i>/``), e.g. after ``runs/`` was lost with its machine.

    * A published run with every phase's file is **finished**: its files are copied and
      nothing of it is redone.
    * Any other published run (**retrain**) has its files copied too, so the summary
      holds it, but it lost its samples, which its missing phases need: the first phase
      that needs them retrains it from its own seed (:func:`samples_of`), checked step by
      step against the published ``run.json``, kept as ``expected_run.json``
      (:func:`check_reproduction`).
    * A run the study directory already holds is **kept** as it is.

    Every published run must come from this study's configuration and its own seed
    (:func:`dclens.parity.whole_run.run_seed`), else nothing is copied and the study is
    refused.  Returns the run names under ``finished``, ``retrain`` and ``kept``."""
    source_root = os.path.join(published, "runs")
    if not os.path.isdir(source_root):
        raise SideBySideError(
            f"{published} holds no published runs ({source_root} is missing); give the "
            f"--results folder of the study to restore, e.g. results/side-by-side/whole-runs")
    config = json.loads(json.dumps(study.config.to_dict()))
    plan: dict[str, list[tuple[str, str, str]]] = {"finished": [], "retrain": [], "kept": []}
    for side, index in study.selected():
        name = study.run_name(side, index)
        source, target = os.path.join(source_root, name), study.run_dir(side, index)
        if not os.path.exists(os.path.join(source, RUN_FILE)):
            continue
        with open(os.path.join(source, RUN_FILE)) as stream:
            record = json.load(stream)
        seed = run_seed(study.root_seed, side, index)
        if record.get("seed") != seed or record.get("config") != config:
            what = "seed" if record.get("seed") != seed else "configuration"
            raise SideBySideError(
                f"{source} was made with another {what} than run {name} of this study "
                f"(seed {record.get('seed')!r}, expected {seed}): restore a study with the "
                f"settings it was published with (its README gives the command)")
        if _done(os.path.join(target, RUN_FILE)):
            plan["kept"].append((name, source, target))
        elif all(_done(os.path.join(source, file)) for file in _phase_files(study)):
            plan["finished"].append((name, source, target))
        else:
            plan["retrain"].append((name, source, target))
    for name, source, target in plan["finished"] + plan["retrain"]:
        for file in _phase_files(study):
            if _done(os.path.join(source, file)):
                reporting.copy_once(os.path.join(source, file), os.path.join(target, file),
                                    replace=True)
    for name, source, target in plan["retrain"]:
        reporting.copy_once(os.path.join(source, RUN_FILE),
                            os.path.join(target, EXPECTED_RUN_FILE), replace=True)
    names = {key: [name for name, _, _ in runs] for key, runs in plan.items()}
    log(f"restored from {published}: finished {', '.join(names['finished']) or 'none'}; "
        f"samples lost, retrained when a phase needs them "
        f"{', '.join(names['retrain']) or 'none'}; kept {', '.join(names['kept']) or 'none'}")
    return names


#: What a run's record measured about where and when it ran, not about its trajectory:
#: a retrain that reproduces the trajectory keeps the published run's (its back-to-back
#: timing of the two sides) and files its own under ``reproduction["retrain"]``.
TIMING_FIELDS = ("seconds_per_step", "seconds_per_step_after_first", "setup_seconds",
                 "wall_seconds", "machine", "provenance")
TIMING_CURVES = ("seconds",)


def keep_published_timing(record: dict[str, Any], expected: dict[str, Any]
                          ) -> dict[str, Any]:
    """``record`` of a retrain equal to ``expected`` step for step, with ``expected``'s
    timing (:data:`TIMING_FIELDS`, :data:`TIMING_CURVES`) and its own moved to
    ``record["reproduction"]["retrain"]`` (idempotent: a record already carrying the
    published timing is returned unchanged)."""
    reproduction = dict(record.get("reproduction") or {})
    if "retrain" in reproduction:
        return record
    retrain = {key: record[key] for key in TIMING_FIELDS if key in record}
    retrain["curves"] = {name: record["curves"][name] for name in TIMING_CURVES
                         if name in record.get("curves", {})}
    kept = dict(record, curves=dict(record.get("curves", {})))
    for key in TIMING_FIELDS:
        if key in expected:
            kept[key] = expected[key]
    for name in TIMING_CURVES:
        if name in expected.get("curves", {}):
            kept["curves"][name] = expected["curves"][name]
    reproduction["retrain"] = retrain
    kept["reproduction"] = reproduction
    return kept


def check_reproduction(run_dir: str, record: dict[str, Any],
                       log: Callable[[str], None] = print) -> dict[str, Any]:
    """Compares a just-retrained run with its published record (``expected_run.json``;
    without one ``record`` is returned as it is).

    Equal curves (:data:`REPRODUCED_CURVES`, every step, exactly as JSON stores them)
    mean the same trajectory from the same seed, so the same samples: the published
    ``evaluation.json`` and ``authors_protocol.json`` stand for the retrained run, and so
    does the published timing (:func:`keep_published_timing`: the study's speed figure
    is the two sides' runs back to back, not a retrain beside other jobs).  Any
    difference (another CPU kind or oneDNN setting can change TF's round-off) is logged
    with its first step: the retrained run is then a new run of that seed, and the
    published files of the old one are removed, to be made afresh.  Either way ``record``
    gains ``reproduction`` saying which."""
    expected_path = os.path.join(run_dir, EXPECTED_RUN_FILE)
    if not os.path.exists(expected_path):
        return record
    with open(expected_path) as stream:
        expected = json.load(stream)
    mine = json.loads(json.dumps(record["curves"]))
    first = None                       # the earliest differing step over the curves
    for name in REPRODUCED_CURVES:
        theirs, ours = expected["curves"].get(name, []), mine.get(name, [])
        step = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                    min(len(ours), len(theirs)))
        if ours != theirs and (first is None or step + 1 < first["step"]):
            first = {"curve": name, "step": step + 1,
                     "published": theirs[step] if step < len(theirs) else None,
                     "retrained": ours[step] if step < len(ours) else None}
    name = os.path.basename(os.path.normpath(run_dir))
    record = dict(record, reproduction={"of": EXPECTED_RUN_FILE, "equal": first is None,
                                        "first_difference": first})
    if first is None:
        record = keep_published_timing(record, expected)
        log(f"{name} reproduces its published run step for step "
            f"({', '.join(REPRODUCED_CURVES)}): its published evaluations and timing "
            f"stand (the retrain's timing is kept under reproduction.retrain)")
    else:
        for stale in (EVALUATION_FILE, AUTHORS_PROTOCOL_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(run_dir, stale))
        log(f"WARNING: {name} did NOT reproduce its published run: {first['curve']} at step "
            f"{first['step']} is {first['retrained']!r}, published {first['published']!r} "
            f"(this machine's numerics differ). The retrained run replaces the published "
            f"one; its evaluations are made afresh.")
    return record


def samples_of(study: Study, side: str, index: int, log: Callable[[str], None] = print
               ) -> str:
    """The path of a trained run's ``samples.npz``; a run restored without them
    (:func:`restore`) is first retrained from its seed and checked against its published
    record (:func:`check_reproduction`; its new ``run.json`` is written last)."""
    run_dir = study.run_dir(side, index)
    path = os.path.join(run_dir, "samples.npz")
    if os.path.exists(path):
        return path
    if not os.path.exists(os.path.join(run_dir, EXPECTED_RUN_FILE)):
        raise SideBySideError(f"{path} is missing and {run_dir} was not restored from a "
                              f"published study: delete {run_dir} to train the run again")
    seed = run_seed(study.root_seed, side, index)
    log(f"retraining {side} run {index} (seed {seed}): its samples were lost")
    record = RUNNERS[side](study.repo, study.config, seed, run_dir, log=log)
    record = check_reproduction(run_dir, record, log)
    export.write_json(os.path.join(run_dir, RUN_FILE), record)
    return path


def _done(path: str) -> bool:
    return os.path.exists(path)


def train(study: Study, log: Callable[[str], None] = print) -> None:
    """Phase 1: every missing run, authors' run i then dclens' run i.

    Several processes may train one study's runs at once: each claims a run before it
    trains it (:func:`claim_run`)."""
    for side, index in study.selected():
        run_dir = study.run_dir(side, index)
        if _done(os.path.join(run_dir, RUN_FILE)):
            continue
        os.makedirs(run_dir, exist_ok=True)
        with claim_run(run_dir, log, TRAIN_CLAIM_FILE) as claimed:
            if not claimed or _done(os.path.join(run_dir, RUN_FILE)):
                continue
            log(f"training {side} run {index} (seed {run_seed(study.root_seed, side, index)})")
            record = RUNNERS[side](study.repo, study.config,
                                   run_seed(study.root_seed, side, index), run_dir, log=log)
            export.write_json(os.path.join(run_dir, RUN_FILE), record)
            log(f"{side} run {index}: {record['steps']} steps, epsilon "
                f"{record['epsilon']:.4f}, {record['seconds_per_step']:.2f} s per step")


def _trained(study: Study) -> list[tuple[str, int, str]]:
    return [(side, index, study.run_dir(side, index)) for side, index in study.selected()
            if _done(os.path.join(study.run_dir(side, index), RUN_FILE))]


def _claimed_samples(study: Study, side: str, index: int, run_dir: str,
                     log: Callable[[str], None]) -> str | None:
    """:func:`samples_of` under the training claim of the run in ``run_dir`` (a
    retraining is training); None when another process holds it."""
    with claim_run(run_dir, log, TRAIN_CLAIM_FILE) as claimed:
        return samples_of(study, side, index, log) if claimed else None


def _pending(study: Study, name: str, what: str, log: Callable[[str], None]
             ) -> Iterator[tuple[str, data.LabeledImages, str, str]]:
    """(run folder, its samples, the file to write) for every trained run without
    ``name``, announced as ``what``."""
    for side, index, run_dir in _trained(study):
        target = os.path.join(run_dir, name)
        if _done(target):
            continue
        samples = _claimed_samples(study, side, index, run_dir, log)
        if samples is None or _done(target):   # a reproduced run's published file stands
            continue
        log(f"{what} {side} run {index}")
        synthetic, kind = load_synthetic(samples, "fashion_mnist")
        yield run_dir, synthetic, kind, target


def evaluate_runs(study: Study, *, data_dir: str | None = None,
                  cache_dir: str | None = None, log: Callable[[str], None] = print) -> None:
    """Phase 2 for every trained run without ``evaluation.json``."""
    test = evaluate.load_test("fashion_mnist", data_dir, limit=study.evaluation.test_limit)
    settings = study.evaluation.replace(authors=None)
    for _, synthetic, kind, target in _pending(study, EVALUATION_FILE, "evaluating", log):
        record = evaluate.evaluate(synthetic, test, settings, data_dir=data_dir,
                                   cache_dir=cache_dir, input_kind=kind, log=log)
        export.write_json(target, record)


def authors_protocol_runs(study: Study, *, data_dir: str | None = None,
                          log: Callable[[str], None] = print) -> None:
    """Phase 3 for every trained run without ``authors_protocol.json`` (none when the study
    has no authors' protocol).  Their script reads the first pickles: the first samples of
    ``samples.npz`` on both sides (the same rows, in the same order).

    Several processes may run this phase of one study at once (e.g. two with one thread
    each, which on a 2-core CPU finish more runs per hour than one with two): each claims
    a run with a lock file before it starts it (:func:`claim_run`) and skips runs claimed
    by a live process."""
    if study.authors is None:
        return
    test = evaluate.load_test("fashion_mnist", data_dir, limit=study.evaluation.test_limit)
    for side, index, run_dir in _trained(study):
        target = os.path.join(run_dir, AUTHORS_PROTOCOL_FILE)
        if _done(target):
            continue
        with claim_run(run_dir, log) as claimed:
            if not claimed or _done(target):
                continue
            samples = _claimed_samples(study, side, index, run_dir, log)
            if samples is None or _done(target):   # a reproduced run's file stands
                continue
            log(f"the authors' protocol on {side} run {index}")
            synthetic, _ = load_synthetic(samples, "fashion_mnist")
            entry = evaluate.run_authors_protocol(
                synthetic, test, study.authors, seed=study.evaluation.seeds()["init"],
                state_path=os.path.join(run_dir, "authors_protocol_state.npz"), log=log)
            export.write_json(target, entry)


#: A run's claim by the process working on its authors' protocol: "<host> <pid>".
CLAIM_FILE = "authors_protocol.claim"
#: A run's claim by the process training it.
TRAIN_CLAIM_FILE = "train.claim"


@contextlib.contextmanager
def claim_run(run_dir: str, log: Callable[[str], None],
              name: str = CLAIM_FILE) -> Iterator[bool]:
    """Yields whether this process holds ``run_dir``'s claim ``name`` (created atomically
    with O_EXCL; removed on leaving).  A claim left by a process of this host that is gone
    is taken over; one of another host is respected and named (delete the file if no
    process there works on the run)."""
    path = os.path.join(run_dir, name)
    mine = f"{socket.gethostname()} {os.getpid()}"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _claim_holder(path)
            if holder is not None:
                log(f"skipping {run_dir}: claimed by {holder} ({path}; delete it if no "
                    "process works on that run)")
                yield False
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)            # the claim of a process that died
            continue
        with os.fdopen(fd, "w") as stream:
            stream.write(mine)
        try:
            yield True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return
    yield False


def _claim_holder(path: str) -> str | None:
    """The live holder of a claim, or None when it is stale (its process is gone)."""
    try:
        with open(path) as stream:
            host, pid = stream.read().split()
    except (OSError, ValueError):
        return None                        # unreadable or half-written: stale
    if host != socket.gethostname():
        return f"process {pid} on {host}"
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return f"process {pid}"


def run_study(study: Study, *, data_dir: str | None = None, cache_dir: str | None = None,
              phases: tuple[str, ...] = PHASES, restore_from: str | None = None,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """The phases asked for, in order, then :func:`summarize`; with ``restore_from`` (a
    published study) the study's directory is first seeded from it (:func:`restore`)."""
    open_study(study)
    if restore_from is not None:
        restore(study, restore_from, log)
    if "train" in phases:
        train(study, log)
    if "evaluate" in phases:
        evaluate_runs(study, data_dir=data_dir, cache_dir=cache_dir, log=log)
    if "authors_protocol" in phases:
        authors_protocol_runs(study, data_dir=data_dir, log=log)
    return summarize(study.directory)


# --------------------------------------------------------------------------- comparison
#: The measures compared, each read from a run's files: (label, file, reader).
MEASURES: dict[str, tuple[str, str, Callable[[dict], float]]] = {
    "val": ("`val` accuracy (epoch chosen on held-out synthetic data)", EVALUATION_FILE,
            lambda r: r["protocols"]["val"]["accuracy"]),
    "sen": ("`sen` accuracy (best real-test accuracy over epochs)", EVALUATION_FILE,
            lambda r: r["protocols"]["sen"]["accuracy"]),
    "authors_range1": ("the authors' protocol, range 1", AUTHORS_PROTOCOL_FILE,
                       lambda r: r["accuracy"]),
    "fid": ("domain-classifier FID to the real test set", EVALUATION_FILE,
            lambda r: r["quality"]["fid"] if r.get("quality") else None),
    "label_agreement": ("label agreement (real-data classifier agrees with the label)",
                        EVALUATION_FILE,
                        lambda r: r["quality"]["label_agreement"] if r.get("quality")
                        else None),
    "epsilon": ("epsilon spent (classic conversion)", RUN_FILE, lambda r: r["epsilon"]),
    "steps": ("generator steps", RUN_FILE, lambda r: r["steps"]),
    "seconds_per_step": ("seconds per generator step (after the first)", RUN_FILE,
                         lambda r: r["seconds_per_step_after_first"]),
}


def welch_interval(a: list[float], b: list[float], level: float = 0.95
                   ) -> tuple[float, float, float, float]:
    """mean(b) - mean(a) with its Welch t interval: (difference, low, high, degrees of
    freedom).  NaN bounds with fewer than two values on a side; zero-width when both
    sides have no spread."""
    from scipy import stats

    a_arr, b_arr = np.asarray(a, float), np.asarray(b, float)
    difference = float(b_arr.mean() - a_arr.mean())
    if len(a_arr) < 2 or len(b_arr) < 2:
        return difference, float("nan"), float("nan"), float("nan")
    va, vb = a_arr.var(ddof=1) / len(a_arr), b_arr.var(ddof=1) / len(b_arr)
    se = float(np.sqrt(va + vb))
    if se == 0.0:
        return difference, difference, difference, float("inf")
    dof = (va + vb) ** 2 / (va ** 2 / (len(a_arr) - 1) + vb ** 2 / (len(b_arr) - 1))
    half = float(stats.t.ppf(0.5 + level / 2, dof)) * se
    return difference, difference - half, difference + half, float(dof)


def _read(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as stream:
        return json.load(stream)


def summarize(directory: str) -> dict[str, Any]:
    """Every finished run's measures and curves, and per measure each side's mean, sd, n
    and the Welch 95% interval of dclens minus the authors."""
    settings = _read(os.path.join(directory, STUDY_FILE))
    if settings is None:
        raise SideBySideError(f"{directory} is not a whole-run study (no {STUDY_FILE})")
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for index in range(settings["runs"]):
        for side in SIDES:
            folder = os.path.join(directory, f"{side}-{index}")
            run = _read(os.path.join(folder, RUN_FILE))
            if run is None:
                continue
            files = {name: _read(os.path.join(folder, name))
                     for name in (RUN_FILE, EVALUATION_FILE, AUTHORS_PROTOCOL_FILE)}
            values = {key: (reader(files[name]) if files[name] is not None else None)
                      for key, (_, name, reader) in MEASURES.items()}
            runs[side].append({"index": index, "seed": run["seed"], "values": values,
                               "curves": run["curves"],
                               "setup_seconds": run["setup_seconds"],
                               "wall_seconds": run["wall_seconds"],
                               "machine": run.get("machine")})
    comparison = {}
    for key, (label, _, _) in MEASURES.items():
        per_side = {side: [r["values"][key] for r in runs[side]
                           if r["values"][key] is not None] for side in SIDES}
        entry = {"label": label,
                 **{side: _stats(values) for side, values in per_side.items()}}
        if all(per_side.values()):
            difference, low, high, dof = welch_interval(per_side["authors"],
                                                        per_side["dclens"])
            entry["difference"] = {"dclens_minus_authors": difference, "low": low,
                                   "high": high, "dof": dof, "level": 0.95}
        comparison[key] = entry
    return {"settings": settings, "runs": runs, "comparison": comparison}


def _stats(values: list[float]) -> dict[str, Any]:
    n, mean, sd = reporting.mean_sd(values)
    return {"n": n, "values": [float(v) for v in values], "mean": mean, "sd": sd}
