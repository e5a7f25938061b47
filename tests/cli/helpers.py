"""Rows for the CLI tests, written through the Store, and a way to run the command."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from click.testing import CliRunner, Result

from celery_recovery.cli import recovery
from celery_recovery.core.states import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import Store
from celery_recovery.store.schema import triggers


def run(url: str, *args: str, input: str | None = None, color: bool = False) -> Result:
    """``celery-recovery --database-url URL ARGS`` through click's runner."""
    return CliRunner().invoke(
        recovery, ["--database-url", url, *args], input=input, color=color, catch_exceptions=False
    )


def run_json(url: str, *args: str) -> list[dict[str, Any]]:
    result = run(url, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def add_job(
    store: Store,
    job_type: str = "worker",
    heartbeat_age: float = 0.0,
    state: str = "running",
    hostname: str = "host-a",
    ended_age: float | None = None,
    now: datetime | None = None,
) -> str:
    now = now or utcnow()
    job_id = uuid.uuid4().hex
    store.jobs.add_job(
        {
            "id": job_id,
            "job_type": job_type,
            "hostname": hostname,
            "node_name": f"celery@{hostname}",
            "pid": 4242,
            "state": state,
            "start_date": now - timedelta(seconds=heartbeat_age + 60),
            "end_date": None if ended_age is None else now - timedelta(seconds=ended_age),
            "latest_heartbeat": now - timedelta(seconds=heartbeat_age),
        }
    )
    return job_id


def add_try(
    store: Store,
    state: str,
    job_id: str | None = None,
    ended_age: float | None = None,
    task_name: str = "shop.charge",
    task_id: str | None = None,
    try_number: int = 1,
    now: datetime | None = None,
    **columns: Any,
) -> str:
    now = now or utcnow()
    task_id = task_id or uuid.uuid4().hex
    store.tries.apply_writes(
        [
            (
                "queued",
                {
                    "task_id": task_id,
                    "try_number": try_number,
                    "task_name": task_name,
                    "state": state,
                    "queue": "orders",
                    "args": [1],
                    "kwargs": {},
                    "job_id": job_id,
                    "queued_at": now - timedelta(hours=1),
                    "started_at": now - timedelta(minutes=30) if job_id else None,
                    "ended_at": None if ended_age is None else now - timedelta(seconds=ended_age),
                    "updated_at": now,
                    **columns,
                },
            )
        ]
    )
    return task_id


def add_trigger(
    store: Store,
    task_id: str,
    triggerer_id: str | None,
    queue: str = "triggers",
    created_age: float = 60.0,
    try_number: int = 1,
) -> int:
    now = utcnow()
    with store.transaction() as conn:
        return int(
            conn.execute(
                triggers.insert()
                .values(
                    classpath="shop.triggers.WaitForPayment",
                    kwargs={"order": 7},
                    task_id=task_id,
                    try_number=try_number,
                    queue=queue,
                    timeout_at=now + timedelta(hours=1),
                    triggerer_id=triggerer_id,
                    created_at=now - timedelta(seconds=created_age),
                )
                .returning(triggers.c.id)
            ).scalar_one()
        )


def add_history(store: Store, name: str, now: datetime, durations: list[float]) -> None:
    """Successful tries of task ``name`` that took ``durations`` seconds, ended before ``now``."""
    records = []
    for i, seconds in enumerate(durations):
        ended = now - timedelta(hours=1, seconds=i)
        records.append(
            _record(
                name,
                TaskState.SUCCESS,
                queued_at=ended - timedelta(seconds=seconds + 1),
                started_at=ended - timedelta(seconds=seconds),
                ended_at=ended,
            )
        )
    store.tries.apply_writes([("queued", r) for r in records])


def add_running(store: Store, name: str, started_at: datetime) -> str:
    record = _record(
        name, TaskState.RUNNING, queued_at=started_at, started_at=started_at, ended_at=None
    )
    store.tries.apply_writes([("queued", record)])
    return str(record["task_id"])


def _record(name: str, state: TaskState, **times: Any) -> dict[str, Any]:
    return {
        "task_id": uuid.uuid4().hex,
        "try_number": 1,
        "task_name": name,
        "state": state.value,
        "queue": "celery",
        "args": [],
        "kwargs": {},
        "worker_hostname": "celery@host-a",
        "worker_pid": 4242,
        "updated_at": times["queued_at"],
        **times,
    }
