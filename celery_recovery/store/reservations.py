"""Reservations: which worker job holds a message it received but has not started.

A worker's main process
records each message it takes (prefetched, or waiting for its ETA) through the
write-behind writer; the row is superseded, not deleted, when the try starts
(the try is no longer ``queued``).  When the job dies, the reserved sweep
publishes those tries again instead of waiting for ``recovery_queued_timeout``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.engine import Connection

from celery_recovery.core.records import ReservedRow
from celery_recovery.core.states import JobState, TaskState
from celery_recovery.store.precompiled import PrecompiledBatch
from celery_recovery.store.repository import Repository, rows_of
from celery_recovery.store.schema import TRY_KEY, jobs, reservations, same_try, task_records


class ReservationRepository(Repository):
    """Store methods for reservations (see :mod:`celery_recovery.sweeps.reserved`)."""

    def upsert(self, conn: Connection, items: Sequence[tuple[str, int, str, datetime]]) -> None:
        """Write ``(task_id, try_number, job_id, reserved_at)`` items in the caller's
        transaction (the write-behind batch's); a redelivery to another job moves the
        reservation there."""
        batch = self._statement(
            "reserved_batch",
            lambda: PrecompiledBatch(self._build_upsert_reservation(), reservations, TRY_KEY),
        )
        # One row per try: the last reception in the batch wins, as it would in order.
        rows = {
            (t, n): {"task_id": t, "try_number": n, "job_id": j, "reserved_at": at}
            for t, n, j, at in items
        }
        batch.execute(conn, list(rows.values()))

    def _build_upsert_reservation(self) -> Any:
        insert = self._insert(reservations)
        return insert.on_conflict_do_update(
            index_elements=list(TRY_KEY),
            set_={"job_id": insert.excluded.job_id, "reserved_at": insert.excluded.reserved_at},
        )

    def forget_job(self, job_id: str) -> int:
        """Delete every reservation of ``job_id`` (its worker no longer holds those
        messages); how many there were."""
        stmt = delete(reservations).where(reservations.c.job_id == job_id)
        with self.transaction() as conn:
            return max(conn.execute(stmt).rowcount, 0)

    def find_reserved_by_dead_jobs(
        self, now: datetime, threshold: float, limit: int = 500
    ) -> list[ReservedRow]:
        """Queued tries whose message a dead worker job received and never started.

        Dead: marked failed by a sweep, or running with a heartbeat older than
        ``threshold``.  Only receptions the job made while it could still have
        been judged alive count (``reserved_at`` no later than its last beat plus
        ``threshold``, both from the job's own clock): a process judged dead
        while only paused, which takes messages before it notices and carries
        on as a new job, keeps and runs those itself.
        """
        cutoff = now - timedelta(seconds=threshold)
        stmt = (
            select(
                task_records,
                reservations.c.job_id.label("reserved_by"),
                reservations.c.reserved_at,
                jobs.c.latest_heartbeat.label("job_heartbeat"),
                jobs.c.state.label("job_state"),
                jobs.c.hostname.label("job_hostname"),
                jobs.c.node_name.label("job_node_name"),
                jobs.c.pid.label("job_pid"),
            )
            .select_from(
                task_records.join(reservations, same_try(reservations)).join(
                    jobs, jobs.c.id == reservations.c.job_id
                )
            )
            .where(
                task_records.c.state == TaskState.QUEUED.value,
                or_(
                    jobs.c.state == JobState.FAILED.value,
                    and_(
                        jobs.c.state == JobState.RUNNING.value,
                        jobs.c.latest_heartbeat < cutoff,
                    ),
                ),
            )
            .order_by(reservations.c.reserved_at)
            .limit(limit)
        )
        with self.transaction() as conn:
            found = rows_of(conn.execute(stmt))
        window = timedelta(seconds=threshold)
        return [r for r in found if r["reserved_at"] <= r["job_heartbeat"] + window]
