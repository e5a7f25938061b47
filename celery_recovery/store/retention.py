"""Retention: count and delete finished history older than a cutoff, in batches.

A batch is one short
transaction that picks at most ``limit`` keys and deletes them.  On
PostgreSQL the pick is ``FOR UPDATE SKIP LOCKED``, so a batch never waits on
a row a sweep or worker holds (that row is simply left for a later run), and
the conditions are re-checked on the locked row, so a row that changed since
is not deleted.  Nothing active is ever selected: running jobs, and tries
that are queued, running or deferred (or triggers and jobs they still need).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, delete, exists, func, or_, select, tuple_

from celery_recovery.core.states import FINISHED_TASK_STATES, JobState, TaskState
from celery_recovery.store.repository import Repository
from celery_recovery.store.schema import (
    audit_log,
    callbacks,
    jobs,
    publish_claims,
    reservations,
    revocations,
    same_try,
    task_heartbeats,
    task_records,
    triggers,
)

#: Tables ``db clean`` may purge, in the order it purges them.
RETENTION_TABLES = (
    "callbacks",
    "triggers",
    "reservations",
    "task_records",
    "jobs",
    "revocations",
    "claims",
    "audit_log",
    "task_heartbeats",
)

#: Try states that are still in flight and so never deleted.
ACTIVE_TASK_STATES = (TaskState.QUEUED, TaskState.RUNNING, TaskState.DEFERRED)


def _expired(
    name: str, cutoff: datetime, now: datetime
) -> tuple[Table, tuple[Any, ...], tuple[Any, ...]]:
    """(table, primary key columns, condition) of rows of ``name`` that may go."""
    if name == "task_records":
        where: tuple[Any, ...] = (
            task_records.c.state.in_(sorted(s.value for s in FINISHED_TASK_STATES)),
            task_records.c.ended_at < cutoff,
        )
        return task_records, (task_records.c.task_id, task_records.c.try_number), where
    if name == "jobs":
        still_needed = exists().where(
            task_records.c.job_id == jobs.c.id,
            task_records.c.state == TaskState.RUNNING.value,
        )
        where = (jobs.c.state != JobState.RUNNING.value, jobs.c.end_date < cutoff, ~still_needed)
        return jobs, (jobs.c.id,), where
    if name == "triggers":
        try_active = exists().where(
            task_records.c.task_id == triggers.c.task_id,
            task_records.c.try_number == triggers.c.try_number,
            task_records.c.state.in_([s.value for s in ACTIVE_TASK_STATES]),
        )
        return triggers, (triggers.c.id,), (triggers.c.created_at < cutoff, ~try_active)
    if name == "reservations":
        # A reservation only matters while its try is still queued.
        try_queued = exists().where(
            same_try(reservations), task_records.c.state == TaskState.QUEUED.value
        )
        keys = (reservations.c.task_id, reservations.c.try_number)
        return reservations, keys, (reservations.c.reserved_at < cutoff, ~try_queued)
    if name == "callbacks":
        # Delivered rows are deleted on delivery; what is left this old is stale.
        # A row a sweep is delivering right now (claim not expired) is left alone.
        unclaimed = or_(callbacks.c.claimed_until.is_(None), callbacks.c.claimed_until < now)
        return callbacks, (callbacks.c.id,), (callbacks.c.created_at < cutoff, unclaimed)
    if name == "revocations":
        # Only overdue queued tries consult them, and those are decided long before.
        return revocations, (revocations.c.id,), (revocations.c.created_at < cutoff,)
    if name == "claims":
        # Publish-once claims: done ones, and ones whose
        # holder died and that nobody took over, before the cutoff.
        old = or_(
            publish_claims.c.completed_at < cutoff,
            and_(publish_claims.c.completed_at.is_(None), publish_claims.c.expires_at < cutoff),
        )
        return publish_claims, (publish_claims.c.name,), (old,)
    if name == "audit_log":
        # Decisions are history only: nothing refers to them.
        return audit_log, (audit_log.c.id,), (audit_log.c.at < cutoff,)
    if name == "task_heartbeats":
        # A later try of the task resumes from them: kept while any try of it is active.
        task_active = exists().where(
            task_records.c.task_id == task_heartbeats.c.task_id,
            task_records.c.state.in_([s.value for s in ACTIVE_TASK_STATES]),
        )
        keys = (task_heartbeats.c.task_id, task_heartbeats.c.try_number)
        return task_heartbeats, keys, (task_heartbeats.c.beat_at < cutoff, ~task_active)
    raise ValueError(f"unknown retention table {name!r}; known: {', '.join(RETENTION_TABLES)}")


class RetentionRepository(Repository):
    """Store methods used by ``db clean`` and the ``celery_recovery.db_clean`` task."""

    dialect: str

    def count_expired(self, name: str, cutoff: datetime, now: datetime) -> int:
        """How many rows of table ``name`` a clean with this cutoff would delete now."""
        table, _keys, where = _expired(name, cutoff, now)
        with self.transaction() as conn:
            return int(
                conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()
            )

    def delete_expired_batch(self, name: str, cutoff: datetime, now: datetime, limit: int) -> int:
        """Delete at most ``limit`` expired rows of ``name`` in one transaction; how many went."""
        table, keys, where = _expired(name, cutoff, now)
        picked = select(*keys).where(*where).limit(limit)
        if self.dialect == "postgresql":
            picked = picked.with_for_update(skip_locked=True, of=table)
        key = keys[0] if len(keys) == 1 else tuple_(*keys)
        stmt = delete(table).where(key.in_(picked))
        with self.transaction() as conn:
            return max(conn.execute(stmt).rowcount, 0)
