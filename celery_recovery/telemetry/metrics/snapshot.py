"""Gauges read from the store once per sweep pass: live jobs, heartbeat ages, pending
callbacks, overdue tries.

Computed at sweep time rather than at scrape time so that any process that
sweeps (a ``sweep --loop``, a worker running beat's sweep task or the
fallback) keeps them current without a scrape ever touching the database.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from celery_recovery.core.overdue import OverduePolicy
from celery_recovery.telemetry.metrics import definitions as m
from celery_recovery.telemetry.metrics.record import quietly

if TYPE_CHECKING:
    from celery_recovery.core.settings import RecoverySettings
    from celery_recovery.store import Store

#: Overdue tries counted at most (the gauge saturates there; inspect lists them).
MAX_OVERDUE_COUNTED = 1000


def refresh_gauges(store: Store, now: datetime, settings: RecoverySettings | None = None) -> None:
    """Query the store and set the gauges; raises StoreError (the sweep isolates it).
    The overdue gauge needs ``settings`` (its policy); without them it is left alone."""
    running, pending = store.jobs.gauge_snapshot()
    _set(running, pending, now)
    if settings is not None:
        found = store.overdue.find(now, OverduePolicy.of(settings), MAX_OVERDUE_COUNTED)
        _set_overdue(len(found))


@quietly
def _set_overdue(count: int) -> None:
    m.OVERDUE_TRIES.set(count)


@quietly
def _set(running: dict[str, tuple[int, datetime]], pending: int, now: datetime) -> None:
    m.CALLBACKS_PENDING.set(pending)
    for job_type in m.JOB_TYPES:
        count, oldest = running.get(job_type, (0, None))
        m.JOBS_RUNNING.labels(job_type).set(count)
        age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else float("nan")
        m.HEARTBEAT_AGE.labels(job_type).set(age)
