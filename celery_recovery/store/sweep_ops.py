"""The store operations the sweeps use: find, reset, reconcile, adopt, outbox, leases.

Mixed into :class:`~celery_recovery.store.Store`.  Each method is one short
transaction; every change is a compare-and-set that also checks the job the
sweep saw, so a try that a redelivery re-claimed meanwhile is left alone.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, delete, exists, func, or_, select, update
from sqlalchemy.engine import Connection

from ..audit import Decision
from ..states import JobState, JobType, TaskState
from .audit_ops import append_decision
from .schema import callbacks, jobs, leases, reservations, same_try, task_records

#: Extra age, in seconds, before a running try whose job row is missing counts as
#: a zombie: the job may have been unable to register while the store was down.
MISSING_JOB_GRACE = 60.0


@dataclass(frozen=True)
class ResetPlan:
    """What a sweep decided for one zombie or lost try, applied in one transaction."""

    task_id: str
    try_number: int
    expected_state: TaskState
    expected_job_id: str | None
    new_state: TaskState
    reason: str
    next_record: dict[str, Any] | None = None
    callback: dict[str, Any] | None = None
    dead_job_id: str | None = None
    #: The audit row, written only when the reset wins.
    audit: Decision | None = None


class SweepOperations:
    """Store methods used by the sweeps (see :mod:`celery_recovery.sweeps`)."""

    dialect: str

    def transaction(self) -> AbstractContextManager[Connection]:  # pragma: no cover
        raise NotImplementedError

    def _insert(self, table: Any) -> Any:  # pragma: no cover
        raise NotImplementedError

    # -- finding work --------------------------------------------------------

    def find_zombies(self, now: datetime, threshold: float, limit: int = 500) -> list[dict]:
        """Running tries whose job stopped heartbeating, ended, or never registered."""
        cutoff = now - timedelta(seconds=threshold)
        missing_cutoff = cutoff - timedelta(seconds=MISSING_JOB_GRACE)
        stmt = (
            select(
                task_records,
                jobs.c.latest_heartbeat.label("job_heartbeat"),
                jobs.c.state.label("job_state"),
                jobs.c.hostname.label("job_hostname"),
                jobs.c.node_name.label("job_node_name"),
                jobs.c.pid.label("job_pid"),
            )
            .select_from(task_records.outerjoin(jobs, jobs.c.id == task_records.c.job_id))
            .where(
                task_records.c.state == TaskState.RUNNING.value,
                task_records.c.job_id.is_not(None),
                or_(
                    # An adoption whose deadline passed without the adopter's own claim.
                    task_records.c.adopted_until < now,
                    and_(
                        task_records.c.adopted_until.is_(None),
                        or_(
                            and_(jobs.c.id.is_(None), task_records.c.started_at < missing_cutoff),
                            jobs.c.state != JobState.RUNNING.value,
                            jobs.c.latest_heartbeat < cutoff,
                        ),
                    ),
                ),
            )
            .order_by(task_records.c.started_at)
            .limit(limit)
        )
        with self.transaction() as conn:
            return [dict(row) for row in conn.execute(stmt).mappings()]

    def find_lost(
        self, now: datetime, timeout: float, live_threshold: float, limit: int = 500
    ) -> list[dict]:
        """Queued tries no worker has started within ``timeout`` seconds of when they were due,
        and that no live worker holds (reserved by a job that beat within ``live_threshold``:
        a prefetched message waiting behind long tasks is not lost)."""
        cutoff = now - timedelta(seconds=timeout)
        held_by_live_worker = exists().where(
            same_try(reservations),
            reservations.c.job_id == jobs.c.id,
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.latest_heartbeat >= now - timedelta(seconds=live_threshold),
        )
        stmt = (
            select(task_records)
            .where(
                task_records.c.state == TaskState.QUEUED.value,
                task_records.c.queued_at < cutoff,
                or_(task_records.c.eta.is_(None), task_records.c.eta < cutoff),
                ~held_by_live_worker,
            )
            .order_by(task_records.c.queued_at)
            .limit(limit)
        )
        with self.transaction() as conn:
            return [dict(row) for row in conn.execute(stmt).mappings()]

    def live_jobs(self, now: datetime, threshold: float, job_type: JobType) -> list[dict]:
        cutoff = now - timedelta(seconds=threshold)
        stmt = select(jobs).where(
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.job_type == job_type.value,
            jobs.c.latest_heartbeat >= cutoff,
        )
        with self.transaction() as conn:
            return [dict(row) for row in conn.execute(stmt).mappings()]

    def fail_dead_jobs(
        self, now: datetime, thresholds: dict[JobType, float]
    ) -> list[dict[str, Any]]:
        """Mark running jobs whose heartbeat is older than their type's threshold as failed."""
        dead: list[dict[str, Any]] = []
        with self.transaction() as conn:
            for job_type, threshold in thresholds.items():
                cutoff = now - timedelta(seconds=threshold)
                where = (
                    jobs.c.state == JobState.RUNNING.value,
                    jobs.c.job_type == job_type.value,
                    jobs.c.latest_heartbeat < cutoff,
                )
                found = [dict(r) for r in conn.execute(select(jobs).where(*where)).mappings()]
                if found:
                    conn.execute(
                        update(jobs)
                        .where(*where, jobs.c.id.in_([j["id"] for j in found]))
                        .values(state=JobState.FAILED.value, end_date=now)
                    )
                dead.extend(found)
        return dead

    # -- changing tries ------------------------------------------------------

    def apply_reset(self, plan: ResetPlan, now: datetime) -> tuple[bool, bool]:
        """Apply a reset in one transaction; returns (won the try, inserted the next try).

        The next try is only inserted (and so only published) when no try with
        that number exists yet: a worker that retried before dying already made it.
        """
        with self.transaction() as conn:
            if not self._cas_try(
                conn,
                plan.task_id,
                plan.try_number,
                plan.expected_state,
                plan.expected_job_id,
                {
                    "state": plan.new_state.value,
                    "state_reason": plan.reason,
                    "ended_at": now,
                    "updated_at": now,
                    "recovered_at": now,
                },
            ):
                return False, False
            inserted = False
            if plan.next_record is not None:
                stmt = (
                    self._insert(task_records)
                    .values(**plan.next_record)
                    .on_conflict_do_nothing(index_elements=["task_id", "try_number"])
                    .returning(task_records.c.try_number)
                )
                inserted = conn.execute(stmt).first() is not None
            if plan.callback is not None:
                conn.execute(callbacks.insert().values(**plan.callback))
            if plan.dead_job_id is not None:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id == plan.dead_job_id, jobs.c.state == JobState.RUNNING.value)
                    .values(state=JobState.FAILED.value, end_date=now)
                )
            append_decision(conn, plan.audit)
            return True, inserted

    def reconcile_try(
        self,
        task_id: str,
        try_number: int,
        expected_state: TaskState,
        expected_job_id: str | None,
        new_state: TaskState,
        reason: str,
        now: datetime,
        audit: Decision | None = None,
    ) -> bool:
        """Give a try the outcome the result backend reports (compare-and-set)."""
        with self.transaction() as conn:
            won = self._cas_try(
                conn,
                task_id,
                try_number,
                expected_state,
                expected_job_id,
                {
                    "state": new_state.value,
                    "state_reason": reason,
                    "ended_at": now,
                    "updated_at": now,
                    "recovered_at": now,
                },
            )
            if won:
                append_decision(conn, audit)
            return won

    def adopt_try(
        self,
        task_id: str,
        try_number: int,
        expected_job_id: str | None,
        new_job_id: str | None,
        reason: str,
        now: datetime,
        until: datetime | None = None,
        audit: Decision | None = None,
    ) -> bool:
        """Re-point a running try to a live job (or give it a deadline) instead of resetting it."""
        with self.transaction() as conn:
            won = self._cas_try(
                conn,
                task_id,
                try_number,
                TaskState.RUNNING,
                expected_job_id,
                {
                    "job_id": new_job_id,
                    "adopted_until": until,
                    "state_reason": reason,
                    "updated_at": now,
                    "recovered_at": now,
                },
            )
            if won:
                append_decision(conn, audit)
            return won

    def delivery_view(self, task_id: str, try_number: int) -> dict[str, Any]:
        """What a worker needs to judge a delivery: the try's state and job, the latest try.

        Keys: ``state`` (None when the try is unknown), ``latest`` (highest try
        number, 0 when none), ``job_id`` and ``job_heartbeat`` of the try's job.
        """
        latest = (
            select(func.max(task_records.c.try_number))
            .where(task_records.c.task_id == task_id)
            .scalar_subquery()
        )
        stmt = (
            select(
                task_records.c.state,
                task_records.c.job_id,
                task_records.c.recovered_at,
                jobs.c.latest_heartbeat.label("job_heartbeat"),
                jobs.c.state.label("job_state"),
                jobs.c.hostname.label("job_hostname"),
                jobs.c.pid.label("job_pid"),
                latest.label("latest"),
            )
            .select_from(task_records.outerjoin(jobs, jobs.c.id == task_records.c.job_id))
            .where(task_records.c.task_id == task_id, task_records.c.try_number == try_number)
        )
        with self.transaction() as conn:
            row = conn.execute(stmt).mappings().first()
            if row is None:
                found = conn.execute(select(latest)).scalar()
                return {
                    "state": None,
                    "latest": int(found or 0),
                    "job_id": None,
                    "recovered_at": None,
                    "job_heartbeat": None,
                    "job_state": None,
                    "job_hostname": None,
                    "job_pid": None,
                }
        view = dict(row)
        view["latest"] = int(view["latest"] or 0)
        return view

    def _cas_try(
        self,
        conn: Connection,
        task_id: str,
        try_number: int,
        expected_state: TaskState,
        expected_job_id: str | None,
        values: dict[str, Any],
    ) -> bool:
        job_matches = (
            task_records.c.job_id.is_(None)
            if expected_job_id is None
            else task_records.c.job_id == expected_job_id
        )
        stmt = (
            update(task_records)
            .where(
                task_records.c.task_id == task_id,
                task_records.c.try_number == try_number,
                task_records.c.state == expected_state.value,
                job_matches,
            )
            .values(**values)
        )
        return conn.execute(stmt).rowcount == 1

    # -- failure callbacks outbox -------------------------------------------

    def claim_callbacks(
        self, now: datetime, holder: str, lease: float, limit: int = 50
    ) -> list[dict[str, Any]]:
        """Claim due callback rows for ``holder`` until ``now + lease`` (SKIP LOCKED on PG)."""
        due = (
            select(callbacks.c.id)
            .where(or_(callbacks.c.claimed_until.is_(None), callbacks.c.claimed_until < now))
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
            return sorted(
                (dict(row) for row in conn.execute(stmt).mappings()), key=lambda r: r["id"]
            )

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

    def pending_callbacks(self) -> list[dict[str, Any]]:
        with self.transaction() as conn:
            return [
                dict(r) for r in conn.execute(select(callbacks).order_by(callbacks.c.id)).mappings()
            ]

    # -- leases ---------------------------------------------------------------

    def acquire_lease(self, name: str, holder: str, now: datetime, ttl: float) -> int | None:
        """Take or extend lease ``name``; returns its fencing token, or None when held elsewhere.

        The token grows by one with every new holder, so work guarded by an
        older token can be told apart from the current holder's.
        """
        expires = now + timedelta(seconds=ttl)
        with self.transaction() as conn:
            conn.execute(
                self._insert(leases)
                .values(name=name, token=0)
                .on_conflict_do_nothing(index_elements=["name"])
            )
            stmt = (
                update(leases)
                .where(
                    leases.c.name == name,
                    or_(
                        leases.c.holder == holder,
                        leases.c.expires_at.is_(None),
                        leases.c.expires_at < now,
                    ),
                )
                .values(
                    token=func.coalesce(
                        # Same holder extending keeps its token; a new holder gets the next one.
                        _same_holder_token(holder),
                        leases.c.token + 1,
                    ),
                    holder=holder,
                    expires_at=expires,
                )
                .returning(leases.c.token)
            )
            row = conn.execute(stmt).first()
        return int(row[0]) if row else None

    def release_lease(self, name: str, holder: str, token: int) -> bool:
        stmt = (
            update(leases)
            .where(leases.c.name == name, leases.c.holder == holder, leases.c.token == token)
            .values(expires_at=None, holder=None)
        )
        with self.transaction() as conn:
            return conn.execute(stmt).rowcount == 1

    def mark_completed(
        self, name: str, now: datetime, report: dict[str, Any] | None = None
    ) -> None:
        """Record that the work named ``name`` (e.g. a sweep) finished at ``now``, and
        what it reported (kept when ``report`` is None)."""
        done: dict[str, Any] = {"completed_at": now}
        if report is not None:
            done["report"] = report
        with self.transaction() as conn:
            conn.execute(
                self._insert(leases)
                .values(name=name, token=0, **done)
                .on_conflict_do_update(index_elements=["name"], set_=done)
            )

    def last_completed(self, name: str) -> datetime | None:
        with self.transaction() as conn:
            return conn.execute(select(leases.c.completed_at).where(leases.c.name == name)).scalar()

    # -- gauges for metrics -----------------------------------------------------

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


def _same_holder_token(holder: str) -> Any:
    return case((leases.c.holder == holder, leases.c.token), else_=None)
