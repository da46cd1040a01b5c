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

    def __post_init__(self) -> None:
        if isinstance(self.runs, bool) or not isinstance(self.runs, int) or self.runs < 1:
            raise SideBySideError(f"runs must be an integer >= 1, got {self.runs!r}")
        if self.authors is not None and self.authors.real_rows > self.config.samples:
            raise SideBySideError(
                f"the authors' protocol reads {self.authors.real_rows} samples but each run "
                f"writes {self.config.samples}; raise samples or lower the protocol's rows")

    def run_dir(self, side: str, index: int) -> str:
        return os.path.join(self.directory, f"{side}-{index}")

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


def _done(path: str) -> bool:
    return os.path.exists(path)


def train(study: Study, log: Callable[[str], None] = print) -> None:
    """Phase 1: every missing run, authors' run i then dclens' run i."""
    for index in range(study.runs):
        for side in SIDES:
            run_dir = study.run_dir(side, index)
            if _done(os.path.join(run_dir, RUN_FILE)):
                continue
            log(f"training {side} run {index} (seed {run_seed(study.root_seed, side, index)})")
            record = RUNNERS[side](study.repo, study.config,
                                   run_seed(study.root_seed, side, index), run_dir, log=log)
            export.write_json(os.path.join(run_dir, RUN_FILE), record)
            log(f"{side} run {index}: {record['steps']} steps, epsilon "
                f"{record['epsilon']:.4f}, {record['seconds_per_step']:.2f} s per step")


def _trained(study: Study) -> list[tuple[str, int, str]]:
    return [(side, index, study.run_dir(side, index)) for index in range(study.runs)
            for side in SIDES if _done(os.path.join(study.run_dir(side, index), RUN_FILE))]


def _pending(study: Study, name: str, what: str, log: Callable[[str], None]
             ) -> Iterator[tuple[str, data.LabeledImages, str, str]]:
    """(run folder, its samples, the file to write) for every trained run without
    ``name``, announced as ``what``."""
    for side, index, run_dir in _trained(study):
        target = os.path.join(run_dir, name)
        if _done(target):
            continue
        log(f"{what} {side} run {index}")
        synthetic, kind = load_synthetic(os.path.join(run_dir, "samples.npz"), "fashion_mnist")
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
            log(f"the authors' protocol on {side} run {index}")
            synthetic, _ = load_synthetic(os.path.join(run_dir, "samples.npz"),
                                          "fashion_mnist")
            entry = evaluate.run_authors_protocol(
                synthetic, test, study.authors, seed=study.evaluation.seeds()["init"],
                state_path=os.path.join(run_dir, "authors_protocol_state.npz"), log=log)
            export.write_json(target, entry)


#: A run's claim by the process working on its authors' protocol: "<host> <pid>".
CLAIM_FILE = "authors_protocol.claim"


@contextlib.contextmanager
def claim_run(run_dir: str, log: Callable[[str], None]) -> Iterator[bool]:
    """Yields whether this process holds ``run_dir``'s claim (created atomically with
    O_EXCL; removed on leaving).  A claim left by a process of this host that is gone is
    taken over; one of another host is respected and named (delete the file if no
    process there works on the run)."""
    path = os.path.join(run_dir, CLAIM_FILE)
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
              phases: tuple[str, ...] = PHASES,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """The phases asked for, in order, then :func:`summarize`."""
    open_study(study)
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
