"""Task heartbeats: when each try last called ``heartbeat()``, and its last details.

A beat is fenced like a lease: it is written only while its try is the task's
newest and still queued or running, under a lock on the try's record
(``FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` serialises every
writer).  A reset that gives the try up (hung, its worker dead) changes that
record, so either the beat committed first and the next try reads its details,
or the reset did and the beat is refused: two tries never both own the progress.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_

from celery_recovery.core.states import TaskState
from celery_recovery.store.repository import Repository
from celery_recovery.store.schema import EncodedJSON, task_heartbeats, task_records

#: States in which a try may still beat (its claim may not be written yet).
_LIVE = (TaskState.QUEUED.value, TaskState.RUNNING.value)


class TaskHeartbeatRepository(Repository):
    """Beats of tries, fenced by their records; and the details a later try resumes from."""

    def beat(
        self, task_id: str, try_number: int, at: datetime, details: EncodedJSON | None
    ) -> bool | None:
        """Record a beat (with ``details`` unless None).  True: written; False: the try
        is stale (a later try exists, or it is no longer queued or running); None: no
        record of the try yet (its claim is still on its way), nothing written."""
        lock = (
            select(task_records.c.try_number, task_records.c.state)
            .where(task_records.c.task_id == task_id, task_records.c.try_number >= try_number)
            .order_by(task_records.c.try_number)
        )
        if self.dialect == "postgresql":
            lock = lock.with_for_update()
        with self.transaction() as conn:
            rows = conn.execute(lock).all()
            if any(row.try_number > try_number for row in rows):
                return False
            if not rows:
                return None
            if rows[0].state not in _LIVE:
                return False
            values: dict[str, Any] = {"beat_at": at}
            if details is not None:
                values["details"] = details
            stmt = (
                self._insert(task_heartbeats)
                .values(task_id=task_id, try_number=try_number, **values)
                .on_conflict_do_update(index_elements=["task_id", "try_number"], set_=values)
            )
            conn.execute(stmt)
            return True

    def last_beats(self, tries: Iterable[tuple[str, int]]) -> dict[tuple[str, int], datetime]:
        """The last beat of each of ``tries`` that has beaten (not its details: the
        worker asks every second)."""
        rows = self._of_tries(tries, task_heartbeats.c.beat_at)
        return {(r.task_id, r.try_number): r.beat_at for r in rows}

    def beats_of(self, tries: Iterable[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
        """The last beat and details of each of ``tries`` that has beaten (inspect)."""
        rows = self._of_tries(tries, task_heartbeats.c.beat_at, task_heartbeats.c.details)
        return {
            (r.task_id, r.try_number): {"beat_at": r.beat_at, "details": r.details} for r in rows
        }

    def _of_tries(self, tries: Iterable[tuple[str, int]], *columns: Any) -> list[Any]:
        keys = list(tries)
        if not keys:
            return []
        key = (task_heartbeats.c.task_id, task_heartbeats.c.try_number)
        stmt = select(*key, *columns).where(tuple_(*key).in_(keys))
        with self.transaction() as conn:
            return list(conn.execute(stmt))

    def last_details(self, task_id: str, up_to_try: int) -> Any:
        """The details most recently recorded for ``task_id`` by a try numbered up to
        ``up_to_try`` (the newest try that gave any), or None."""
        stmt = (
            select(task_heartbeats.c.details)
            .where(
                task_heartbeats.c.task_id == task_id,
                task_heartbeats.c.try_number <= up_to_try,
                task_heartbeats.c.details.is_not(None),
            )
            .order_by(task_heartbeats.c.try_number.desc())
            .limit(1)
        )
        with self.transaction() as conn:
            return conn.execute(stmt).scalar()

    def of_task(self, task_id: str) -> list[dict[str, Any]]:
        """Every try's last beat and details, oldest try first (inspect, the console)."""
        stmt = (
            select(task_heartbeats)
            .where(task_heartbeats.c.task_id == task_id)
            .order_by(task_heartbeats.c.try_number)
        )
        with self.transaction() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]
