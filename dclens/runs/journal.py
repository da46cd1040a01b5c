"""The write-ahead privacy journal: every TopAgg spend is on disk before its result exists.

A run's authoritative privacy record is ``ledger.json`` in the run directory.  Before the
noisy vote of a round is drawn, the round's spend (B TopAgg queries) is appended to the
journal and the file is replaced atomically and fsynced (:meth:`PrivacyJournal.append`).
Hence after a crash at *any* point the journal counts every query whose noisy answer may
have been computed, plus at most the one round whose noise had not been drawn yet:

    recorded spend >= true spend.

Resume rule (see :meth:`PrivacyJournal.resume`): a checkpoint taken after step ``s``
stores how many journal entries existed then (``entries_at_checkpoint``).  Entries after
that index belong to rounds whose results were lost with the process: their noisy votes
were (or may have been) drawn, and their losses/sample grids may already sit in the
TensorBoard log.  They stay in the ledger for ever, are listed under ``lost`` with the step
the run resumed from, and the resumed run spends again for the steps it redoes.  So a
resumed run's epsilon after any step is >= an uninterrupted run's, and equal when the kill
fell on a checkpoint boundary (no entry after the checkpoint).

Units: the ledger holds RDP of Gaussian mechanisms with the aggregation's noise multiplier
(sigma / sensitivity; TopAgg: sigma / (2 sqrt(k))), one per query; epsilon is reported at
the run's delta (see :mod:`dclens.privacy.accounting`).  A private classifier's journal holds a
:class:`dclens.privacy.sampled_ledger.SampledGaussianLedger` instead: one entry per subsampled
step (its ``queries`` count steps), restored by the ledger's ``kind``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from dclens.privacy import accounting, sampled_ledger
from dclens.common import export

JOURNAL_VERSION = 1


class JournalError(RuntimeError):
    """The journal on disk is missing, unreadable or inconsistent: the ledger is not trusted."""


@dataclasses.dataclass(frozen=True)
class Spend:
    """One journaled TopAgg round: ``queries`` fake images at (``step``, ``round``)."""

    step: int
    round: int
    queries: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class PrivacyJournal:
    """``ledger.json``: the ledger's state plus the list of spends that produced it.

    Args:
      path: the journal file.
      ledger: the ledger the journal mirrors (spent into by the training loop).
    """

    def __init__(self, path: str | os.PathLike,
                 ledger: accounting.PrivacyLedger | sampled_ledger.SampledGaussianLedger):
        self.path = os.fspath(path)
        self.ledger = ledger
        self.entries: list[Spend] = []
        self.lost: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ writing
    def _record(self) -> dict[str, Any]:
        return {"version": JOURNAL_VERSION, "ledger": self.ledger.state_dict(),
                "queries": self.ledger.queries,
                "entries": [e.to_dict() for e in self.entries], "lost": self.lost}

    def write(self) -> None:
        """Replaces the file atomically (temporary file, fsync, rename, fsync of the folder)."""
        export.write_json(self.path, self._record())

    def append(self, step: int, round_index: int, queries: int) -> None:
        """Journals a spend that is already in ``self.ledger``; durable when this returns."""
        journaled = sum(e.queries for e in self.entries) + queries
        if journaled != self.ledger.queries:
            raise JournalError(
                f"the ledger counts {self.ledger.queries} queries but the journal "
                f"{journaled}: spend into the ledger exactly once per journaled round")
        self.entries.append(Spend(step, round_index, queries))
        self.write()

    @property
    def queries(self) -> int:
        return self.ledger.queries

    # ------------------------------------------------------------------ reading
    @classmethod
    def load(cls, path: str | os.PathLike) -> PrivacyJournal:
        """Reads and checks a journal; raises :class:`JournalError` if it cannot be trusted."""
        path = os.fspath(path)
        try:
            with open(path) as stream:
                record = json.load(stream)
        except FileNotFoundError as error:
            raise JournalError(f"the privacy journal {path} is missing") from error
        except (OSError, ValueError) as error:
            raise JournalError(f"the privacy journal {path} cannot be read ({error})") from error
        if not isinstance(record, dict) or record.get("version") != JOURNAL_VERSION:
            raise JournalError(f"{path} is not a version-{JOURNAL_VERSION} dclens privacy "
                               f"journal (version {record.get('version') if isinstance(record, dict) else None!r})")
        try:
            ledger = sampled_ledger.ledger_from_state_dict(record["ledger"])
            entries = [Spend(int(e["step"]), int(e["round"]), int(e["queries"]))
                       for e in record["entries"]]
            lost = list(record["lost"])
        except (KeyError, TypeError, ValueError) as error:
            raise JournalError(f"the privacy journal {path} is malformed ({error})") from error
        journaled = sum(e.queries for e in entries)
        if journaled != ledger.queries or record.get("queries") != ledger.queries:
            raise JournalError(
                f"the privacy journal {path} is inconsistent: its ledger counts "
                f"{ledger.queries} queries, its entries {journaled}, its total "
                f"{record.get('queries')!r}; the file was modified outside dclens")
        journal = cls(path, ledger)
        journal.entries = entries
        journal.lost = lost
        return journal

    def resume(self, *, entries_at_checkpoint: int, resumed_from_step: int) -> list[Spend]:
        """Marks the entries after the checkpoint as lost (still counted), except those an
        earlier resume already marked; returns the newly lost ones.

        Raises:
          JournalError: if the checkpoint claims more entries than the journal holds (the
            journal would have forgotten spends).
        """
        if entries_at_checkpoint > len(self.entries):
            raise JournalError(
                f"the checkpoint at step {resumed_from_step} saw {entries_at_checkpoint} "
                f"journaled spends but {self.path} holds only {len(self.entries)}: the "
                "journal has lost spends; refusing to resume with an under-counted ledger")
        # A second crash before a new checkpoint resumes from the same one: the entries an
        # earlier resume already listed as lost are not lost again (each lost record keeps
        # the journal length it covered up to; older journals did not, hence the 0).
        first = max([entries_at_checkpoint]
                    + [int(item.get("to_entry", 0)) for item in self.lost])
        lost = self.entries[first:]
        if lost:
            self.lost.append({"resumed_from_step": resumed_from_step,
                              "queries": sum(e.queries for e in lost),
                              "spends": [e.to_dict() for e in lost],
                              "to_entry": len(self.entries)})
            self.write()
        return lost

    @property
    def lost_queries(self) -> int:
        return sum(item["queries"] for item in self.lost)
