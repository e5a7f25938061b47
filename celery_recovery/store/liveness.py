"""The store operations of liveness markers: marked jobs, held locks, fast death.

Each change is a
compare-and-set: a job is failed only if it is still running with the very
heartbeat the sweep judged, so a process that beat in between is left alone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import or_, select, text, update
from sqlalchemy.sql import Select

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


#: The store's time, the server's start time (a restart or a failover changes it) and the
#: held keys, in one statement: the marker watch's look, twice a second.
_LOCK_VIEW = f"""
SELECT now(), pg_postmaster_start_time(), ARRAY({_HELD_LOCKS})
"""

_LOCK_HELD_SQL = f"SELECT CAST(:key AS bigint) IN ({_HELD_LOCKS})"
_LOCK_HELD = text(_LOCK_HELD_SQL)

_WATCHED_COLUMNS = (
    jobs.c.id,
    jobs.c.job_type,
    jobs.c.hostname,
    jobs.c.node_name,
    jobs.c.pid,
    jobs.c.parent_pid,
    jobs.c.latest_heartbeat,
    jobs.c.process_marker,
    jobs.c.marker_lock,
)


class LivenessRepository(Repository):
    """Reads and compare-and-set changes for :mod:`celery_recovery.sweeps.liveness`."""

    dialect: str
    transaction: Any
    single_statement: Any

    def marked_jobs(self) -> list[dict[str, Any]]:
        """Running jobs that recorded a liveness marker."""
        stmt = select(*_WATCHED_COLUMNS, jobs.c.marker_missing_since).where(
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

    def lock_view(self) -> tuple[datetime, Any, list[int]]:
        """The store's time, its server's identity and the held lock keys (PostgreSQL)."""
        with self.single_statement() as conn:
            now, server, keys = conn.execute(text(_LOCK_VIEW)).one()
        return now, server, [int(key) for key in keys or ()]

    def jobs_in_view(self, view: str) -> list[dict[str, Any]]:
        """Running jobs whose process markers were taken in the process-id ``view`` (a boot
        id and a pid namespace): those whose processes can be checked from here."""
        return self._running(jobs.c.process_marker.startswith(f"{view}/", autoescape=True))

    def jobs_holding(self, keys: Any) -> list[dict[str, Any]]:
        """Running jobs that recorded one of the lock ``keys`` as their marker."""
        return self._running(jobs.c.marker_lock.in_(list(keys)))

    def _running(self, condition: Any) -> list[dict[str, Any]]:
        stmt: Select[Any] = select(*_WATCHED_COLUMNS).where(
            jobs.c.state == JobState.RUNNING.value, condition
        )
        with self.single_statement() as conn:
            return rows_of(conn.execute(stmt))

    def lock_held(self, key: int) -> bool:
        """Whether a session holds the advisory lock ``key`` now (PostgreSQL)."""
        with self.single_statement() as conn:
            return bool(conn.execute(_LOCK_HELD, {"key": key}).scalar())

    def process_job(self, job_type: str, hostname: str, pid: int) -> dict[str, Any] | None:
        """The latest job of process ``pid`` on ``hostname``, of ``job_type``."""
        stmt = (
            select(*_WATCHED_COLUMNS, jobs.c.state)
            .where(jobs.c.job_type == job_type, jobs.c.hostname == hostname, jobs.c.pid == pid)
            .order_by(jobs.c.start_date.desc())
            .limit(1)
        )
        with self.single_statement() as conn:
            rows = rows_of(conn.execute(stmt))
        return rows[0] if rows else None

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
