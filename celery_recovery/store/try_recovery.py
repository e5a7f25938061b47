"""What the sweeps do to tries: find zombies and lost messages, reset, reconcile, adopt.

Each method is one short transaction; every change is a compare-and-set that also
checks the job the sweep saw, so a try that a redelivery re-claimed meanwhile is
left alone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    and_,
    exists,
    func,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.engine import Connection

from celery_recovery.core.audit import Decision
from celery_recovery.core.records import ResetPlan, TryRow, ZombieRow
from celery_recovery.core.states import RETRY_RECONCILED_REASON, JobState, TaskState
from celery_recovery.store.audit import append_decision
from celery_recovery.store.repository import Repository, rows_of
from celery_recovery.store.schema import (
    callbacks,
    jobs,
    reservations,
    same_try,
    task_records,
)

#: Extra age, in seconds, before a running try whose job row is missing counts as
#: a zombie: the job may have been unable to register while the store was down.
MISSING_JOB_GRACE = 60.0


class TryRecovery(Repository):
    """The sweeps' reads and compare-and-set changes of tries (``store.try_recovery``)."""

    def find_zombies(self, now: datetime, threshold: float, limit: int = 500) -> list[ZombieRow]:
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
                jobs.c.parent_pid.label("job_parent_pid"),
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
            return rows_of(conn.execute(stmt))

    def find_lost(
        self, now: datetime, timeout: float, live_threshold: float, limit: int = 500
    ) -> list[TryRow]:
        """Queued tries no worker has started within ``timeout`` seconds of when they were due,
        and that no live worker holds (reserved by a job that beat within ``live_threshold``:
        a prefetched message waiting behind long tasks is not lost)."""
        cutoff = now - timedelta(seconds=timeout)
        held_by_live_worker = exists().where(
            same_try(reservations),
            reservations.c.job_id == jobs.c.id,
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.latest_heartbeat >= now - timedelta(seconds=live_threshold),
            # A reception before the try's last start was used up by that start: the
            # main process may write its reservation after the pool process started
            # the try and sent it back to the queue (Celery failed before the body),
            # whose delete of the reservation it then follows.
            or_(
                task_records.c.started_at.is_(None),
                reservations.c.reserved_at >= task_records.c.started_at,
            ),
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
            return rows_of(conn.execute(stmt))

    def find_retries_never_sent(
        self, now: datetime, timeout: float, limit: int = 500
    ) -> list[TryRow]:
        """Tries a sweep made ``up_for_retry`` because the result backend read RETRY,
        more than ``timeout`` seconds ago, of which no later try was ever recorded."""
        later = task_records.alias("later")
        stmt = (
            select(task_records)
            .where(
                task_records.c.state == TaskState.UP_FOR_RETRY.value,
                task_records.c.state_reason == RETRY_RECONCILED_REASON,
                task_records.c.recovered_at < now - timedelta(seconds=timeout),
                ~exists().where(
                    later.c.task_id == task_records.c.task_id,
                    later.c.try_number > task_records.c.try_number,
                ),
            )
            .order_by(task_records.c.recovered_at)
            .limit(limit)
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def reopen_retry_never_sent(
        self, task_id: str, try_number: int, reason: str, now: datetime, audit: Decision
    ) -> bool:
        """Queue again a try a sweep made ``up_for_retry`` from the backend's RETRY, of
        which no later try was recorded, because its own message came back (compare-and-set
        on that state and reason, and on there being no later try); True when it won."""
        later = task_records.alias("later")
        stmt = (
            update(task_records)
            .where(
                task_records.c.task_id == task_id,
                task_records.c.try_number == try_number,
                task_records.c.state == TaskState.UP_FOR_RETRY.value,
                task_records.c.state_reason == RETRY_RECONCILED_REASON,
                ~exists().where(later.c.task_id == task_id, later.c.try_number > try_number),
            )
            .values(
                state=TaskState.QUEUED.value,
                state_reason=reason,
                ended_at=None,
                updated_at=now,
            )
        )
        with self.transaction() as conn:
            won = conn.execute(stmt).rowcount == 1
            if won:
                append_decision(conn, audit)
            return won

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
                _recovered_outcome(plan.new_state, plan.reason, now),
                plan.expected_reason,
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
        values = _recovered_outcome(new_state, reason, now)
        return self._cas_audited(
            task_id, try_number, expected_state, expected_job_id, values, audit
        )

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
        values = {
            "job_id": new_job_id,
            "adopted_until": until,
            "state_reason": reason,
            "updated_at": now,
            "recovered_at": now,
        }
        running = TaskState.RUNNING
        return self._cas_audited(task_id, try_number, running, expected_job_id, values, audit)

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
                task_records.c.state_reason,
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
                    "state_reason": None,
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

    def _cas_audited(
        self,
        task_id: str,
        try_number: int,
        expected_state: TaskState,
        expected_job_id: str | None,
        values: dict[str, Any],
        audit: Decision | None,
    ) -> bool:
        """One compare-and-set of a try, with its audit row when it wins, in one transaction."""
        with self.transaction() as conn:
            won = self._cas_try(conn, task_id, try_number, expected_state, expected_job_id, values)
            if won:
                append_decision(conn, audit)
            return won

    def _cas_try(
        self,
        conn: Connection,
        task_id: str,
        try_number: int,
        expected_state: TaskState,
        expected_job_id: str | None,
        values: dict[str, Any],
        expected_reason: str | None = None,
    ) -> bool:
        job_matches = (
            task_records.c.job_id.is_(None)
            if expected_job_id is None
            else task_records.c.job_id == expected_job_id
        )
        reason_matches = (
            true() if expected_reason is None else task_records.c.state_reason == expected_reason
        )
        stmt = (
            update(task_records)
            .where(
                task_records.c.task_id == task_id,
                task_records.c.try_number == try_number,
                task_records.c.state == expected_state.value,
                job_matches,
                reason_matches,
            )
            .values(**values)
        )
        return conn.execute(stmt).rowcount == 1


def _recovered_outcome(state: TaskState, reason: str, now: datetime) -> dict[str, Any]:
    """The columns of a try a sweep ends (reset, failed or reconciled) at ``now``."""
    return {
        "state": state.value,
        "state_reason": reason,
        "ended_at": now,
        "updated_at": now,
        "recovered_at": now,
    }
