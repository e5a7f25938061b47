"""Entries that change while beat runs: where they come from, and what bounds their runs.

The app's ``beat_schedule`` is read once, at start, by the scheduler itself.
An :class:`EntrySource` gives entries that are edited while beat runs
(django-celery-beat's models, :mod:`.django_entries`): the scheduler asks it
for the schedule at start, asks the leader's copy for changes on every tick,
and tells it which runs were recorded sent and which entries ended.

Such entries carry more than a schedule (:class:`EntryBounds`): a time their
runs start from, an end, a single run.  Every beat computes the same bounds
from the same rows, so the runs stay a function of the store's row and the
source's data, and each is still claimed once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from celery_recovery.beat.policy import EntryPolicy
from celery_recovery.core.records import BeatEntryRow


@dataclass(frozen=True)
class EntryBounds:
    """What limits an entry's runs besides its schedule (times aware, UTC)."""

    #: The entry's runs follow this time as if a run had been decided then, when it
    #: is later than the store's: the entry was created or enabled again then, or
    #: starts later.
    anchor: datetime | None = None
    #: No run is sent from this time on: the entry expired.
    until: datetime | None = None
    #: One run, then the entry has ended (a one-off).
    once: bool = False

    def last(self, decided: datetime) -> datetime:
        """The time the entry's next runs follow, given the last one ``decided`` in the store."""
        return self.anchor if self.anchor is not None and self.anchor > decided else decided

    def ended(self, row: BeatEntryRow, now: datetime) -> str | None:
        """Why the entry of ``row`` sends no more runs at ``now``, or None while it may."""
        sent = row.get("last_sent_run_at")
        # A one-off's run counts once it is recorded sent after the entry (re)started:
        # enabling it again moves the anchor past that run, and it runs once more.
        if self.once and sent is not None and (self.anchor is None or sent > self.anchor):
            return f"its one run was sent (scheduled at {sent.isoformat()})"
        if self.until is not None and now >= self.until:
            return f"it expired at {self.until.isoformat()}"
        return None


@dataclass(frozen=True)
class Entries:
    """A schedule as a source read it: Celery entries by name, with their policies and bounds."""

    entries: dict[str, Any]
    policies: dict[str, EntryPolicy]
    bounds: dict[str, EntryBounds] = field(default_factory=dict)


class EntrySource(Protocol):
    """Where the scheduler's entries come from when they change while beat runs.

    No method raises for its source's data or database: an entry that cannot be
    read is left out and logged, a database that does not answer keeps the last
    schedule read, and writes that failed are tried again later.
    """

    def load(self) -> Entries:
        """Every entry, read when beat starts."""
        ...

    def poll(self) -> Entries | None:
        """Every entry again when they changed since the last read, else None.

        Called by the leader on every tick; the source keeps it cheap (one small
        query at most every second or so)."""
        ...

    def record_sent(self, rows: Sequence[BeatEntryRow]) -> None:
        """Runs the leader has just recorded sent: each entry's row as that record left it."""
        ...

    def finish(self, name: str, why: str) -> None:
        """Entry ``name`` sends no more runs (:meth:`EntryBounds.ended` says ``why``)."""
        ...
