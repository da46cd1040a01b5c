"""What a run directory (``--run_dir``; main.py's ``--checkpoint_dir``) holds, and whether a
new command may use it.

Layout::

    <run>/config.json          the resolved configuration (written first: marks a dclens run)
    <run>/ledger.json          the write-ahead privacy journal (dclens.runs.journal)
    <run>/privacy.json         the privacy report, rewritten after every step
    <run>/checkpoints/         PRIVATE: seed.json (the root seed, hence the DP noise) and
                               ckpt-<step>/ (teachers, generator, optimizer, state)
    <run>/logs/                TensorBoard
    <run>/generator.keras, samples.npz, samples.png, eps-*.data-*.pkl   the outputs
    <run>/model.keras, report.json                 DP-SGD's and GS-WGAN's outputs

:class:`RunPaths` names every one of them; no trainer spells a file name itself.

A command given an existing run directory resumes it, provided every setting matches the
saved one except those the trainer lets change (DataLens:
:data:`dclens.datalens.resume.CHANGEABLE_ON_RESUME`); otherwise it is refused with the
differing settings named.  ``--restart`` renames the old directory to
``<run>.old-<timestamp>`` (never deletes it) and starts over.  :func:`plan_run` decides and
changes nothing (it probes writability with an anonymous temporary file).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import time
from typing import Any, Callable, Mapping

from dclens.common import export
from dclens.common.provenance import provenance
from dclens.common.rng import entropy_seed
from dclens.runs import journal as journal_lib
from dclens.runs.output_checks import RunDirError, check_output_dir, check_run_kind

#: The folder a disk-backed teacher bank lives in (inside a checkpoint folder).
BANK_FOLDER = "bank"
#: The folder of a run's checkpoint directory that holds one folder per shard.
SHARDS_FOLDER = "shards"


#: The folders a re-sampling of a finished run writes into (``<run>/samples-2``, ...):
#: sets of the same released generator, so they belong to that run's settings.
SAMPLE_SET_PREFIX = "samples-"


def sample_set_folder(run_dir: str, number: int) -> str:
    """The ``number``-th extra sample set of ``run_dir`` (``number`` >= 2; the run's own
    samples are the first)."""
    if number < 2:
        raise ValueError(f"extra sample sets are numbered from 2, got {number!r}")
    return os.path.join(run_dir, f"{SAMPLE_SET_PREFIX}{number}")


def run_of_sample_set(folder: str) -> str | None:
    """The run directory ``folder`` is an extra sample set of (its parent, when ``folder``
    is named ``samples-<n>`` with n >= 2 and the parent holds a ``config.json``), else
    None."""
    folder = os.path.abspath(folder)
    name = os.path.basename(folder)
    number = name[len(SAMPLE_SET_PREFIX):]
    if not (name.startswith(SAMPLE_SET_PREFIX) and number.isdigit() and int(number) >= 2):
        return None
    parent = os.path.dirname(folder)
    return parent if os.path.isfile(RunPaths(parent).config) else None


def shard_folder(checkpoint_dir: str, index: int) -> str:
    """Shard ``index``'s checkpoint folder inside a run's ``checkpoint_dir``."""
    return os.path.join(checkpoint_dir, SHARDS_FOLDER, f"shard-{index:03d}")


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """The files of a run directory."""

    root: str

    def _join(self, *names: str) -> str:
        return os.path.join(self.root, *names)

    @property
    def config(self) -> str:
        return self._join("config.json")

    @property
    def journal(self) -> str:
        return self._join("ledger.json")

    @property
    def privacy(self) -> str:
        return self._join("privacy.json")

    @property
    def checkpoints(self) -> str:
        return self._join("checkpoints")

    @property
    def seed(self) -> str:
        return self._join("checkpoints", "seed.json")

    @property
    def logs(self) -> str:
        return self._join("logs")

    @property
    def readme(self) -> str:
        """``README.md``: what each file of the run is and which may be published."""
        return self._join("README.md")

    # What a finished run writes (the outputs) and what a method keeps beside them.
    @property
    def samples(self) -> str:
        """``samples.npz``: x float32 [N, H, W, C] in [0, 1], y int64 [N]."""
        return self._join("samples.npz")

    @property
    def grid(self) -> str:
        """``samples.png``: one row of samples per class."""
        return self._join("samples.png")

    @property
    def generator(self) -> str:
        """``generator.keras``: a generative method's trained generator."""
        return self._join("generator.keras")

    @property
    def model(self) -> str:
        """``model.keras``: a private classifier's chosen weights (DP-SGD, GEP)."""
        return self._join("model.keras")

    @property
    def report(self) -> str:
        """``report.json``: a method's summary of the run (GS-WGAN, DP-SGD)."""
        return self._join("report.json")

    @property
    def bank(self) -> str:
        """``checkpoints/bank``: the teachers' state on disk when it does not fit in RAM."""
        return self._join("checkpoints", BANK_FOLDER)

    @property
    def shards(self) -> str:
        """``checkpoints/shards``: one folder of checkpoints per shard worker."""
        return self._join("checkpoints", SHARDS_FOLDER)

    @property
    def discriminators(self) -> str:
        """``discriminators.npy``: GS-WGAN's discriminator bank, **private**."""
        return self._join("discriminators.npy")

    @property
    def warm_start_progress(self) -> str:
        """``warmstart.json``: how many GS-WGAN discriminators the warm-start has done."""
        return self._join("warmstart.json")

    @property
    def votes(self) -> str:
        """``votes/``: the released updates (and raw vote sums) of ``--save_vote``."""
        return self._join("votes")


