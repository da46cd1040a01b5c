"""Starting a DataLens generator from a finished DP-MERF run (``--warm_start RUN``).

The DP-MERF run (:mod:`dclens.datalens.merf`) released one noisy embedding of the same training
records and fitted a generator to it.  A DataLens run that starts from that generator
has used the release, so its ledger begins with the DP-MERF run's spends, read from that
run's write-ahead journal (``ledger.json``: every release, lost ones included) and
composed with every TopAgg query after them.  Both mechanisms are Gaussian with the same
unit of privacy (replacing one training record), so the composition is that of one
:class:`dclens.privacy.accounting.PrivacyLedger`.

What is refused, by name: a run that is not a finished DP-MERF run, one trained on other
records (dataset, training_records, max_records), one with reproducible noise (``--seed``)
unless this run is seeded too, and a generator of another architecture.  A DataLens run
records the DP-MERF run's :meth:`WarmStart.fingerprint` when it starts, and a resume refuses
a DP-MERF folder whose release, generator or spends have changed since (e.g. rerun with
``--restart``): its ledger counts the release it started from, not another.
"""

from __future__ import annotations

import dataclasses
import json
import os

import dp_accounting
import keras

from dclens.common import export
from dclens.datalens import networks
from dclens.privacy import accounting

#: What a warm start must match in the DP-MERF run's config (the same names in the
#: DataLens train config): the records it read and its generator.
SAME_SETTINGS = ("dataset", "training_records", "max_records", "z_dim",
                 "generator_filters", "generator_dense", "generator_upsampling")

#: The DP-MERF files a warm start depends on, fingerprinted by SHA-256.
FINGERPRINTED_FILES = ("release.npz", "generator.keras")


class WarmStartError(ValueError):
    """The warm-start run cannot start this DataLens run (the message says why)."""


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """A checked DP-MERF run: its folder and its spends (``(noise multiplier, count)``
    runs)."""

    path: str
    spends: tuple[tuple[float, int], ...]
    digests: tuple[tuple[str, str], ...] = ()

    @property
    def queries(self) -> int:
        return sum(count for _, count in self.spends)

    def events(self) -> list[dp_accounting.DpEvent]:
        """The spends as ``DpEvent`` s, for a ledger or a budget plan."""
        return [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), count)
                for z, count in self.spends]

    @property
    def generator_path(self) -> str:
        return os.path.join(self.path, "generator.keras")

    def fingerprint(self) -> dict:
        """What a DataLens run records of its warm start when it begins (config.json) and
        checks on every resume: the folder, the spends, and the SHA-256 of
        :data:`FINGERPRINTED_FILES`."""
        return {"run": self.path,
                "spends": [{"noise_multiplier": z, "count": count} for z, count in self.spends],
                "sha256": dict(self.digests)}


def check_unchanged(recorded: dict | None, warm_start: WarmStart) -> str | None:
    """Compares a resumed run's recorded :meth:`WarmStart.fingerprint` with the DP-MERF
    folder now; returns a warning for a run that recorded none (an older dclens).

    Raises:
      WarmStartError: the release, the generator or the spends differ (named).
    """
    if recorded is None:
        return (f"this run recorded no fingerprint of its warm start {warm_start.path} "
                f"(an older dclens): the DP-MERF folder is taken as unchanged")
    now = warm_start.fingerprint()
    changed = [name for name in ("spends", "sha256") if recorded.get(name) != now[name]]
    if changed:
        raise WarmStartError(
            f"the DP-MERF run {warm_start.path} has changed since this run started from it "
            f"({' and '.join(changed)} differ from config.json's 'warm_start'; was it rerun "
            f"with --restart?): this run's ledger counts the release it started from, not "
            f"this one. Put the original DP-MERF run back at that path, or start this run "
            f"over (--restart)")
    return None


