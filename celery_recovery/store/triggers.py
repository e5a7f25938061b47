"""The store operations of deferral and the triggerer.

A trigger's life is three
steps, each a short transaction of its own:

1. **claim**: a triggerer takes unassigned triggers, or those of a triggerer
   that stopped heartbeating, under row locks (SKIP LOCKED on PostgreSQL);
2. **fire**: the event is decided once: ``fired_at`` is set by a
   compare-and-set while the row still belongs to the firing triggerer, and a
   resumed try is queued again (with the resume header) in the same transaction;
3. **finish**: after the event's effect outside any transaction (a publish, a
   result-backend write), the try takes its outcome and the row is deleted.

A row that was fired but not finished (its triggerer died in between) is
finished by whoever claims it next, without running the trigger again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, insert, or_, select, tuple_, update
from sqlalchemy.engine import Connection

from celery_recovery.core.audit import Decision
from celery_recovery.core.outbox import CallbackPayload, OutboxRow, callback_row
from celery_recovery.core.records import TriggerRow
from celery_recovery.core.states import TaskState
from celery_recovery.store.audit import append_decision
from celery_recovery.store.repository import rows_of
from celery_recovery.store.schema import callbacks, jobs, reservations, task_records, triggers
from celery_recovery.store.trigger_reads import TriggerReads, live_triggerer

#: Event kinds kept on a fired trigger row.
RESUME, SUCCESS, FAILURE = "resume", "success", "failure"


@dataclass(frozen=True)
class Firing:
    """One event a trigger produced, to be recorded on its row."""

    trigger_id: int
    task_id: str
    try_number: int
    kind: str
    payload: Any
    #: For a resume: the headers the try is published again with.
    resume_header: tuple[str, dict[str, Any]] | None = None


@dataclass(frozen=True)
class Finish:
    """The outcome a fired trigger gives its try, and what is deleted."""

    trigger_id: int
    task_id: str
    try_number: int
    kind: str
    reason: str
    error: str | None = None
    #: For a failure: the exception class its failure callbacks receive.
    exception: str | None = None
    #: The audit row, written only when the outcome's compare-and-set wins.
    audit: Decision | None = None


class TriggerRepository(TriggerReads):
    """Store methods used by ``defer()`` and the triggerer."""

    dialect: str

    # -- deferring ------------------------------------------------------------

    def defer_try(
        self, record: dict[str, Any], trigger: dict[str, Any], now: datetime
    ) -> tuple[bool, str | None]:
        """Move a try to ``deferred`` and write its trigger row, in one transaction.

        ``record`` is the try as its worker sees it, inserted when the store
        never heard of the try.  Returns (done, the try's state when it was not).
        """
        task_id, try_number = record["task_id"], record["try_number"]
        reason = f"deferred: waiting for {trigger['classpath']}"
        with self.transaction() as conn:
            moved = conn.execute(
                update(task_records)
                .where(
                    task_records.c.task_id == task_id,
                    task_records.c.try_number == try_number,
                    or_(
                        task_records.c.state == TaskState.RUNNING.value,
                        task_records.c.state == TaskState.QUEUED.value,
                    ),
                )
                .values(state=TaskState.DEFERRED.value, state_reason=reason, updated_at=now)
            ).rowcount
            if moved != 1:
                inserted = conn.execute(
                    self._insert(task_records)
                    .values(**{**record, "state": TaskState.DEFERRED.value, "state_reason": reason})
                    .on_conflict_do_nothing(index_elements=["task_id", "try_number"])
                    .returning(task_records.c.try_number)
                ).first()
                if inserted is None:
                    state = conn.execute(
                        select(task_records.c.state).where(
                            task_records.c.task_id == task_id,
                            task_records.c.try_number == try_number,
                        )
                    ).scalar()
                    return False, state
            conn.execute(insert(triggers).values(**trigger, task_id=task_id, try_number=try_number))
        return True, None

    # -- claiming ---------------------------------------------------------------

    def claim_triggers(
        self,
        owner: str,
        queues: Sequence[str] | None,
        limit: int,
        now: datetime,
        dead_after: float,
    ) -> list[TriggerRow]:
        """Take up to ``limit`` triggers that no live triggerer holds, for ``owner``."""
        if limit <= 0:
            return []
        live = select(jobs.c.id).where(live_triggerer(now, dead_after))
        conditions = [or_(triggers.c.triggerer_id.is_(None), triggers.c.triggerer_id.not_in(live))]
        if queues:
            conditions.append(triggers.c.queue.in_(list(queues)))
        due = select(triggers.c.id).where(*conditions).order_by(triggers.c.id).limit(limit)
        if self.dialect == "postgresql":
            due = due.with_for_update(skip_locked=True, of=triggers)
        stmt = (
            update(triggers)
            .where(triggers.c.id.in_(due.scalar_subquery()))
            .values(triggerer_id=owner, claimed_at=now)
            .returning(*triggers.c)
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def list_triggers(self, task_id: str | None = None) -> list[TriggerRow]:
        """Trigger rows (of one task), oldest first."""
        stmt = select(triggers).order_by(triggers.c.id)
        if task_id is not None:
            stmt = stmt.where(triggers.c.task_id == task_id)
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def held_trigger_ids(self, owner: str) -> set[int]:
        """Ids of the triggers ``owner`` holds now (another triggerer may have taken some)."""
        stmt = select(triggers.c.id).where(triggers.c.triggerer_id == owner)
        with self.transaction() as conn:
            return set(conn.execute(stmt).scalars())

    def release_triggers(self, owner: str, ids: Iterable[int] | None = None) -> int:
        """Give ``owner``'s triggers (or those of ``ids``) back for any triggerer to claim."""
        stmt = update(triggers).where(triggers.c.triggerer_id == owner)
        if ids is not None:
            stmt = stmt.where(triggers.c.id.in_(list(ids)))
        with self.transaction() as conn:
            return conn.execute(stmt.values(triggerer_id=None, claimed_at=None)).rowcount

    # -- firing -----------------------------------------------------------------

    def fire_triggers(
        self, owner: str, firings: Sequence[Firing], now: datetime
    ) -> tuple[dict[int, tuple[str, Any]], dict[int, dict[str, Any]]]:
        """Record each event on its trigger while ``owner`` still holds it.

        A resume also moves the try back to ``queued`` with its resume header.
        A row that was already fired keeps its first event (firing again after
        a failed attempt, or finishing a dead triggerer's row, is safe).
        Returns the event decided for each trigger ``owner`` holds, as
        ``(kind, payload)`` by id, and for resumes whose try is queued and not
        yet started, the tries to publish, by trigger id.
        """
        if not firings:
            return {}, {}
        by_id = {f.trigger_id: f for f in firings}
        held_stmt = select(
            triggers.c.id, triggers.c.fired_at, triggers.c.event_kind, triggers.c.event
        ).where(triggers.c.id.in_(list(by_id)), triggers.c.triggerer_id == owner)
        if self.dialect == "postgresql":
            held_stmt = held_stmt.with_for_update()
        with self.transaction() as conn:
            rows = conn.execute(held_stmt).all()
            held = {row.id: row.fired_at for row in rows}
            decided = {
                row.id: (row.event_kind, row.event)
                if row.fired_at is not None
                else (by_id[row.id].kind, by_id[row.id].payload)
                for row in rows
            }
            fresh = sorted(i for i, fired_at in held.items() if fired_at is None)
            if fresh:
                conn.execute(
                    update(triggers)
                    .where(triggers.c.id == bindparam("b_id"))
                    .values(
                        fired_at=now, event_kind=bindparam("v_kind"), event=bindparam("v_event")
                    ),
                    [
                        {"b_id": i, "v_kind": by_id[i].kind, "v_event": by_id[i].payload}
                        for i in fresh
                    ],
                )
            resumes = [by_id[i] for i in sorted(held) if decided[i][0] == RESUME]
            published = self._queue_resumes(conn, resumes, now) if resumes else {}
        return decided, published

    def _queue_resumes(
        self, conn: Connection, resumes: Sequence[Firing], now: datetime
    ) -> dict[int, dict[str, Any]]:
        pairs = [(f.task_id, f.try_number) for f in resumes]
        stmt = select(task_records).where(
            tuple_(task_records.c.task_id, task_records.c.try_number).in_(pairs),
            or_(
                task_records.c.state == TaskState.DEFERRED.value,
                task_records.c.state == TaskState.QUEUED.value,
            ),
        )
        if self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        found = {(r["task_id"], r["try_number"]): dict(r) for r in conn.execute(stmt).mappings()}
        queued: dict[int, dict[str, Any]] = {}
        params = []
        for firing in resumes:
            record = found.get((firing.task_id, firing.try_number))
            if record is None:
                continue  # revoked, failed or already running: nothing to publish
            if record["state"] == TaskState.QUEUED.value:
                queued[firing.trigger_id] = record  # fired before; perhaps never published
                continue
            headers = dict(record.get("headers") or {})
            if firing.resume_header is not None:
                name, value = firing.resume_header
                headers[name] = value
            record["headers"] = headers
            queued[firing.trigger_id] = record
            params.append(
                {
                    "b_task_id": firing.task_id,
                    "b_try_number": firing.try_number,
                    "v_headers": headers,
                    "v_queued_at": now,
                    "v_updated_at": now,
                }
            )
        if params:
            conn.execute(
                update(task_records)
                .where(
                    task_records.c.task_id == bindparam("b_task_id"),
                    task_records.c.try_number == bindparam("b_try_number"),
                    task_records.c.state == TaskState.DEFERRED.value,
                )
                .values(
                    state=TaskState.QUEUED.value,
                    headers=bindparam("v_headers"),
                    queued_at=bindparam("v_queued_at"),
                    updated_at=bindparam("v_updated_at"),
                    state_reason="resumed by its trigger's event",
                ),
                params,
            )
            # Whoever reserved a message of the try before (its first delivery, or a
            # redundant copy dropped while it waited) holds nothing of the resume: left,
            # a live worker's reservation would keep the lost-message sweep off the try
            # for good if the resume message were lost.
            conn.execute(
                delete(reservations).where(
                    reservations.c.task_id == bindparam("b_task_id"),
                    reservations.c.try_number == bindparam("b_try_number"),
                ),
                [{"b_task_id": p["b_task_id"], "b_try_number": p["b_try_number"]} for p in params],
            )
        return queued

    # -- finishing --------------------------------------------------------------

    def finish_triggers(self, owner: str, finishes: Sequence[Finish], now: datetime) -> int:
        """Give fired triggers' tries their outcome and delete the rows; returns tries changed.

        Each outcome is a compare-and-set from ``deferred``; a failure's
        callback row (the outbox) is written only when its compare-and-set won.
        """
        if not finishes:
            return 0
        changed = 0
        with self.transaction() as conn:
            for finish in finishes:
                if finish.kind == RESUME:
                    continue  # the try was queued when the event fired
                state = TaskState.SUCCESS if finish.kind == SUCCESS else TaskState.FAILED
                won = conn.execute(
                    update(task_records)
                    .where(
                        task_records.c.task_id == finish.task_id,
                        task_records.c.try_number == finish.try_number,
                        task_records.c.state == TaskState.DEFERRED.value,
                    )
                    .values(
                        state=state.value,
                        state_reason=finish.reason,
                        error=finish.error,
                        ended_at=now,
                        updated_at=now,
                    )
                    .returning(
                        task_records.c.task_name,
                        task_records.c.args,
                        task_records.c.kwargs,
                        task_records.c.job_id,
                        task_records.c.worker_hostname,
                    )
                ).first()
                if won is None:
                    continue
                changed += 1
                append_decision(conn, finish.audit)
                if state is TaskState.FAILED:
                    conn.execute(callbacks.insert().values(**_failure_callback(finish, won, now)))
            conn.execute(
                delete(triggers).where(
                    triggers.c.id.in_([f.trigger_id for f in finishes]),
                    triggers.c.triggerer_id == owner,
                )
            )
        return changed

    # -- sweeping ---------------------------------------------------------------

    def overdue_triggers(
        self, now: datetime, grace: float, dead_after: float, limit: int = 500
    ) -> list[TriggerRow]:
        """Triggers whose timeout passed ``grace`` seconds ago and that no live triggerer holds."""
        live = select(jobs.c.id).where(live_triggerer(now, dead_after))
        stmt = (
            select(triggers)
            .where(
                triggers.c.timeout_at < now - timedelta(seconds=grace),
                or_(triggers.c.triggerer_id.is_(None), triggers.c.triggerer_id.not_in(live)),
            )
            .order_by(triggers.c.timeout_at)
            .limit(limit)
        )
        with self.transaction() as conn:
            return rows_of(conn.execute(stmt))

    def take_triggers(self, ids: Sequence[int], owner: str, expected: str | None) -> set[int]:
        """Move triggers from ``expected`` (None: unassigned) to ``owner``; ids moved."""
        stmt = (
            update(triggers)
            .where(
                triggers.c.id.in_(list(ids)),
                triggers.c.triggerer_id.is_(None)
                if expected is None
                else triggers.c.triggerer_id == expected,
            )
            .values(triggerer_id=owner)
            .returning(triggers.c.id)
        )
        with self.transaction() as conn:
            return set(conn.execute(stmt).scalars())


def _failure_callback(finish: Finish, record: Any, now: datetime) -> OutboxRow:
    payload = CallbackPayload(
        task_name=record.task_name,
        reason=finish.error or finish.reason,
        exception=finish.exception,
        args=record.args or [],
        kwargs=record.kwargs or {},
        job_id=record.job_id,
        hostname=record.worker_hostname,
    )
    return callback_row(finish.task_id, finish.try_number, "failure", payload, now)
