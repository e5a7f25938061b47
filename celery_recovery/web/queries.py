"""What the console shows, read from the store: one function per page, each a few indexed
queries, so a page stays fast with millions of tries.

Lists use keyset pagination (``before``: the last key of the previous page),
never ``OFFSET``: page 1,000 costs what page 1 costs.  Task arguments are
replaced by :data:`HIDDEN` unless the console was started with ``--show-args``.
The Django admin pages (contrib/django) call the same queries.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_

from celery_recovery.core.settings import RecoverySettings
from celery_recovery.store.schema import (
    audit_log,
    callbacks,
    jobs,
    task_heartbeats,
    task_records,
    triggers,
)
from celery_recovery.web.overview import OverviewQueries
from celery_recovery.web.readonly import ReadOnlyStore, fetch_rows

#: Rows per page unless ``limit`` says otherwise, and the most a page may ask for.
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
#: What stands in for task arguments when they are not shown.
HIDDEN = "hidden (start the console with --show-args)"
#: Columns holding a task's arguments or message (hidden unless --show-args).
ARGUMENT_COLUMNS = ("args", "kwargs", "headers", "options")


@dataclass(frozen=True)
class Page:
    """One page of a list: its rows and the ``before`` cursor of the next page (None: last)."""

    rows: list[dict[str, Any]]
    next_before: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "next_before": self.next_before}


def page_size(limit: int | None) -> int:
    return max(1, min(limit or PAGE_SIZE, MAX_PAGE_SIZE))


class ConsoleQueries(OverviewQueries):
    """The console's read-only view of one store."""

    def __init__(
        self,
        store: ReadOnlyStore,
        settings: RecoverySettings,
        show_args: bool = False,
        hidden: str = HIDDEN,
    ) -> None:
        self.store = store
        self.settings = settings
        self.show_args = show_args
        #: What stands in for hidden arguments: the console's says how to show them.
        self.hidden = hidden

    # -- recoveries (the audit log) ---------------------------------------------

    def recoveries(
        self,
        before: str | None = None,
        limit: int | None = None,
        action: str | None = None,
        reason: str | None = None,
        task_id: str | None = None,
        hostname: str | None = None,
    ) -> Page:
        size = page_size(limit)
        stmt = select(audit_log).order_by(audit_log.c.id.desc()).limit(size + 1)
        for column, value in (
            (audit_log.c.action, action),
            (audit_log.c.reason, reason),
            (audit_log.c.task_id, task_id),
            (audit_log.c.hostname, hostname),
        ):
            if value:
                stmt = stmt.where(column == value)
        if before and before.isdigit():
            stmt = stmt.where(audit_log.c.id < int(before))
        with self.store.reading() as conn:
            rows = [dict(r) for r in conn.execute(stmt).mappings()]
        return _page(rows, size, lambda row: str(row["id"]))

    # -- tasks -----------------------------------------------------------------

    def search(self, query: str, before: str | None = None, limit: int | None = None) -> Page:
        """Tries whose task id is ``query``, else tries of the task named ``query``, newest
        first (keyset on ``queued_at`` and the try's key)."""
        query = query.strip()
        by_id = self.tries_of(query)
        if by_id:
            return Page(by_id, None)
        return self.tries(before, limit, task_name=query)

    def tries_of(self, task_id: str) -> list[dict[str, Any]]:
        """Every try of one task, newest first, without arguments ([] for an unknown id)."""
        stmt = (
            select(*self._try_columns())
            .where(task_records.c.task_id == task_id)
            .order_by(task_records.c.try_number.desc())
        )
        with self.store.reading() as conn:
            return fetch_rows(conn, stmt)

    def tries(
        self,
        before: str | None = None,
        limit: int | None = None,
        task_name: str | None = None,
        state: str | None = None,
        job_id: str | None = None,
    ) -> Page:
        """Tries newest first (keyset on ``queued_at`` and the try's key), without arguments:
        of one task name (on its index), in one state, run by one job."""
        size = page_size(limit)
        stmt = (
            select(*self._try_columns())
            .where(task_records.c.queued_at.is_not(None))
            .order_by(
                task_records.c.queued_at.desc(),
                task_records.c.task_id.desc(),
                task_records.c.try_number.desc(),
            )
            .limit(size + 1)
        )
        for column, value in (
            (task_records.c.task_name, task_name),
            (task_records.c.state, state),
            (task_records.c.job_id, job_id),
        ):
            if value:
                stmt = stmt.where(column == value)
        cursor = _try_cursor(before)
        if cursor is not None:
            key = tuple_(
                task_records.c.queued_at, task_records.c.task_id, task_records.c.try_number
            )
            stmt = stmt.where(key < tuple_(*cursor))
        with self.store.reading() as conn:
            rows = fetch_rows(conn, stmt)
        return _page(
            rows,
            size,
            lambda r: f"{r['queued_at'].isoformat()}|{r['try_number']}|{r['task_id']}",
        )

    def task(self, task_id: str) -> dict[str, Any] | None:
        """Every try of one task (its timeline), with its triggers, decisions and callbacks."""

        def of_task(table: Any) -> Any:
            return select(table).where(table.c.task_id == task_id)

        with self.store.reading() as conn:
            tries = fetch_rows(conn, of_task(task_records).order_by(task_records.c.try_number))
            if not tries:
                return None
            job_ids = sorted({t["job_id"] for t in tries if t["job_id"]})
            process = select(jobs.c.id, jobs.c.hostname, jobs.c.node_name, jobs.c.pid, jobs.c.state)
            processes = {
                r["id"]: r for r in fetch_rows(conn, process.where(jobs.c.id.in_(job_ids)))
            }
            trigger_rows = fetch_rows(conn, of_task(triggers).order_by(triggers.c.id))
            decisions = fetch_rows(conn, of_task(audit_log).order_by(audit_log.c.id))
            outbox = fetch_rows(conn, of_task(callbacks).order_by(callbacks.c.id))
            beats = {b["try_number"]: b for b in fetch_rows(conn, of_task(task_heartbeats))}
        for record in tries:
            self._hide_arguments(record)
            record["process"] = processes.get(record["job_id"])
            number = record["try_number"]
            record["triggers"] = [
                self._trigger(t) for t in trigger_rows if t["try_number"] == number
            ]
            record["decisions"] = [d for d in decisions if d["try_number"] == number]
            record["heartbeat"] = self._heartbeat(beats.get(number))
        return {
            "task_id": task_id,
            "task_name": tries[-1]["task_name"],
            "tries": tries,
            "callbacks": [self._callback(c) for c in outbox],
        }

    # -- jobs, deferred tasks, callbacks ---------------------------------------------

    def jobs(
        self,
        now: datetime,
        before: str | None = None,
        limit: int | None = None,
        job_type: str | None = None,
        state: str | None = None,
    ) -> Page:
        size = page_size(limit)
        stmt = select(jobs).order_by(jobs.c.start_date.desc(), jobs.c.id.desc()).limit(size + 1)
        if job_type:
            stmt = stmt.where(jobs.c.job_type == job_type)
        if state:
            stmt = stmt.where(jobs.c.state == state)
        if before and "|" in before:
            started, _, job_id = before.partition("|")
            with contextlib.suppress(ValueError):
                stmt = stmt.where(
                    tuple_(jobs.c.start_date, jobs.c.id)
                    < tuple_(datetime.fromisoformat(started), job_id)
                )
        with self.store.reading() as conn:
            rows = [dict(r) for r in conn.execute(stmt).mappings()]
        for job in rows:
            age = (now - job["latest_heartbeat"]).total_seconds()
            job.update(heartbeat_age=round(age, 1), threshold=self.threshold(job["job_type"]))
        return _page(rows, size, lambda r: f"{r['start_date'].isoformat()}|{r['id']}")

    def deferred(
        self, before: str | None = None, limit: int | None = None, queue: str | None = None
    ) -> Page:
        """Triggers not fired yet: class, due time, the triggerer holding it, queue."""
        size = page_size(limit)
        stmt = (
            select(
                triggers,
                jobs.c.hostname.label("triggerer_hostname"),
                jobs.c.pid.label("triggerer_pid"),
            )
            .select_from(triggers.outerjoin(jobs, jobs.c.id == triggers.c.triggerer_id))
            .where(triggers.c.fired_at.is_(None))
            .order_by(triggers.c.id.desc())
            .limit(size + 1)
        )
        if queue:
            stmt = stmt.where(triggers.c.queue == queue)
        if before and before.isdigit():
            stmt = stmt.where(triggers.c.id < int(before))
        with self.store.reading() as conn:
            rows = [self._trigger(dict(r)) for r in conn.execute(stmt).mappings()]
            # Names by primary key, for this page only (a join could scan every try).
            keys = [(r["task_id"], r["try_number"]) for r in rows]
            names = select(
                task_records.c.task_id, task_records.c.try_number, task_records.c.task_name
            )
            key = tuple_(task_records.c.task_id, task_records.c.try_number)
            found = (
                {(r[0], r[1]): r[2] for r in conn.execute(names.where(key.in_(keys)))}
                if keys
                else {}
            )
        for row in rows:
            row["task_name"] = found.get((row["task_id"], row["try_number"]))
        return _page(rows, size, lambda r: str(r["id"]))

    def callbacks(self, before: str | None = None, limit: int | None = None) -> Page:
        size = page_size(limit)
        stmt = select(callbacks).order_by(callbacks.c.id.desc()).limit(size + 1)
        if before and before.isdigit():
            stmt = stmt.where(callbacks.c.id < int(before))
        with self.store.reading() as conn:
            rows = [self._callback(dict(r)) for r in conn.execute(stmt).mappings()]
        return _page(rows, size, lambda r: str(r["id"]))

    # -- hiding arguments ------------------------------------------------------------

    def _try_columns(self) -> list[Any]:
        return [c for c in task_records.c if c.name not in ARGUMENT_COLUMNS]

    def _hide_arguments(self, record: dict[str, Any]) -> None:
        if not self.show_args:
            for column in ARGUMENT_COLUMNS:
                if record.get(column) is not None:
                    record[column] = self.hidden

    def _heartbeat(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        """A try's last ``heartbeat()``; its details are the task's data, hidden like
        its arguments."""
        if row is None:
            return None
        details = row["details"]
        hidden = not self.show_args and details is not None
        return {"beat_at": row["beat_at"], "details": self.hidden if hidden else details}

    def _trigger(self, row: dict[str, Any]) -> dict[str, Any]:
        kwargs = row["kwargs"] if isinstance(row.get("kwargs"), dict) else {}
        row["due_at"] = kwargs.get("moment") or row.get("timeout_at")
        if not self.show_args:
            for column in ("kwargs", "method_kwargs", "event"):
                if row.get(column) is not None:
                    row[column] = self.hidden
        return row

    def _callback(self, row: dict[str, Any]) -> dict[str, Any]:
        payload = row.get("payload")
        if not self.show_args and isinstance(payload, dict):
            row["payload"] = {
                k: (self.hidden if k in ("args", "kwargs") and v else v) for k, v in payload.items()
            }
        return row


def _page(rows: list[dict[str, Any]], size: int, key: Any) -> Page:
    """The first ``size`` rows, and the cursor after them when a further row exists."""
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, key(rows[-1]) if more and rows else None)


def _try_cursor(before: str | None) -> tuple[datetime, str, int] | None:
    if not before or before.count("|") < 2:
        return None
    queued_at, number, task_id = before.split("|", 2)
    try:
        return datetime.fromisoformat(queued_at), task_id, int(number)
    except ValueError:
        return None