class Mode(enum.Enum):
    FRESH = "fresh"
    RESUME = "resume"


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What :func:`plan_run` decided: start fresh (after setting an old run aside) or resume."""

    mode: Mode
    paths: RunPaths
    set_aside: bool = False


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"epochs": 3}} -> {"train.epochs": 3}."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def config_differences(saved: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(setting, saved value, new value) for every setting that differs, sorted by name."""
    old, now = flatten(saved), flatten(new)
    return [(name, old.get(name), now.get(name)) for name in sorted(set(old) | set(now))
            if old.get(name) != now.get(name)]


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    """{"train.epochs": 3} -> {"train": {"epochs": 3}} (the inverse of :func:`flatten`)."""
    nested: dict[str, Any] = {}
    for name, value in flat.items():
        *sections, key = name.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return nested


def describe_differences(differences: list[tuple[str, Any, Any]],
                         privacy_relevant: frozenset[str] = frozenset()) -> str:
    """'name (privacy-relevant): saved X, now Y; ...' (the tag for names in
    ``privacy_relevant``)."""
    parts = []
    for name, old, new in differences:
        tag = " (privacy-relevant)" if name in privacy_relevant else ""
        parts.append(f"{name}{tag}: saved {old!r}, now {new!r}")
    return "; ".join(parts)


def read_run_record(paths: RunPaths) -> dict[str, Any]:
    """A run's whole config.json: the ``config`` section and the facts
    :func:`create_run_files` wrote beside it."""
    try:
        with open(paths.config, encoding="utf-8") as stream:
            record = json.load(stream)
        if not isinstance(record, dict):
            raise TypeError(f"a {type(record).__name__}, not an object")
        return record
    except (OSError, ValueError, TypeError) as error:
        raise RunDirError(f"{paths.config} cannot be read ({error}); the run directory is "
                          "damaged: pass --restart to set it aside and start over") from error


def read_saved_config(paths: RunPaths) -> dict[str, Any]:
    """The ``config`` section of a run's config.json."""
    try:
        return read_run_record(paths)["config"]
    except KeyError as error:
        raise RunDirError(f"{paths.config} cannot be read ({error!r} is missing); the run "
                          "directory is damaged: pass --restart to set it aside and start "
                          "over") from error


def _never_began(paths: RunPaths) -> bool:
    """Whether the folder holds no run: it lacks config.json (a run's first file) and
    holds nothing but what a start killed before config.json leaves behind: temporary
    files of atomic writes cut short (``.tmp-*``, :func:`dclens.common.export.atomic_path`)
    and teachers' banks being created (``checkpoints/bank``, a shard's
    ``checkpoints/shards/shard-*/bank``: a paper-scale bank takes minutes to write, before
    config.json).  Such a start spent nothing and released nothing (the journal comes
    after config.json), so the run may begin afresh; a bank is rewritten by the new one."""
    if os.path.exists(paths.config):
        return False
    for folder, _, files in os.walk(paths.root):
        parts = os.path.relpath(folder, paths.root).split(os.sep)
        in_bank = (parts[:2] == ["checkpoints", BANK_FOLDER]
                   or (parts[:2] == ["checkpoints", SHARDS_FOLDER] and len(parts) >= 4
                       and parts[3] == BANK_FOLDER))
        if not in_bank and any(not name.startswith(export.TEMPORARY_PREFIX)
                               for name in files):
            return False
    return True


