"""Gauges read from the store once per sweep pass: live jobs, heartbeat ages, pending callbacks.

Computed at sweep time rather than at scrape time so that any process that
sweeps (a ``sweep --loop``, a worker running beat's sweep task or the
fallback) keeps them current without a scrape ever touching the database.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from celery_recovery.metrics import definitions as m
from celery_recovery.metrics.record import quietly

if TYPE_CHECKING:
    from celery_recovery.store import Store


def refresh_gauges(store: Store, now: datetime) -> None:
    """Query the store and set the gauges; raises StoreError (the sweep isolates it)."""
    running, pending = store.jobs.gauge_snapshot()
    _set(running, pending, now)


@quietly
def _set(running: dict[str, tuple[int, datetime]], pending: int, now: datetime) -> None:
    m.CALLBACKS_PENDING.set(pending)
    for job_type in m.JOB_TYPES:
        count, oldest = running.get(job_type, (0, None))
        m.JOBS_RUNNING.labels(job_type).set(count)
        age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else float("nan")
        m.HEARTBEAT_AGE.labels(job_type).set(age)
