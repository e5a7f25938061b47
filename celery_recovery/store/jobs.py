"""Jobs: one row per participating process, its heartbeat and how it ended."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    exists,
    func,
    or_,
    select,
    update,
)

from celery_recovery.core.records import JobRow
from celery_recovery.core.states import JobState, JobType, TaskState
from celery_recovery.store.repository import Repository, equal_where_given, row_of, rows_of
from celery_recovery.store.schema import (
    callbacks,
    jobs,
    task_records,
)


class JobRepository(Repository):
    """Worker, beat and triggerer jobs: registration, heartbeats, ends, and reads."""

    def add_job(self, job: Mapping[str, Any]) -> None:
        """Insert a job row; a row with the same id already there is left as it is."""
        stmt = self._insert(jobs).values(**job).on_conflict_do_nothing(index_elements=["id"])
        with self.transaction() as conn:
            conn.execute(stmt)

    def heartbeat(
        self, job_id: str, now: datetime, consumer: Mapping[str, Any] | None = None
    ) -> bool:
        """Refresh a running job's heartbeat, and with ``consumer`` its consumer state
        (a worker's main process), in the same statement; False when the job is
        missing or ended."""
        values: dict[str, Any] = {"latest_heartbeat": now}
        if consumer is not None:
            values["consumer"] = dict(consumer)
        stmt = (
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state == JobState.RUNNING)
            .values(**values)
        )
        with self.single_statement() as conn:
            return conn.execute(stmt).rowcount == 1

    def end_job(self, job_id: str, state: JobState, now: datetime) -> bool:
        """Move a running job to ``state`` (compare-and-set from ``running``)."""
        stmt = (
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.state == JobState.RUNNING)
            .values(state=state, end_date=now)
        )
        with self.single_statement() as conn:
            return conn.execute(stmt).rowcount == 1

    def get_job(self, job_id: str) -> JobRow | None:
        with self.transaction() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).mappings().first()
        return row_of(row)

    def list_jobs(self, job_type: str | None = None, state: str | None = None) -> list[JobRow]:
        stmt = (
            select(jobs)
            .where(*equal_where_given({jobs.c.job_type: job_type, jobs.c.state: state}))
            .order_by(jobs.c.start_date)
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def live_jobs(self, now: datetime, threshold: float, job_type: JobType) -> list[JobRow]:
        cutoff = now - timedelta(seconds=threshold)
        stmt = select(jobs).where(
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.job_type == job_type.value,
            jobs.c.latest_heartbeat >= cutoff,
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def silent_jobs(self, now: datetime, thresholds: dict[JobType, float]) -> list[dict[str, Any]]:
        """Running jobs whose heartbeat is older than their type's threshold."""
        with self.transaction() as conn:
            return [
                row
                for job_type, threshold in thresholds.items()
                for row in rows_of(
                    conn.execute(select(jobs).where(*_silent(job_type, threshold, now)))
                )
            ]

    def fail_dead_jobs(
        self, now: datetime, thresholds: dict[JobType, float], spared: Collection[str] = ()
    ) -> list[dict[str, Any]]:
        """Mark running jobs whose heartbeat is older than their type's threshold as failed,
        but for the ids in ``spared`` (alive by another witness).

        A worker job running a try is left to the zombie step, which ends it with its
        try: that step may be waiting for the job's live main process to record the
        death, or have found the worker partitioned (asked about that try over the
        broker); ending the job here would make its try a zombie of a dead job, run
        again without asking."""
        dead: list[dict[str, Any]] = []
        with self.transaction() as conn:
            for job_type, threshold in thresholds.items():
                where = _silent(job_type, threshold, now)
                if job_type is JobType.WORKER:
                    where = (*where, ~_running_a_try())
                if spared:
                    where = (*where, jobs.c.id.not_in(list(spared)))
                found = rows_of(conn.execute(select(jobs).where(*where)))
                if found:
                    conn.execute(
                        update(jobs)
                        .where(*where, jobs.c.id.in_([j["id"] for j in found]))
                        .values(state=JobState.FAILED.value, end_date=now)
                    )
                dead.extend(found)
        return dead

    def gauge_snapshot(self) -> tuple[dict[str, tuple[int, datetime]], int]:
        """Running jobs per type as (count, oldest heartbeat), and the outbox's size.

        Two aggregate queries (the running-jobs one uses ``ix_jobs_live``), made
        once per sweep pass, never per task.
        """
        stmt = (
            select(jobs.c.job_type, func.count(), func.min(jobs.c.latest_heartbeat))
            .where(jobs.c.state == JobState.RUNNING.value)
            .group_by(jobs.c.job_type)
        )
        with self.transaction() as conn:
            running = {row[0]: (int(row[1]), row[2]) for row in conn.execute(stmt)}
            pending = conn.execute(select(func.count()).select_from(callbacks)).scalar_one()
        return running, int(pending)

    def jobs_overview(
        self, job_type: str | None = None, include_ended: bool = False, limit: int = 500
    ) -> list[dict]:
        """Jobs, running ones first, newest heartbeat first within each group."""
        stmt = select(jobs)
        if job_type is not None:
            stmt = stmt.where(jobs.c.job_type == job_type)
        if not include_ended:
            stmt = stmt.where(jobs.c.state == JobState.RUNNING.value)
        running_first = (jobs.c.state == JobState.RUNNING.value).desc()
        stmt = stmt.order_by(running_first, jobs.c.latest_heartbeat.desc()).limit(limit)
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def consumer_jobs(self, hostname: str | None = None) -> list[JobRow]:
        """Running worker jobs that record a consumer (worker main processes), on
        ``hostname`` (host name or Celery node name) when given; freshest first."""
        stmt = select(jobs).where(
            jobs.c.job_type == JobType.WORKER.value,
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.consumer.is_not(None),
        )
        if hostname is not None:
            stmt = stmt.where(or_(jobs.c.hostname == hostname, jobs.c.node_name == hostname))
        stmt = stmt.order_by(jobs.c.latest_heartbeat.desc())
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def freshest_job(self, job_type: str, hostname: str | None = None) -> JobRow | None:
        """The running job of ``job_type`` (on ``hostname``, matched against the host
        name or the Celery node name) with the newest heartbeat, or None."""
        stmt = select(jobs).where(
            jobs.c.job_type == job_type, jobs.c.state == JobState.RUNNING.value
        )
        if hostname is not None:
            stmt = stmt.where(or_(jobs.c.hostname == hostname, jobs.c.node_name == hostname))
        stmt = stmt.order_by(jobs.c.latest_heartbeat.desc()).limit(1)
        with self.transaction() as conn:
            row = conn.execute(stmt).mappings().first()
        return row_of(row)


def _running_a_try() -> Any:
    """SQL condition: the ``jobs`` row holds a ``running`` try."""
    return exists().where(
        task_records.c.job_id == jobs.c.id, task_records.c.state == TaskState.RUNNING.value
    )


def _silent(job_type: JobType, threshold: float, now: datetime) -> tuple[Any, ...]:
    """Running jobs of ``job_type`` whose last heartbeat is older than ``threshold``."""
    return (
        jobs.c.state == JobState.RUNNING.value,
        jobs.c.job_type == job_type.value,
        jobs.c.latest_heartbeat < now - timedelta(seconds=threshold),
    )