def plan_run(config, output_dir: str, *, differences_of, kind: str, flag: str,
             restart: bool = False,
             privacy_relevant: frozenset[str] = frozenset(),
             offers_restart: bool = True) -> RunPlan:
    """Decides fresh / resume / refuse for ``output_dir``; reads only, creates nothing.

    ``config``: any config with ``to_dict()``; ``differences_of(saved_dict, config)``
    lists the settings that forbid resuming (each trainer's rule: DataLens'
    :func:`dclens.datalens.resume.resume_differences`, or :func:`differences_except`).
    ``kind``: the trainer's key in :data:`dclens.runs.output_checks.RUN_KINDS` (a run of
    another trainer is refused as such); ``flag``: the command-line option that named
    ``output_dir``, as the messages quote it; ``privacy_relevant``: settings the refusal
    tags as such; ``offers_restart``: the command has ``--restart`` (the refusals then
    suggest it).

    Raises:
      RunDirError: the path is a file or not writable; the folder holds something that is
        not a dclens run, or another trainer's run; or it holds a run whose settings
        differ (named in the message).
    """
    paths = RunPaths(output_dir)
    check_output_dir(output_dir, flag)
    if not os.path.isdir(output_dir) or _never_began(paths):
        return RunPlan(Mode.FRESH, paths)
    if restart:
        return RunPlan(Mode.FRESH, paths, set_aside=True)
    if not os.path.exists(paths.config):
        found = sorted(os.listdir(output_dir))
        raise RunDirError(
            f"{flag} {output_dir!r} is not empty and is not a dclens run (it holds "
            f"{', '.join(found[:5])}{', ...' if len(found) > 5 else ''}); choose a new or "
            "empty directory" + (", or pass --restart to move it aside" if offers_restart
                                 else "") + " (nothing was changed)")
    check_run_kind(output_dir, kind, flag=flag, restart=offers_restart)
    differences = differences_of(read_saved_config(paths), config)
    if differences:
        raise RunDirError(
            f"{flag} {output_dir!r} holds a run with other settings, so it cannot "
            f"be resumed: {describe_differences(differences, privacy_relevant)}. Resume "
            f"with the saved settings (see {paths.config})"
            + (f", choose a new {flag}, or pass --restart to set the old run aside and "
               "start over" if offers_restart else f" or choose a new {flag}")
            + " (nothing was changed)")
    return RunPlan(Mode.RESUME, paths)


def root_seed(plan: RunPlan, seed: int | None) -> int:
    """The run's root seed: the saved one when resuming, else ``seed`` (--seed), else fresh
    OS entropy.  Refuses a resume whose seed file is gone but whose journal records spends
    (its noise could not be drawn afresh consistently)."""
    resuming = plan.mode is Mode.RESUME
    if resuming and os.path.exists(plan.paths.seed):
        with open(plan.paths.seed, encoding="utf-8") as stream:
            return int(json.load(stream)["root_seed"])
    if resuming and os.path.exists(plan.paths.journal):
        raise RunDirError(f"{plan.paths.seed} is missing but {plan.paths.journal} records "
                          "spends: the run cannot be resumed; pass --restart")
    return seed if seed is not None else entropy_seed()


@dataclasses.dataclass(frozen=True)
class Restored:
    """Where a resumed loop stands: its step, curves, whether it had finished, the
    journaled spends the crash lost (still counted), and the checkpoint's own state
    (empty without a checkpoint) for what a trainer saved beside these."""

    start: int
    curves: list
    finished: bool
    lost: list
    state: dict = dataclasses.field(default_factory=dict)


def open_journal(paths: RunPaths, latest, *, new_ledger: Callable[[], Any] | None = None):
    """The write-ahead journal of a run being resumed (``latest``: its newest checkpoint).

    A run writes its journal before its first spend, so a missing journal is refused
    whenever the run may have spent: the checkpoint counts journal entries, or
    ``privacy.json`` exists (a run of an older dclens, without a journal, or a damaged
    one).  With ``new_ledger`` (DataLens), a run showing neither -- a crash between its
    config.json and its journal's first write -- gets a new empty journal over
    ``new_ledger()``; without it the missing journal is refused as unreadable.
    """
    if os.path.exists(paths.journal):
        return journal_lib.PrivacyJournal.load(paths.journal)
    if latest is not None and latest.state["journal_entries"] > 0:
        raise RunDirError(f"{paths.journal} is missing but the checkpoint {latest.path} "
                          "saw spends: the privacy ledger is lost; the run cannot be resumed "
                          "(pass --restart, and count the old run's spends yourself)")
    if os.path.exists(paths.privacy):
        # Runs write ledger.json before their first step; privacy.json without it is a run
        # of an older dclens (or a damaged one) whose spends the journal would not know.
        raise RunDirError(f"{paths.privacy} exists but {paths.journal} does not: "
                          "this run was written by an older dclens without a privacy journal "
                          "(or damaged), so it cannot be resumed with a complete ledger; pass "
                          "--restart to set it aside and start over")
    if new_ledger is None:
        return journal_lib.PrivacyJournal.load(paths.journal)     # refuses: not found
    return journal_lib.PrivacyJournal(paths.journal, new_ledger())


