"""The store operations of liveness markers: marked jobs, held locks, fast death.

Each change is a
compare-and-set: a job is failed only if it is still running with the very
heartbeat the sweep judged, so a process that beat in between is left alone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import or_, select, text, update

from celery_recovery.core.states import JobState
from celery_recovery.store.repository import Repository, rows_of
from celery_recovery.store.schema import jobs

#: Every session-level bigint advisory lock held in the store's database (the
#: PostgreSQL liveness markers of :mod:`celery_recovery.liveness.postgres`).
_HELD_LOCKS = """
SELECT (l.classid::bigint << 32) | l.objid::bigint
FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


class LivenessRepository(Repository):
    """Reads and compare-and-set changes for :mod:`celery_recovery.sweeps.liveness`."""

    dialect: str
    transaction: Any
    single_statement: Any

    def marked_jobs(self) -> list[dict[str, Any]]:
        """Running jobs that recorded a liveness marker."""
        stmt = select(
            jobs.c.id,
            jobs.c.job_type,
            jobs.c.hostname,
            jobs.c.node_name,
            jobs.c.pid,
            jobs.c.parent_pid,
            jobs.c.latest_heartbeat,
            jobs.c.process_marker,
            jobs.c.marker_lock,
            jobs.c.marker_missing_since,
        ).where(
            jobs.c.state == JobState.RUNNING.value,
            or_(jobs.c.process_marker.is_not(None), jobs.c.marker_lock.is_not(None)),
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def held_marker_locks(self) -> set[int]:
        """Keys of the advisory locks held in the store's database now (PostgreSQL)."""
        if self.dialect != "postgresql":
            return set()
        with self.single_statement() as conn:
            return {int(key) for (key,) in conn.execute(text(_HELD_LOCKS))}

    def note_marker_missing(self, job_id: str, now: datetime) -> bool:
        """Record when a sweep first saw the job's lock missing (once)."""
        stmt = (
            update(jobs)
            .where(
                jobs.c.id == job_id,
                jobs.c.state == JobState.RUNNING.value,
                jobs.c.marker_missing_since.is_(None),
            )
            .values(marker_missing_since=now)
        )
        with self.single_statement() as conn:
            return conn.execute(stmt).rowcount == 1

    def note_marker_present(self, job_id: str) -> bool:
        """Forget a missing lock that is back (the holder reconnected)."""
        stmt = (
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.marker_missing_since.is_not(None))
            .values(marker_missing_since=None)
        )
        with self.single_statement() as conn:
            return conn.execute(stmt).rowcount == 1

    def fail_job_if_silent(self, job_id: str, heartbeat: datetime, now: datetime) -> bool:
        """Mark a job failed if it is still running and has not beaten since ``heartbeat``."""
        stmt = (
            update(jobs)
            .where(
                jobs.c.id == job_id,
                jobs.c.state == JobState.RUNNING.value,
                jobs.c.latest_heartbeat == heartbeat,
            )
            .values(state=JobState.FAILED.value, end_date=now)
        )
        with self.single_statement() as conn:
            return conn.execute(stmt).rowcount == 1
