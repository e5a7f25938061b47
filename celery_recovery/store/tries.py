"""Task tries: the publisher's and the worker's records, and their compare-and-set changes.

Every method runs in one short transaction of its own and returns plain
values; no caller code runs while a transaction is open.  Each state change
is an ``UPDATE ... WHERE task_id AND try_number AND state IN (expected)`` and
reports whether it won; losing is normal and never raises.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, bindparam, case, delete, or_, select, update
from sqlalchemy.engine import Connection

from celery_recovery.core.records import OutboxedTransition, Transition, TryRow, WriteKind
from celery_recovery.core.states import TaskState
from celery_recovery.store.audit import append_decisions
from celery_recovery.store.batches import (
    coalesce,
    one_statement,
    runs,
    transition_groups,
    uniform,
)
from celery_recovery.store.database import Database
from celery_recovery.store.precompiled import PrecompiledBatch
from celery_recovery.store.repository import Repository, equal_where_given, rows_of
from celery_recovery.store.reservations import ReservationRepository
from celery_recovery.store.schema import TRY_KEY, callbacks, reservations, task_records

#: States a delivery may move to ``running`` from: a fresh message, or a
#: redelivery of a try whose earlier delivery was already running.
CLAIMABLE_FOR_RUN = (TaskState.QUEUED, TaskState.RUNNING)


#: Columns a worker's claim sets on a try that already exists.
CLAIM_COLUMNS = (
    "state",
    "job_id",
    "worker_hostname",
    "worker_pid",
    "started_at",
    "ended_at",
    "updated_at",
    "state_reason",
    "error",
    "idempotency_key",
    "fencing_token",
    # A worker's own claim confirms (ends) an adoption.
    "adopted_until",
)


#: What is needed to publish a task again: the message facts a try carries.
MESSAGE_COLUMNS = (
    "queue",
    "exchange",
    "routing_key",
    "priority",
    "args",
    "kwargs",
    "headers",
    "options",
    "republishable",
    "republish_error",
    "expires",
)


#: Columns whose truth is the published message; a publisher's record sets them
#: even when a worker already created the try.
PUBLISHER_COLUMNS = (*MESSAGE_COLUMNS, "eta", "queued_at")


class TryRepository(Repository):
    """Task tries: queued, claimed, changed by compare-and-set, written in batches.

    What the sweeps read and change of tries is ``store.try_recovery``
    (:class:`~celery_recovery.store.try_recovery.TryRecovery`).
    """

    def __init__(self, db: Database, reservations: ReservationRepository) -> None:
        super().__init__(db)
        #: Reservations ride in the same write-behind batches as the tries.
        self.reservations = reservations

    def mark_running(self, record: dict[str, Any]) -> bool:
        """Claim a try for the job in ``record``: insert it, or move it to ``running``.

        Returns False when the try already reached a state a delivery must not
        leave (finished or superseded).
        """
        with self.single_statement() as conn:
            return self._upsert_running(conn, record)

    def claim_counting_deaths(self, record: dict[str, Any]) -> int | None:
        """Claim a try as :meth:`mark_running` does, durably before the body runs; the
        try's ``deaths`` after the claim, or None when the claim did not land.

        A claim that finds its try still ``running`` follows a run whose process
        died (a live run's redelivery is dropped before it claims): one more death.
        """
        stmt = self._statement(
            "claim_counting", lambda: self._build_upsert_running().returning(task_records.c.deaths)
        )
        with self.single_statement() as conn:
            row = conn.execute(stmt, uniform([record], _CLAIM_VALUES)[0]).first()
        return None if row is None else int(row[0])

    def apply_outboxed(self, items: Sequence[OutboxedTransition]) -> int:
        """Apply transitions with their callback rows in one transaction; how many won."""
        with self.transaction() as conn:
            return self._apply_outboxed(conn, items)

    def transition(
        self,
        task_id: str,
        try_number: int,
        expected: TaskState | Iterable[TaskState],
        new: TaskState,
        **values: Any,
    ) -> bool:
        """Compare-and-set one try from one of ``expected`` to ``new``; True when it won."""
        change = Transition(task_id, try_number, _states(expected), {"state": new, **values})
        with self.single_statement() as conn:
            return self._apply_transitions(conn, [change]) == 1

    def history(self, task_id: str) -> list[TryRow]:
        """Every try of a task, oldest first."""
        stmt = (
            select(task_records)
            .where(task_records.c.task_id == task_id)
            .order_by(task_records.c.try_number)
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def list_tries(
        self, state: str | None = None, task_name: str | None = None, limit: int = 100
    ) -> list[TryRow]:
        given = {task_records.c.state: state, task_records.c.task_name: task_name}
        stmt = (
            select(task_records)
            .where(*equal_where_given(given))
            .order_by(task_records.c.updated_at.desc())
            .limit(limit)
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def farthest_eta(self) -> tuple[str, datetime, datetime | None] | None:
        """The queued try whose ETA is farthest ahead, as (task name, ETA, when it was
        queued), or None: how long a worker holds a message (``celery-recovery doctor``)."""
        stmt = (
            select(task_records.c.task_name, task_records.c.eta, task_records.c.queued_at)
            .where(task_records.c.state == TaskState.QUEUED.value, task_records.c.eta.is_not(None))
            .order_by(task_records.c.eta.desc())
            .limit(1)
        )
        with self.transaction() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else (row[0], row[1], row[2])

    def apply_writes(self, writes: Sequence[tuple[WriteKind, Any]]) -> None:
        """Apply buffered writes in order, in one transaction (the write-behind path).

        ``writes`` holds ``("queued", record)``, ``("running", record)``,
        ``("transition", Transition)``, ``("outboxed", OutboxedTransition)``,
        ``("late", (task_id, try, state, at))``, ``("audit", Decision)`` and
        ``("reserved", (task_id, try, job_id, at))`` items; runs of one kind are
        batched.  Reservations touch only their own table, so they are applied
        together, as one statement, after the others.
        """
        appliers: dict[str, Callable[[Connection, list[Any]], Any]] = {
            WriteKind.QUEUED: self._insert_queued,
            WriteKind.RUNNING: self._upsert_running_many,
            WriteKind.TRANSITION: self._apply_transitions,
            WriteKind.LATE: self._record_late_outcomes,
            WriteKind.OUTBOXED: self._apply_outboxed,
            WriteKind.AUDIT: append_decisions,
            WriteKind.RESERVED: self.reservations.upsert,
        }
        # The commit waits for the WAL flush (no ``synchronous_commit = off``): the
        # caller forgets a batch once it is acknowledged, so an acknowledged batch
        # that a PostgreSQL crash then loses would be lost for good (records left
        # ``queued`` or missing; tests/faults/test_postgres.py, ``-m immediate``).
        # One flush per batch, in the writer thread, stays off the task's path.
        writes = coalesce(writes)
        ordered = [w for w in writes if w[0] != WriteKind.RESERVED]
        ordered += [w for w in writes if w[0] == WriteKind.RESERVED]
        batch = list(runs(ordered))
        # A batch that is one statement (a publisher's queued rows, a pool process's
        # claims) needs no BEGIN and COMMIT of its own: two round trips fewer.
        connect = self.single_statement if one_statement(batch) else self.transaction
        with connect() as conn:
            for kind, items in batch:
                appliers[kind](conn, items)

    def _insert_queued(self, conn: Connection, records: Sequence[dict[str, Any]]) -> None:
        batch = self._statement(
            "queued_batch",
            lambda: PrecompiledBatch(self._build_insert_queued(), task_records, TRY_KEY),
        )
        batch.execute(conn, uniform(records), owned=True)

    def _build_insert_queued(self) -> Any:
        insert = self._insert(task_records)
        # A worker may have claimed the try before the publisher's write landed:
        # keep its state, but take the message facts only the publisher knows.
        return insert.on_conflict_do_update(
            index_elements=list(TRY_KEY),
            set_={column: insert.excluded[column] for column in PUBLISHER_COLUMNS},
        )

    def _upsert_running(self, conn: Connection, record: dict[str, Any]) -> bool:
        stmt = self._statement(
            "running", lambda: self._build_upsert_running().returning(task_records.c.try_number)
        )
        # rowcount is not reported for INSERT on every driver; a returned row is.
        return conn.execute(stmt, uniform([record], _CLAIM_VALUES)[0]).first() is not None

    def _upsert_running_many(self, conn: Connection, records: Sequence[dict[str, Any]]) -> None:
        batch = self._statement(
            "running_batch",
            lambda: PrecompiledBatch(self._build_upsert_running(), task_records, TRY_KEY),
        )
        batch.execute(conn, uniform(records, _CLAIM_VALUES), owned=True)

    def _build_upsert_running(self) -> Any:
        insert = self._insert(task_records)
        # The claim's own values, which after coalescing may already be its outcome.
        claim: dict[str, Any] = {column: insert.excluded[column] for column in CLAIM_COLUMNS}
        # SET sees the row as it was: still running in another job means the previous
        # run's process died.  Running in this very job is this delivery's own earlier
        # claim (the redundant-delivery check claims before the death-counting claim).
        died = and_(
            task_records.c.state == TaskState.RUNNING.value,
            task_records.c.job_id.is_distinct_from(insert.excluded.job_id),
        )
        claim["deaths"] = task_records.c.deaths + case((died, 1), else_=0)
        return insert.on_conflict_do_update(
            index_elements=list(TRY_KEY),
            set_=claim,
            where=or_(
                *(task_records.c.state == str(s) for s in CLAIMABLE_FOR_RUN),
                # Revoked by a sweep from what a publisher recorded (a revoke, an expiry,
                # a purge), yet delivered: the worker runs it, so the record follows.
                and_(
                    task_records.c.state == TaskState.REVOKED.value,
                    task_records.c.recovered_at.is_not(None),
                ),
            ),
        )

    def _record_late_outcomes(self, conn: Connection, items: Sequence[tuple]) -> None:
        """Keep the outcome a process reported after a sweep had recovered its try."""
        stmt = self._statement("late", _build_late_outcome)
        conn.execute(
            stmt,
            [
                {"b_task_id": t, "b_try_number": n, "v_state": s, "v_at": at}
                for t, n, s, at in items
            ],
        )

    def _apply_transitions(self, conn: Connection, changes: Sequence[Transition]) -> int:
        if any(_requeues(ch) for ch in changes):
            # Rare (a postponed or requeued delivery): one at a time, in order.
            return sum(
                self._requeue(conn, ch) if _requeues(ch) else self._apply_grouped(conn, [ch])
                for ch in changes
            )
        return self._apply_grouped(conn, changes)

    def _apply_grouped(self, conn: Connection, changes: Sequence[Transition]) -> int:
        """Apply changes batched by shape (one executemany per run of one shape)."""
        won = 0
        for shape, group in transition_groups(changes):
            _expected, columns, any_try = shape
            stmt = self._statement(
                ("transition", shape), functools.partial(_build_transition, *shape)
            )
            params = [
                {
                    "b_task_id": ch.task_id,
                    **({} if any_try else {"b_try_number": ch.try_number}),
                    **{f"v_{c}": ch.values[c] for c in columns},
                }
                for ch in group
            ]
            result = conn.execute(stmt, params[0] if len(params) == 1 else params)
            won += max(result.rowcount, 0)
        return won

    def _requeue(self, conn: Connection, change: Transition) -> int:
        """Send a running try back to ``queued``; whoever reserved its message no longer
        holds it (the delivery handed it back), so its reservation goes too: left, a live
        worker's reservation would keep the lost-message sweep off the try for good."""
        if change.died_in_pid is None:
            won = self._apply_grouped(conn, [change])
        else:
            won = self._requeue_dead_run(conn, change, change.died_in_pid)
        if won:
            conn.execute(
                delete(reservations).where(
                    reservations.c.task_id == change.task_id,
                    reservations.c.try_number == change.try_number,
                )
            )
        return won

    def _requeue_dead_run(self, conn: Connection, change: Transition, pid: int) -> int:
        """Requeue a try whose pool process died, counting that death, only while the try
        is still that process's: a redelivery that claimed it first counted the death."""
        stmt = (
            update(task_records)
            .where(
                task_records.c.task_id == change.task_id,
                task_records.c.try_number == change.try_number,
                or_(*(task_records.c.state == str(state) for state in change.expected)),
                task_records.c.worker_pid == pid,
            )
            .values(**change.values, deaths=task_records.c.deaths + 1)
        )
        return max(conn.execute(stmt).rowcount, 0)

    def _apply_outboxed(self, conn: Connection, items: Sequence[OutboxedTransition]) -> int:
        won = 0
        for item in items:
            if self._apply_transitions(conn, [item.transition]) == 1:
                conn.execute(callbacks.insert().values(**item.callback))
                won += 1
        return won


def _build_late_outcome() -> Any:
    return (
        update(task_records)
        .where(
            task_records.c.task_id == bindparam("b_task_id"),
            task_records.c.try_number == bindparam("b_try_number"),
            task_records.c.recovered_at.is_not(None),
            task_records.c.late_state.is_(None),
        )
        .values(late_state=bindparam("v_state"), late_at=bindparam("v_at"))
    )


def _build_transition(
    expected: tuple[TaskState, ...], columns: tuple[str, ...], any_try: bool
) -> Any:
    conditions = [
        task_records.c.task_id == bindparam("b_task_id"),
        # Not IN (...): expanding parameters cannot be used with executemany.
        or_(*(task_records.c.state == str(state) for state in expected)),
    ]
    if not any_try:
        conditions.append(task_records.c.try_number == bindparam("b_try_number"))
    return update(task_records).where(*conditions).values({c: bindparam(f"v_{c}") for c in columns})


#: What a claim writes besides its record: a new try's first run has no death behind
#: it (the column has no claim value to take).
_CLAIM_VALUES = {"deaths": 0}


def _states(expected: TaskState | Iterable[TaskState]) -> tuple[TaskState, ...]:
    if isinstance(expected, TaskState):
        return (expected,)
    return tuple(expected)


def _requeues(change: Transition) -> bool:
    """A change that sends a running try of a known number back to ``queued``."""
    return (
        change.try_number is not None
        and change.values.get("state") == TaskState.QUEUED
        and TaskState.RUNNING in change.expected
    )
