"""Beat schedules in the store: each entry's decided runs, claimed under the leader's lease.

One ``beat_entries`` row per entry.  ``last_run_at`` only moves forward, by
compare-and-set from the value the leader read, so a scheduled time is decided
once: claimed (``pending_*`` set, then cleared when the run is sent) or
recorded as missed.  Every claim also checks, in the same statement, that the
caller still holds the beat lease with the token it was given: a leader that
lost its lease (paused, cut off from the store) claims nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import exists, select, update

from celery_recovery.core.audit import Decision
from celery_recovery.core.records import BeatEntryRow, MissedRuns
from celery_recovery.store.audit import append_decisions
from celery_recovery.store.repository import Repository, row_of, rows_of
from celery_recovery.store.schema import beat_entries, leases

#: The lease the leading beat holds (a row of ``leases``).
BEAT_LEASE = "beat-leader"


class Fence:
    """The lease a beat leader holds: its name, holder and fencing token."""

    __slots__ = ("holder", "lease", "token")

    def __init__(self, lease: str, holder: str, token: int) -> None:
        self.lease = lease
        self.holder = holder
        self.token = token

    def held(self, now: datetime) -> Any:
        """SQL: the lease is still ours, with our token, and unexpired at ``now``."""
        return exists().where(
            leases.c.name == self.lease,
            leases.c.holder == self.holder,
            leases.c.token == self.token,
            leases.c.expires_at > now,
        )


class BeatRepository(Repository):
    """Store methods of the HA beat scheduler (:mod:`celery_recovery.beat`)."""

    def register_entries(self, entries: Sequence[dict[str, Any]], anchor: datetime) -> None:
        """Add rows for new entries (``name``, ``task``, ``schedule``), anchored at ``anchor``.

        An entry already stored keeps its runs; its task and schedule text are
        refreshed (they are for display).  All entries in one transaction.
        """
        if not entries:
            return
        rows = [
            {
                "name": e["name"],
                "task": e["task"],
                "schedule": e.get("schedule"),
                "last_run_at": anchor,
                "total_run_count": 0,
                "missed_count": 0,
                "updated_at": anchor,
            }
            for e in entries
        ]
        stmt = self._insert(beat_entries)
        stmt = stmt.on_conflict_do_update(
            index_elements=["name"],
            set_={"task": stmt.excluded.task, "schedule": stmt.excluded.schedule},
        )
        with self.transaction() as conn:
            conn.execute(stmt, rows)

    def entries(self, names: Sequence[str] | None = None) -> list[BeatEntryRow]:
        """Stored entries (those named, or all), by name."""
        stmt = select(beat_entries).order_by(beat_entries.c.name)
        if names is not None:
            stmt = stmt.where(beat_entries.c.name.in_(list(names)))
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def entry(self, name: str) -> BeatEntryRow | None:
        with self.transaction() as conn:
            found = conn.execute(select(beat_entries).where(beat_entries.c.name == name))
            return row_of(found.mappings().first())

    def claim_run(
        self,
        name: str,
        expected_last: datetime,
        run_at: datetime,
        task_id: str,
        fence: Fence,
        now: datetime,
        *,
        missed: MissedRuns | None = None,
        decisions: Sequence[Decision] = (),
    ) -> bool:
        """Claim the entry's run at ``run_at`` (to send as ``task_id``), under the lease,
        after the ``missed`` ones before it.  False, changing nothing, when the entry
        moved on from ``expected_last``, holds an unsent run, or the lease is no longer
        ``fence``'s.  ``decisions`` join the audit log in the same transaction."""
        c = beat_entries.c
        values: dict[str, Any] = {
            "last_run_at": run_at,
            "pending_run_at": run_at,
            "pending_task_id": task_id,
            "pending_token": fence.token,
            "total_run_count": c.total_run_count + 1,
        }
        return self._move_on(name, expected_last, fence, now, values, missed, decisions)

    def record_missed(
        self,
        name: str,
        expected_last: datetime,
        fence: Fence,
        now: datetime,
        missed: MissedRuns,
        decisions: Sequence[Decision] = (),
    ) -> bool:
        """Record ``missed`` runs and claim none: the entry moves on to ``missed.up_to``.
        False as for :meth:`claim_run`."""
        values = {"last_run_at": missed.up_to}
        return self._move_on(name, expected_last, fence, now, values, missed, decisions)

    def _move_on(
        self,
        name: str,
        expected_last: datetime,
        fence: Fence,
        now: datetime,
        values: dict[str, Any],
        missed: MissedRuns | None,
        decisions: Sequence[Decision],
    ) -> bool:
        c = beat_entries.c
        values = {**values, "updated_at": now}
        if missed is not None and missed.count:
            values.update(
                missed_count=c.missed_count + missed.count,
                last_missed_at=missed.up_to,
                last_missed_reason=missed.reason,
            )
        stmt = (
            update(beat_entries)
            .where(
                c.name == name,
                c.last_run_at == expected_last,
                c.pending_task_id.is_(None),
                fence.held(now),
            )
            .values(**values)
        )
        with self.transaction() as conn:
            won = conn.execute(stmt).rowcount == 1
            if won and decisions:
                append_decisions(conn, decisions)
        return won

    def adopt_pending(
        self,
        name: str,
        task_id: str,
        old_token: int | None,
        fence: Fence,
        now: datetime,
        decision: Decision | None = None,
    ) -> bool:
        """Take over a run another leader claimed and never confirmed sent."""
        c = beat_entries.c
        token_matches = (
            c.pending_token.is_(None) if old_token is None else c.pending_token == old_token
        )
        stmt = (
            update(beat_entries)
            .where(c.name == name, c.pending_task_id == task_id, token_matches, fence.held(now))
            .values(pending_token=fence.token, updated_at=now)
        )
        with self.transaction() as conn:
            won = conn.execute(stmt).rowcount == 1
            if won and decision is not None:
                append_decisions(conn, [decision])
        return won

    def record(self, decision: Decision) -> None:
        """Log a decision that changed nothing here (a beat taking the lead)."""
        with self.transaction() as conn:
            append_decisions(conn, [decision])

    def mark_sent(self, name: str, task_id: str, token: int, now: datetime) -> bool:
        """Record that the claimed run ``task_id`` was sent; False if no longer ours."""
        return name in self.mark_sent_many([(name, task_id)], token, now)

    def mark_sent_many(
        self, runs: Sequence[tuple[str, str]], token: int, now: datetime
    ) -> set[str]:
        """Record the claimed runs ``(entry name, task id)`` sent, in one transaction;
        returns the names of those still claimed with ``token`` (the others changed
        nothing)."""
        c = beat_entries.c
        done: set[str] = set()
        with self.transaction() as conn:
            for name, task_id in runs:
                stmt = (
                    update(beat_entries)
                    .where(c.name == name, c.pending_task_id == task_id, c.pending_token == token)
                    .values(
                        last_sent_run_at=c.pending_run_at,
                        last_task_id=task_id,
                        last_sent_at=now,
                        pending_run_at=None,
                        pending_task_id=None,
                        pending_token=None,
                        updated_at=now,
                    )
                )
                if conn.execute(stmt).rowcount == 1:
                    done.add(name)
        return done
