"""States of task tries and jobs, and the kinds of job."""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    """State of one try of a task (one row of ``task_records``)."""

    QUEUED = "queued"
    RUNNING = "running"
    DEFERRED = "deferred"
    UP_FOR_RETRY = "up_for_retry"
    SUCCESS = "success"
    FAILED = "failed"
    REVOKED = "revoked"


#: A try in one of these states will not change again on its own.
FINISHED_TASK_STATES = frozenset(
    {TaskState.UP_FOR_RETRY, TaskState.SUCCESS, TaskState.FAILED, TaskState.REVOKED}
)

#: Result-backend state of a task waiting for its trigger.
DEFERRED_STATE = "DEFERRED"

#: Why a zombie became ``up_for_retry`` when the result backend read RETRY: its worker
#: had retried it (and published the next try) before it was lost.  A next try that
#: never appears makes it a dead end, which the retries-never-sent step ends.
RETRY_RECONCILED_REASON = "reconciled: the worker had retried it before it was lost"

#: Why a try whose body never ran is queued again (Celery failed before the body,
#: e.g. the result backend refused ``STARTED``): the lost-message sweep sends it again,
#: whatever failure Celery stored about its own start meanwhile.
NEVER_RAN_REASON = (
    "not run: Celery failed before the body started (see the worker's log);"
    " queued again for the lost-message sweep"
)


class JobState(StrEnum):
    """State of a participating process (one row of ``jobs``)."""

    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


class JobType(StrEnum):
    """What kind of process a job is."""

    WORKER = "worker"
    BEAT = "beat"
    TRIGGERER = "triggerer"
