"""Read-only trigger queries behind ``inspect`` and the deferred sweep."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    and_,
    func,
    or_,
    select,
)

from celery_recovery.core.states import JobState, JobType, TaskState
from celery_recovery.store.repository import Repository, rows_of
from celery_recovery.store.schema import (
    jobs,
    task_records,
    triggers,
)

#: The trigger columns an operator sees (the triggerer issue may add more; these are stable).
TRIGGER_COLUMNS = (
    triggers.c.id,
    triggers.c.classpath,
    triggers.c.task_id,
    triggers.c.try_number,
    triggers.c.queue,
    triggers.c.timeout_at,
    triggers.c.triggerer_id,
    triggers.c.created_at,
)


class TriggerReads(Repository):
    """Orphaned triggers, served and waiting queues, deferred tries.

    Part of :class:`~celery_recovery.store.triggers.TriggerRepository`.
    """

    def orphan_triggers(self, now: datetime, threshold: float, limit: int = 500) -> list[dict]:
        """Triggers no live triggerer runs: unassigned, or held by a job that is missing,
        not running, or whose heartbeat is older than ``threshold`` seconds.

        Each row carries the holder's ``triggerer_state`` and ``triggerer_heartbeat``
        (None when there is no such job).
        """
        stmt = (
            select(
                *TRIGGER_COLUMNS,
                jobs.c.state.label("triggerer_state"),
                jobs.c.latest_heartbeat.label("triggerer_heartbeat"),
            )
            .select_from(triggers.outerjoin(jobs, jobs.c.id == triggers.c.triggerer_id))
            .where(
                or_(
                    triggers.c.triggerer_id.is_(None),
                    jobs.c.id.is_(None),
                    ~live_triggerer(now, threshold),
                )
            )
            .order_by(triggers.c.created_at, triggers.c.id)
            .limit(limit)
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def queues_served(self, now: datetime, threshold: float) -> set[str | None]:
        """Queues some live triggerer serves (its ``--queues``), or holds a trigger of."""
        held = (
            select(triggers.c.queue)
            .distinct()
            .select_from(triggers.join(jobs, jobs.c.id == triggers.c.triggerer_id))
            .where(live_triggerer(now, threshold))
        )
        declared = select(jobs.c.queues).where(live_triggerer(now, threshold))
        with self.transaction() as conn:
            served: set[str | None] = set(conn.execute(held).scalars())
            for queues in conn.execute(declared).scalars():
                served.update(q for q in (queues or "").split(",") if q)
        return served

    def waiting_queues(self, now: datetime, dead_after: float) -> dict[str, int]:
        """Queues with triggers waiting, and how many, that no live triggerer serves."""
        served = self.queues_served(now, dead_after)
        stmt = (
            select(triggers.c.queue, func.count())
            .where(triggers.c.fired_at.is_(None))
            .group_by(triggers.c.queue)
        )
        with self.transaction() as conn:
            waiting: dict[str, int] = {}
            for queue, count in conn.execute(stmt).all():
                name = queue or "default"
                if name not in served:
                    waiting[name] = waiting.get(name, 0) + int(count)
        return waiting

    def deferred_tries(self, now: datetime, threshold: float, limit: int = 500) -> list[dict]:
        """Tries in ``deferred`` with their trigger (if any) and whether its triggerer is live."""
        live = live_triggerer(now, threshold)
        stmt = (
            select(
                task_records.c.task_id,
                task_records.c.try_number,
                task_records.c.task_name,
                task_records.c.queue.label("task_queue"),
                task_records.c.updated_at.label("deferred_at"),
                triggers.c.id.label("trigger_id"),
                triggers.c.classpath,
                triggers.c.queue.label("trigger_queue"),
                triggers.c.timeout_at,
                triggers.c.triggerer_id,
                # No trigger or no job row must read as not live, not as NULL.
                and_(jobs.c.id.is_not(None), live).label("triggerer_alive"),
            )
            .select_from(
                task_records.outerjoin(
                    triggers,
                    and_(
                        triggers.c.task_id == task_records.c.task_id,
                        triggers.c.try_number == task_records.c.try_number,
                    ),
                ).outerjoin(jobs, jobs.c.id == triggers.c.triggerer_id)
            )
            .where(task_records.c.state == TaskState.DEFERRED.value)
            .order_by(task_records.c.updated_at)
            .limit(limit)
        )
        with self.transaction() as conn:
            rows = rows_of(conn.execute(stmt))
        for row in rows:
            row["triggerer_alive"] = bool(row["triggerer_alive"])
        return rows


def live_triggerer(now: datetime, threshold: float) -> Any:
    """SQL condition: the ``jobs`` row is a running triggerer with a fresh heartbeat."""
    return and_(
        jobs.c.job_type == JobType.TRIGGERER.value,
        jobs.c.state == JobState.RUNNING.value,
        jobs.c.latest_heartbeat >= now - timedelta(seconds=threshold),
    )
