"""The failure-callback outbox: rows written with the state change that makes them due,
claimed and deleted by whoever delivers them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    String,
    and_,
    cast,
    delete,
    or_,
    select,
    update,
)

from celery_recovery.core.audit import Decision
from celery_recovery.core.records import CallbackRow
from celery_recovery.core.states import JobState
from celery_recovery.store.audit import append_decision
from celery_recovery.store.repository import Repository, rows_of
from celery_recovery.store.schema import (
    callbacks,
    jobs,
)


class OutboxRepository(Repository):
    """Claim, delete and list failure-callback rows."""

    def claim_callbacks(
        self, now: datetime, holder: str, lease: float, limit: int = 50
    ) -> list[CallbackRow]:
        """Claim due callback rows for ``holder`` until ``now + lease`` (SKIP LOCKED on PG).

        Due: never claimed, claimed past its lease, or claimed by a process whose job
        has ended (a pool process killed mid-delivery, e.g. for a hung try it ran).
        """
        due = (
            select(callbacks.c.id)
            .where(
                or_(
                    callbacks.c.claimed_until.is_(None),
                    callbacks.c.claimed_until < now,
                    and_(
                        callbacks.c.claimed_by.in_(_ended_holders(now - timedelta(seconds=lease))),
                        callbacks.c.claimed_by.not_in(_live_holders()),
                    ),
                )
            )
            .order_by(callbacks.c.id)
            .limit(limit)
        )
        if self.dialect == "postgresql":
            due = due.with_for_update(skip_locked=True)
        stmt = (
            update(callbacks)
            .where(callbacks.c.id.in_(due.scalar_subquery()))
            .values(
                claimed_by=holder,
                claimed_until=now + timedelta(seconds=lease),
                attempts=callbacks.c.attempts + 1,
            )
            .returning(*callbacks.c)
        )
        with self.transaction() as conn:
            return sorted(rows_of(conn.execute(stmt)), key=lambda r: r["id"])

    def delete_callback(self, callback_id: int, holder: str, audit: Decision | None = None) -> bool:
        """Delete a delivered callback row, only while ``holder`` still owns it."""
        stmt = delete(callbacks).where(
            callbacks.c.id == callback_id, callbacks.c.claimed_by == holder
        )
        with self.transaction() as conn:
            won = conn.execute(stmt).rowcount == 1
            if won:
                append_decision(conn, audit)
            return won

    def pending_callbacks(self) -> list[CallbackRow]:
        with self.transaction() as conn:
            return rows_of(conn.execute(select(callbacks).order_by(callbacks.c.id)))


def _holder_of_job() -> Any:
    """A job's process as a sweep names itself when it claims (``host:pid``)."""
    return jobs.c.hostname + ":" + cast(jobs.c.pid, String)


def _ended_holders(since: datetime) -> Any:
    """Processes whose job ended since ``since``: older claims have expired anyway."""
    return select(_holder_of_job()).where(
        jobs.c.state != JobState.RUNNING.value, jobs.c.end_date >= since
    )


def _live_holders() -> Any:
    """Running jobs: a reused process id on the same host keeps its claims."""
    return select(_holder_of_job()).where(jobs.c.state == JobState.RUNNING.value)
