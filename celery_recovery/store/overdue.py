"""Overdue tries: running tries far past their task's usual duration (read only).

One read transaction: the running tries started more than ``min_seconds`` ago
(no try younger than that can be overdue; the partial index on running tries
finds them), then for each of their task names the newest
:data:`~celery_recovery.core.overdue.SAMPLE_RUNS` successful tries, by the
``(task_name, queued_at)`` index, so the cost is a few hundred index rows per
name whatever the history holds; then the last task heartbeat of the overdue
ones.  Durations and the percentile are computed here in Python: SQLite has
no ``percentile_cont``.  The console runs :func:`find_overdue` on its own
read-only connection.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.engine import Connection

from celery_recovery.core.overdue import SAMPLE_RUNS, OverduePolicy
from celery_recovery.core.states import TaskState
from celery_recovery.store.repository import Repository
from celery_recovery.store.schema import task_heartbeats, task_records

#: Running tries examined at most, oldest first (the likeliest to be overdue).
MAX_CANDIDATES = 1000

_RUNNING = (
    task_records.c.task_id,
    task_records.c.try_number,
    task_records.c.task_name,
    task_records.c.queue,
    task_records.c.started_at,
    task_records.c.job_id,
    task_records.c.worker_hostname,
    task_records.c.worker_pid,
)


def find_overdue(
    conn: Connection, now: datetime, policy: OverduePolicy, limit: int = 500
) -> list[dict[str, Any]]:
    """Running tries older than their task's overdue bound, oldest first.

    Each row: the try's key, task name, queue, worker, ``started_at``, ``age``
    and ``bound`` (seconds), ``usual`` (the 95th percentile of the task's recent
    successful durations), ``runs`` (how many were read) and ``last_beat`` (its
    last ``heartbeat()``, or None).
    """
    running = conn.execute(
        select(*_RUNNING)
        .where(
            task_records.c.state == TaskState.RUNNING.value,
            task_records.c.started_at < now - timedelta(seconds=policy.min_seconds),
        )
        .order_by(task_records.c.started_at)
        .limit(MAX_CANDIDATES)
    ).mappings()
    candidates = [dict(r) for r in running]
    bounds = {name: _bound(conn, name, policy) for name in {c["task_name"] for c in candidates}}
    found = []
    for row in candidates:
        judged = bounds[row["task_name"]]
        age = (now - row["started_at"]).total_seconds()
        if judged is not None and age > judged[0]:
            bound, usual, runs = judged
            row.update(age=round(age, 1), bound=round(bound, 1), usual=round(usual, 3), runs=runs)
            found.append(row)
    found = found[:limit]
    beats = _last_beats(conn, [(r["task_id"], r["try_number"]) for r in found])
    for row in found:
        row["last_beat"] = beats.get((row["task_id"], row["try_number"]))
    return found


def _bound(conn: Connection, name: str, policy: OverduePolicy) -> tuple[float, float, int] | None:
    """(bound, usual duration, runs read) of task ``name``, or None: too little history."""
    stmt = (
        select(task_records.c.started_at, task_records.c.ended_at)
        .where(
            task_records.c.task_name == name,
            task_records.c.state == TaskState.SUCCESS.value,
            task_records.c.queued_at.is_not(None),
            task_records.c.started_at.is_not(None),
            task_records.c.ended_at.is_not(None),
        )
        .order_by(task_records.c.queued_at.desc())
        .limit(SAMPLE_RUNS)
    )
    durations = [max(0.0, (end - start).total_seconds()) for start, end in conn.execute(stmt)]
    judged = policy.bound(durations)
    return None if judged is None else (*judged, len(durations))


def _last_beats(conn: Connection, keys: list[tuple[str, int]]) -> dict[tuple[str, int], datetime]:
    if not keys:
        return {}
    key = (task_heartbeats.c.task_id, task_heartbeats.c.try_number)
    rows = conn.execute(select(*key, task_heartbeats.c.beat_at).where(tuple_(*key).in_(keys)))
    return {(r.task_id, r.try_number): r.beat_at for r in rows}


class OverdueReads(Repository):
    """Running tries far past their task's usual duration (``inspect overdue``, the gauge)."""

    def find(self, now: datetime, policy: OverduePolicy, limit: int = 500) -> list[dict[str, Any]]:
        """See :func:`find_overdue`; one read transaction, no write."""
        with self.transaction() as conn:
            return find_overdue(conn, now, policy, limit)
