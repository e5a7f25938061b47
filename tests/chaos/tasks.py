"""The chaos run's tasks: every side effect is recorded in PostgreSQL.

The processes find the ledger database in ``CHAOS_LEDGER_DSN``.

Ledger tables (created by :func:`create_ledger`):

- ``chaos_runs``: one row per run of a task body (``run``), per resume of a
  deferred task (``resume``) and per side effect of an idempotent task that
  found its key already done (``duplicate``);
- ``chaos_effects``: the side effect of an idempotent task, unique per key;
- ``chaos_callbacks``: one row per ``on_failure``/``on_retry`` call, with
  where it ran (``worker``: the task's own process; ``outbox``: a sweep) and
  the process (and its parent, a worker's main process) that ran it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from celery import Celery, Task

from celery_recovery import Recovery, TimeDeltaTrigger, current_fencing_token, defer, recoverable
from celery_recovery.core.errors import LostWorkerError
from tests.apps.lifecycle import create_app

#: Retries every chaos task allows (so at most 4 tries).
MAX_RETRIES = 3

LEDGER_DDL = """
DROP TABLE IF EXISTS chaos_runs, chaos_effects, chaos_callbacks;
CREATE TABLE chaos_runs (
    id bigserial PRIMARY KEY,
    task_id text NOT NULL,
    try_number integer NOT NULL,
    phase text NOT NULL,
    pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos_effects (
    key text PRIMARY KEY,
    task_id text NOT NULL,
    try_number integer NOT NULL,
    token bigint,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos_callbacks (
    id bigserial PRIMARY KEY,
    task_id text NOT NULL,
    try_number integer,
    kind text NOT NULL,
    source text NOT NULL,
    error text NOT NULL,
    pid integer NOT NULL,
    ppid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def ledger_dsn(store_url: str) -> str:
    """The psycopg DSN of a SQLAlchemy PostgreSQL URL."""
    return store_url.replace("postgresql+psycopg://", "postgresql://", 1)


def create_ledger(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)


def _write(sql: str, params: tuple[Any, ...]) -> None:
    with psycopg.connect(os.environ["CHAOS_LEDGER_DSN"], autocommit=True) as conn:
        conn.execute(sql, params)


def _record_run(task: Task, phase: str) -> None:
    _write(
        "INSERT INTO chaos_runs (task_id, try_number, phase, pid) VALUES (%s, %s, %s, %s)",
        (task.request.id, task.request.retries + 1, phase, os.getpid()),
    )


def resume(task: Task, event: Any, key: str) -> dict[str, Any]:
    """Where a deferred chaos task continues, on a worker, once its trigger fired."""
    _record_run(task, "resume")
    return {"key": key, "resumed": True}


class ChaosTask(Task):
    """Records every failure and retry callback, and whether a sweep delivered it."""

    def on_failure(self, exc, task_id, args, kwargs, einfo):  # type: ignore[no-untyped-def]
        self._callback("failure", exc, task_id)

    def on_retry(self, exc, task_id, args, kwargs, einfo):  # type: ignore[no-untyped-def]
        self._callback("retry", exc, task_id)

    def _callback(self, kind: str, exc: BaseException, task_id: str) -> None:
        in_worker = self.request.id == task_id
        if isinstance(exc, LostWorkerError) and exc.try_number is not None:
            try_number: int | None = exc.try_number
        else:
            try_number = self.request.retries + 1 if in_worker else None
        _write(
            "INSERT INTO chaos_callbacks (task_id, try_number, kind, source, error, pid, ppid)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                task_id,
                try_number,
                kind,
                "worker" if in_worker else "outbox",
                f"{type(exc).__name__}: {exc}"[:500],
                os.getpid(),
                os.getppid(),
            ),
        )


def create_chaos_app(
    broker: str, backend: str, queue: str, recovery: dict[str, Any], acks_late: bool = False
) -> Celery:
    """The lifecycle tests' app configuration, with the chaos tasks, and celery-recovery."""
    app = create_app(broker, backend, queue, acks_late=acks_late)
    _register_tasks(app)
    Recovery(app, **recovery)
    return app


def _register_tasks(app: Celery) -> None:
    @app.task(shared=False, name="chaos.plain", bind=True, base=ChaosTask, max_retries=MAX_RETRIES)
    def plain(self: Task, key: str, seconds: float, fail: bool = False) -> dict[str, Any]:
        """One ledger row per run; ``fail`` makes every try raise (failed by the worker)."""
        _record_run(self, "run")
        time.sleep(seconds)
        if fail:
            raise ValueError(f"chaos task {key} fails on purpose")
        return {"key": key}

    @app.task(
        shared=False, name="chaos.idempotent", bind=True, base=ChaosTask, max_retries=MAX_RETRIES
    )
    @recoverable(idempotency_key="chaos:{key}", lock_ttl=10, retry_countdown=1)
    def idempotent(self: Task, key: str, seconds: float) -> dict[str, Any]:
        """Its side effect, a row unique per key, must happen exactly once."""
        _record_run(self, "run")
        time.sleep(seconds)
        token = current_fencing_token()
        try:
            _write(
                "INSERT INTO chaos_effects (key, task_id, try_number, token)"
                " VALUES (%s, %s, %s, %s)",
                (key, self.request.id, self.request.retries + 1, token),
            )
        except psycopg.errors.UniqueViolation:
            _record_run(self, "duplicate")
        return {"key": key, "token": token}

    @app.task(
        shared=False, name="chaos.deferring", bind=True, base=ChaosTask, max_retries=MAX_RETRIES
    )
    def deferring(self: Task, key: str, seconds: float, wait: float) -> None:
        """Works ``seconds``, then waits ``wait`` seconds in the triggerer and resumes."""
        _record_run(self, "run")
        time.sleep(seconds)
        defer(TimeDeltaTrigger(wait), method_name="resume", kwargs={"key": key}, timeout=300)
