"""The overview page: live jobs against their thresholds, sweeps, counts, recoveries per hour,
overdue tries.

A handful of aggregate queries, each on an index (or a small table), with the
per-hour counts grouped by the database: the page costs the same with a
million tries as with ten.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from celery_recovery.core.audit import RECOVERY_ACTIONS
from celery_recovery.core.overdue import OverduePolicy
from celery_recovery.core.records import CLEAN_SWEEP, SWEEP_COMPLETION
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.states import JobState, JobType, TaskState
from celery_recovery.store.overdue import find_overdue
from celery_recovery.store.schema import (
    audit_log,
    callbacks,
    checkins,
    jobs,
    leases,
    task_records,
    triggers,
)
from celery_recovery.web.readonly import ReadOnlyStore, fetch_rows

#: Live jobs listed per type on the overview.
OVERVIEW_JOBS = 200
#: Overdue tries listed on the overview, oldest first.
OVERVIEW_OVERDUE = 50


class OverviewQueries:
    """The overview, mixed into :class:`~celery_recovery.web.queries.ConsoleQueries`."""

    store: ReadOnlyStore
    settings: RecoverySettings

    def threshold(self, job_type: str) -> float:
        """Heartbeat age, in seconds, that makes a job of this type dead (as the sweeps judge)."""
        if job_type == JobType.WORKER.value:
            return self.settings.zombie_threshold
        return self.settings.health_check_threshold

    def overdue(self, now: datetime) -> list[dict[str, Any]]:
        """Running tries far past their task's usual duration (docs/stuck.md), as
        ``inspect overdue`` finds them, on the console's read-only connection."""
        with self.store.reading() as conn:
            return find_overdue(conn, now, OverduePolicy.of(self.settings), OVERVIEW_OVERDUE)

    def overview(self, now: datetime) -> dict[str, Any]:
        queued_cutoff = now - timedelta(seconds=self.settings.queued_timeout)
        day_ago = now - timedelta(days=1)
        live = (
            select(jobs)
            .where(jobs.c.state == JobState.RUNNING.value)
            .order_by(jobs.c.job_type, jobs.c.latest_heartbeat)
            .limit(OVERVIEW_JOBS * len(JobType))
        )
        count_tries = select(func.count()).select_from(task_records)
        with self.store.reading() as conn:
            running_jobs = [dict(r) for r in conn.execute(live).mappings()]
            leased = fetch_rows(conn, select(leases).order_by(leases.c.name).limit(100))
            checked_in = {
                row["name"]: row
                for row in fetch_rows(
                    conn,
                    select(checkins).where(checkins.c.name.in_((SWEEP_COMPLETION, CLEAN_SWEEP))),
                )
            }
            counts = {
                "running": conn.execute(
                    count_tries.where(task_records.c.state == TaskState.RUNNING.value)
                ).scalar_one(),
                "queued_past_timeout": conn.execute(
                    count_tries.where(
                        task_records.c.state == TaskState.QUEUED.value,
                        task_records.c.queued_at < queued_cutoff,
                    )
                ).scalar_one(),
                "deferred": conn.execute(
                    select(func.count()).select_from(triggers).where(triggers.c.fired_at.is_(None))
                ).scalar_one(),
                "callbacks_pending": conn.execute(
                    select(func.count()).select_from(callbacks)
                ).scalar_one(),
            }
            hour = _hour_of(audit_log.c.at, self.store.dialect)
            recent = conn.execute(
                select(hour, audit_log.c.action, func.count())
                .where(audit_log.c.at >= day_ago)
                .group_by(hour, audit_log.c.action)
            ).all()
        by_type: dict[str, list[dict[str, Any]]] = {t.value: [] for t in JobType}
        for job in running_jobs:
            age = (now - job["latest_heartbeat"]).total_seconds()
            threshold = self.threshold(job["job_type"])
            job.update(heartbeat_age=round(age, 1), threshold=threshold, late=age > threshold)
            by_type.setdefault(job["job_type"], []).append(job)
        sweep = checked_in.get(SWEEP_COMPLETION, {})
        completed, report = sweep.get("completed_at"), sweep.get("report")
        clean = checked_in.get(CLEAN_SWEEP, {}).get("completed_at")
        # Who sweeps: beat (its job above), or a worker's fallback holding its lease.
        sweepers = [
            {k: row[k] for k in ("name", "holder", "expires_at")}
            for row in leased
            if row["holder"] and row["expires_at"] and row["expires_at"] > now
        ]
        return {
            "now": now,
            "store": self.store.masked_url,
            "jobs": by_type,
            "last_sweep": {
                "completed_at": completed,
                "age": round((now - completed).total_seconds(), 1) if completed else None,
                "interval": self.settings.sweep_interval,
                "report": report if isinstance(report, dict) else None,
                "clean_at": clean,
                "clean_age": round((now - clean).total_seconds(), 1) if clean else None,
            },
            "sweepers": sweepers,
            "counts": counts,
            "recoveries_per_hour": _per_hour(
                now, [(h, n) for h, action, n in recent if action in RECOVERY_ACTIONS]
            ),
            "recoveries_last_day": _by_action(recent),
        }


def _hour_of(column: Any, dialect: str) -> Any:
    """The UTC hour a timestamp falls in, computed by the database (grouped there)."""
    if dialect == "postgresql":
        return func.date_trunc("hour", func.timezone("UTC", column))
    return func.strftime("%Y-%m-%d %H:00:00", column)


def _as_hour(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment.replace(tzinfo=UTC)


def _per_hour(now: datetime, counted: list[tuple[Any, int]]) -> list[dict[str, Any]]:
    """Decisions per hour over the last 24 hours, oldest hour first."""
    top = now.replace(minute=0, second=0, microsecond=0)
    hours = [top - timedelta(hours=23 - i) for i in range(24)]
    counts: Counter[datetime] = Counter()
    for hour, n in counted:
        counts[_as_hour(hour)] += int(n)
    return [{"hour": hour, "count": counts.get(hour, 0)} for hour in hours]


def _by_action(counted: Sequence[Any]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for _hour, action, n in counted:
        totals[action] += int(n)
    return dict(totals)