def _sha256(path: str) -> str:
    try:
        return export.file_sha256(path)
    except OSError as error:
        raise WarmStartError(f"{path} cannot be read ({error}): --warm_start needs a "
                             f"finished DP-MERF run") from error


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path) as stream:
            return json.load(stream)
    except FileNotFoundError:
        raise WarmStartError(f"{path} is missing: --warm_start needs a finished DP-MERF "
                             f"run (scripts/merf.py --run_dir ...); {what}") from None
    except (OSError, ValueError) as error:
        raise WarmStartError(f"{path} cannot be read ({error})") from error


#: scripts/merf.py's flag for each of :data:`SAME_SETTINGS`.
MERF_FLAGS = {"dataset": "--dataset", "training_records": "--training_records",
              "max_records": "--max_records", "z_dim": "--z_dim",
              "generator_filters": "--gf_dim", "generator_dense": "--gfc_dim",
              "generator_upsampling": "--generator_upsampling"}


def _merf_flag(name: str, value) -> str:
    """The scripts/merf.py flag that sets ``name`` to ``value`` (``without --max_records``
    for None)."""
    flag = MERF_FLAGS[name]
    return f"without {flag}" if value is None else f"with {flag} {value}"


def _value(train_config, name: str):
    value = getattr(train_config, name)
    return getattr(value, "value", value)


def open_warm_start(path: str, train_config) -> WarmStart:
    """The DP-MERF run at ``path``, checked against the DataLens ``train_config``
    (:class:`dclens.datalens.config.TrainConfig`)."""
    saved = _read_json(os.path.join(path, "config.json"), "its config.json says what it is")
    if saved.get("kind") != "merf":
        raise WarmStartError(f"{path} is a {saved.get('kind')!r} run, not a DP-MERF run "
                             f"(kind 'merf', written by scripts/merf.py)")
    merf = saved.get("config", {})
    for name in SAME_SETTINGS:
        if merf.get(name) != _value(train_config, name):
            raise WarmStartError(
                f"the DP-MERF run {path} has {name} = {merf.get(name)!r} but this run "
                f"{name} = {_value(train_config, name)!r}: a warm start must read the same "
                f"records with the same generator; rerun scripts/merf.py "
                f"{_merf_flag(name, _value(train_config, name))} (a new --run_dir)")
    if not os.path.exists(os.path.join(path, "report.json")):
        raise WarmStartError(f"the DP-MERF run {path} is not finished (no report.json): "
                             f"run its command again to finish it")
    if saved.get("reproducible_noise") and train_config.seed is None:
        raise WarmStartError(
            f"the DP-MERF run {path} was seeded (--seed): its noise is reproducible, so a "
            f"run started from it is not private; seed this run too (tests, debugging) or "
            f"warm-start from an unseeded DP-MERF run")
    journal = _read_json(os.path.join(path, "ledger.json"), "its ledger.json counts its spends")
    try:
        ledger = accounting.PrivacyLedger.from_state_dict(journal["ledger"])
    except (KeyError, TypeError, ValueError) as error:
        raise WarmStartError(f"the ledger of {path} cannot be read ({error})") from error
    spends = tuple((float(spend["noise_multiplier"]), int(spend["count"]))
                   for spend in ledger.state_dict()["spends"])
    if not spends:
        raise WarmStartError(f"the DP-MERF run {path} has spent nothing: it is not finished")
    digests = tuple((name, _sha256(os.path.join(path, name))) for name in FINGERPRINTED_FILES)
    return WarmStart(os.path.abspath(path), spends, digests)


def load_generator(generator: keras.Model, warm_start: WarmStart) -> None:
    """Copies the DP-MERF run's fitted generator (weights and batch-norm statistics) into
    ``generator``; refuses another architecture by the first differing weight."""
    fitted = networks.load_generator(warm_start.generator_path)
    ours, theirs = generator.get_weights(), fitted.get_weights()
    if len(ours) != len(theirs) or any(a.shape != b.shape for a, b in zip(ours, theirs)):
        raise WarmStartError(
            f"the generator of {warm_start.path} has weights of shapes "
            f"{[w.shape for w in theirs]}, this run's {[w.shape for w in ours]}")
    generator.set_weights(theirs)