def restore_latest(store, journal, *, root_seed: int, seed_path: str, load,
                   curve_key: str = "curves", not_lost: int = 0) -> Restored:
    """Loads the newest complete checkpoint of ``store`` (``load(checkpoint)`` restores
    the model from a :class:`dclens.runs.checkpoint.Checkpoint`) and marks the journal's
    spends after it as lost.  Refuses a checkpoint written under another root seed.  No
    checkpoint: step 0, all spends lost but the first ``not_lost`` (spends made before
    training whose outputs live elsewhere, e.g. a warm start's release).  ``curve_key``:
    the state's key of the curves (DataLens' checkpoints say ``curve``)."""
    store.remove_partial()
    latest = store.latest()
    start, curves, finished, state = 0, [], False, {}
    entries = min(not_lost, len(journal.entries))
    if latest is not None:
        if latest.state["root_seed"] != root_seed:
            raise RunDirError(f"{latest.path} was written with another root seed than "
                              f"{seed_path}: the run directory is damaged; --restart")
        load(latest)
        start, curves = latest.step, list(latest.state[curve_key])
        entries = latest.state["journal_entries"]
        finished = bool(latest.state.get("finished"))
        state = dict(latest.state)
    lost = journal.resume(entries_at_checkpoint=entries, resumed_from_step=start)
    return Restored(start, curves, finished, lost, state)


def differences_except(changeable: frozenset[str],
                       implied: Mapping[str, Any] | None = None):
    """A ``differences_of`` for :func:`plan_run` over flat ``to_dict()`` configs that lets
    the settings in ``changeable`` differ on resume.

    A setting the saved config lacks was added after the run was made; its default is
    what dclens did before it existed (the rule for new settings), so it counts as equal
    when the new config leaves it at that default.  ``implied`` names the exceptions: a
    setting added with a default that is *not* what dclens did before (a safer
    behaviour made the default), mapped to the value older runs had; a saved config that
    lacks it has that value, and a resume at any other is refused by name.
    """
    implied = dict(implied or {})

    def differences(saved: dict[str, Any], config) -> list[tuple[str, Any, Any]]:
        defaults = _defaults_of(config)
        out = []
        for name, old, new in config_differences(saved, config.to_dict()):
            if name in changeable:
                continue
            if name not in saved and name in implied:
                if implied[name] != new:
                    out.append((name, implied[name], new))
                continue
            if name not in saved and name in defaults and defaults[name] == new:
                continue
            out.append((name, old, new))
        return out
    return differences


def _defaults_of(config) -> dict[str, Any]:
    """The flat ``to_dict()`` of the config class's defaults ({} if it has none)."""
    try:
        return type(config)().to_dict()
    except (TypeError, ValueError):
        return {}


def set_aside(output_dir: str) -> str:
    """Renames ``output_dir`` to ``<output_dir>.old-<timestamp>[-n]``; returns the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = f"{os.path.normpath(output_dir)}.old-{stamp}"
    target, n = base, 1
    while os.path.exists(target):
        target, n = f"{base}-{n}", n + 1
    os.rename(output_dir, target)
    return target


@dataclasses.dataclass(frozen=True)
class OpenedRun:
    """A run directory ready for a trainer: its paths, whether it resumes, its root seed."""

    paths: RunPaths
    resuming: bool
    root_seed: int


def write_seed(paths: RunPaths, root_seed: int, *, seeded: bool) -> None:
    """checkpoints/seed.json: the root seed a resume must reuse (PRIVATE: it fixes the DP
    noise); ``seeded`` says it came from --seed rather than OS entropy."""
    export.write_json(paths.seed, {"root_seed": root_seed, "from_os_entropy": not seeded})


def open_run(config, output_dir: str, *, kind: str, restart: bool,
             changeable: frozenset[str], log: Callable[[str], None],
             implied: Mapping[str, Any] | None = None) -> OpenedRun:
    """:func:`plan_run` for a flat ``to_dict()`` config (settings in ``changeable`` may
    differ on resume; ``implied``: :func:`differences_except`), the old run set aside
    under ``restart``, and the root seed (:func:`root_seed` from ``config.seed``).  Used
    by the trainers beside DataLens'."""
    plan = plan_run(config, output_dir, restart=restart, kind=kind,
                    differences_of=differences_except(changeable, implied), flag="--run_dir")
    if plan.set_aside:
        log(f"set the old run aside: {set_aside(output_dir)}")
    return OpenedRun(plan.paths, plan.mode is Mode.RESUME, root_seed(plan, config.seed))


