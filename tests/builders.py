"""Rows the tests write to the store directly: jobs, tries and triggers, built in one place.

A test names only the values it is about; each builder fills in the rest.  Ports are
tests/services.py's ``free_port``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from celery_recovery.core.states import JobState, JobType, TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.store import Store
from celery_recovery.store.schema import triggers

# -- jobs ------------------------------------------------------------------------------


def job_row(
    job_id: str,
    beat_at: datetime,
    *,
    job_type: str = JobType.WORKER,
    hostname: str = "h",
    node_name: str | None = None,
    pid: int = 1,
    state: str = JobState.RUNNING,
    started_at: datetime | None = None,
    ended_at: datetime | None = None,
) -> dict[str, Any]:
    """A ``jobs`` row whose last heartbeat was at ``beat_at`` (started then, by default)."""
    return {
        "id": job_id,
        "job_type": job_type,
        "hostname": hostname,
        "node_name": node_name,
        "pid": pid,
        "state": state,
        "start_date": started_at or beat_at,
        "end_date": ended_at,
        "latest_heartbeat": beat_at,
    }


def add_job(
    store: Store,
    job_type: str = "worker",
    heartbeat_age: float = 0.0,
    state: str = "running",
    hostname: str = "host-a",
    ended_age: float | None = None,
    now: datetime | None = None,
) -> str:
    """A job of a random id on ``hostname``, its last heartbeat ``heartbeat_age`` seconds
    before ``now`` (started a minute before that); its id."""
    now = now or utcnow()
    job_id = uuid.uuid4().hex
    store.jobs.add_job(
        job_row(
            job_id,
            now - timedelta(seconds=heartbeat_age),
            job_type=job_type,
            hostname=hostname,
            node_name=f"celery@{hostname}",
            pid=4242,
            state=state,
            started_at=now - timedelta(seconds=heartbeat_age + 60),
            ended_at=None if ended_age is None else now - timedelta(seconds=ended_age),
        )
    )
    return job_id


def live_job(store: Store, job_id: str = "livejob", node: str = "w@alive", pid: int = 777) -> None:
    """A worker job that beat just now."""
    store.jobs.add_job(job_row(job_id, utcnow(), hostname="alive", node_name=node, pid=pid))


# -- tries -----------------------------------------------------------------------------


def queued(task_id: str = "t1", try_number: int = 1, **extra: Any) -> dict[str, Any]:
    """A published try of ``proj.add(1, 2)``, queued now (``extra`` overrides any column)."""
    now = utcnow()
    return {
        "task_id": task_id,
        "try_number": try_number,
        "task_name": "proj.add",
        "state": TaskState.QUEUED,
        "queue": "celery",
        "args": [1, 2],
        "kwargs": {},
        "queued_at": now,
        "updated_at": now,
        **extra,
    }


def running(
    task_id: str = "t1", try_number: int = 1, job_id: str = "job-a", **extra: Any
) -> dict[str, Any]:
    """A worker's claim: the try started now in ``job_id``."""
    now = utcnow()
    return {
        "task_id": task_id,
        "try_number": try_number,
        "task_name": "proj.add",
        "state": TaskState.RUNNING,
        "job_id": job_id,
        "started_at": now,
        "updated_at": now,
        **extra,
    }


def make_queued(
    store: Store,
    task_id: str,
    queue: str = "unused",
    task_name: str = "lifecycle.add",
    try_number: int = 1,
    at: datetime | None = None,
) -> None:
    """Record a published try of ``task_name`` that no worker has started (a lost message
    once a sweep runs ``recovery_queued_timeout`` later), queued ``at`` (5 s ago)."""
    past = at or utcnow() - timedelta(seconds=5)
    record = queued(
        task_id, try_number, task_name=task_name, queue=queue, queued_at=past, updated_at=past
    )
    store.tries.apply_writes([("queued", record)])


def make_zombie(
    store: Store,
    task_id: str,
    job_id: str = "deadjob",
    age: float = 60.0,
    task_name: str = "lifecycle.add",
    args: Sequence[Any] = (1, 2),
) -> None:
    """A try running in a worker job whose last heartbeat (and start) was ``age`` seconds
    ago: a zombie once that is past the threshold."""
    past = utcnow() - timedelta(seconds=age)
    store.jobs.add_job(job_row(job_id, past, hostname="gone", node_name="w@gone", pid=4242))
    record = queued(
        task_id,
        task_name=task_name,
        queue="unused",
        args=list(args),
        queued_at=past,
        updated_at=past,
    )
    store.tries.apply_writes([("queued", record)])
    assert store.tries.mark_running(
        running(task_id, job_id=job_id, task_name=task_name, started_at=past, updated_at=past)
    )


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


# -- triggers --------------------------------------------------------------------------


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