#: The marker file of a folder that must not be published.
PRIVATE_MARKER = "PRIVATE"

_PRIVATE_TEXT = ("PRIVATE: do not publish this folder. {why}\n"
                 "What a run directory holds and which files may be published: ../README.md\n")

_README = """# A dclens run directory ({kind})

Which files may be published (after checking the run's privacy.json):

| file | what it is | publish? |
|---|---|---|
| `config.json` | the settings, the command line, the dclens commit, package versions | yes |
| `privacy.json` | epsilon, delta, the unit of privacy, what the guarantee does not cover | yes |
| `ledger.json` | the write-ahead privacy journal: every spend, crashes included | yes |
| `samples.npz`, `samples.png`, `eps-*.data-*.pkl`, `samples-<n>/` | synthetic samples | yes, if privacy.json says the run is private |
| `generator.keras` / `model.keras` | the trained generator / classifier | yes, if privacy.json says the run is private |
| `report.json` | the method's summary | yes |
| `checkpoints/` | the root seed (hence every noise draw), the private models' state (teachers, discriminators), resume state | **no** (PRIVATE) |
| `logs/` | TensorBoard, including diagnostics computed on the private records without noise | **no** (PRIVATE) |
| `votes/` | `--save_vote`: released updates; with raw vote sums it is PRIVATE (see its marker) | only without raw sums |

A run made with `--seed` or `--non_private` is not private, whatever it writes.
"""


def mark_private(paths: RunPaths) -> None:
    """The run's README.md and the PRIVATE markers of its private folders (idempotent)."""
    os.makedirs(paths.checkpoints, exist_ok=True)
    os.makedirs(paths.logs, exist_ok=True)
    for folder, why in ((paths.checkpoints, "It holds the run's root seed, from which every "
                         "DP noise draw can be recomputed, and the private models' state."),
                        (paths.logs, "It holds diagnostics computed on the private records "
                         "without noise (e.g. the teachers' or critics' loss).")):
        marker = os.path.join(folder, PRIVATE_MARKER)
        if not os.path.exists(marker):
            export.atomic_write(marker, lambda s, why=why: s.write(
                _PRIVATE_TEXT.format(why=why)), mode="w")


def write_run_readme(paths: RunPaths, kind: str) -> None:
    """``<run>/README.md``: what each file is and which may be published."""
    export.atomic_write(paths.readme, lambda s: s.write(_README.format(kind=kind)), mode="w")


def complete_run_files(paths: RunPaths, *, kind: str, root_seed: int, seeded: bool) -> None:
    """On resume, the files :func:`create_run_files` writes after config.json that a crash
    between them left missing: the README, the PRIVATE markers and the seed file (the
    root seed :func:`root_seed` chose: a missing seed file is only resumable while the
    journal does not exist, i.e. before any spend).  Existing files are left alone."""
    if not os.path.exists(paths.readme):
        write_run_readme(paths, kind)
    mark_private(paths)
    if not os.path.exists(paths.seed):
        write_seed(paths, root_seed, seeded=seeded)


def create_run_files(paths: RunPaths, config_dict: dict[str, Any], *, kind: str,
                     facts: dict[str, Any], root_seed: int, seeded: bool, ledger):
    """A fresh run's files, in the order that keeps a crash safe: config.json (marks the
    folder a dclens run: the settings ``config_dict``, ``kind``, ``facts``, whether the
    noise is reproducible, the provenance), the README and PRIVATE markers, the PRIVATE
    seed file, and an empty write-ahead journal over ``ledger``, which is returned
    (``dclens.runs.journal.PrivacyJournal``).  Every trainer creates its run here."""
    # config.json first and alone (its atomic write makes the folder): a kill before it
    # lands leaves nothing but, at most, its temporary file, which plan_run reads as a
    # run that never began; checkpoints/ comes with the PRIVATE markers after it.
    export.write_json(paths.config, {"config": config_dict, "kind": kind, **facts,
                                     "reproducible_noise": seeded,
                                     "provenance": provenance()})
    write_run_readme(paths, kind)
    mark_private(paths)
    write_seed(paths, root_seed, seeded=seeded)
    journal = journal_lib.PrivacyJournal(paths.journal, ledger)
    journal.write()
    return journal
