"""Worker side: a try goes ``running`` → ``success`` | ``failed`` | ``up_for_retry`` | ``revoked``.

``task_prerun`` queues the try's ``running`` claim, committed within the
writer's flush interval (so a process killed mid-task is known to be running
it); the outcome follows through the same ordered buffer, and for a short
task both land as one row write.  If an outcome is lost, the sweeps reconcile
it from the result backend.  Exceptions and retry reasons are kept aside by
``task_failure`` / ``task_retry`` and written once, at ``task_postrun``.
The same signals sent from the worker's main process about a pool process
that died are handled by :mod:`celery_recovery.worker_lost`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import states as celery_states
from celery.signals import (
    task_failure,
    task_postrun,
    task_prerun,
    task_retry,
    task_revoked,
)

from celery_recovery.context import context_for_app
from celery_recovery.core.errors import LostWorkerError
from celery_recovery.core.records import Transition, WriteKind
from celery_recovery.core.states import NEVER_RAN_REASON, TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.deferral import was_deferred
from celery_recovery.messages import claim_from_request, try_number_of
from celery_recovery.postpone import was_postponed
from celery_recovery.redundant_deliveries import drop_if_redundant, never_entered, was_dropped
from celery_recovery.signals.guard import never_raises
from celery_recovery.worker_lost import (
    claim_counting_deaths,
    is_lost_process_retry,
    record_lost_process,
    record_lost_retry,
    store_refused_failure,
)

logger = logging.getLogger("celery_recovery.signals")

#: Longest error text kept on a record.
MAX_ERROR_LENGTH = 4000

_OUTCOMES = {
    celery_states.SUCCESS: (TaskState.SUCCESS, None),
    celery_states.FAILURE: (TaskState.FAILED, None),
    celery_states.RETRY: (TaskState.UP_FOR_RETRY, None),
    celery_states.IGNORED: (TaskState.SUCCESS, "the task raised Ignore"),
    celery_states.REJECTED: (TaskState.FAILED, "the task rejected its message"),
}

_aside = threading.local()


def _context_of(task: Any, request: Any = None) -> Any:
    """The installation recording ``task``'s runs; ``request`` is ``task.request`` when
    the caller already read it (each read walks Celery's thread-local request stack)."""
    if task is None:
        return None
    context = context_for_app(task.app)
    if context is None:
        return None
    if getattr(task.request if request is None else request, "is_eager", False):
        return None
    return context


def _describe(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_LENGTH]


@never_raises
def on_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    # Runs before every task body: each lookup here is paid per task (see
    # benchmarks/throughput.py), so the request is read once and passed along.
    if task is None or task_id is None:
        return
    request = task.request
    context = _context_of(task, request)
    if context is None:
        return
    if drop_if_redundant(context, task, task_id, request):
        return  # dropped: its before_start raises Ignore, and nothing is recorded
    runtime = context.runtime
    record = claim_from_request(task, utcnow(), runtime.job_id, request)
    if task.acks_late:
        # Its message comes back when this process dies: count the deaths.
        if claim_counting_deaths(context, task, record):
            return  # failed for good instead: its before_start raises Ignore
    else:
        runtime.record_start(record)
    _started_at()[task_id] = time.monotonic()


@never_raises
def on_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    context = _context_of(sender)
    if context is None or task_id is None or isinstance(exception, LostWorkerError):
        return  # LostWorkerError: fired by the sweep's callback delivery, already recorded
    if _runs_here(task_id):
        # In the process running the try: task_postrun follows and writes the outcome.
        _set_aside(task_id, _describe(exception))
        return
    # In the worker's main process (which pushes the request context first, so the
    # request does not tell): the pool process died (WorkerLostError) or hit a hard
    # time limit, so no task_postrun will come from it.
    if isinstance(exception, WorkerLostError):
        record_lost_process(context, sender, exception, args, kwargs)
        return
    now = utcnow()
    context.runtime.write(
        WriteKind.TRANSITION,
        Transition(
            task_id,
            None,
            (TaskState.RUNNING,),
            {
                "state": TaskState.FAILED,
                "error": _describe(exception),
                "state_reason": "failed by the worker's main process",
                "ended_at": now,
                "updated_at": now,
            },
        ),
    )


@never_raises
def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    context = _context_of(sender)
    if context is None or request is None:
        return
    if not _runs_here(request.id) and is_lost_process_retry(reason):
        # task_retry_on_worker_lost: the main process retried a try whose pool process died.
        record_lost_retry(context, sender, reason)
        return
    _set_aside(request.id, f"retry: {reason}"[:MAX_ERROR_LENGTH])


@never_raises
def on_postrun(
    task_id: str | None = None,
    task: Any = None,
    state: str | None = None,
    retval: Any = None,
    **_: Any,
) -> None:
    if task is None or task_id is None:
        return
    request = task.request
    context = _context_of(task, request)
    if context is None:
        return
    store_refused_failure(task, task_id)
    if was_dropped(task_id):
        return  # a dropped delivery: the try's record belongs to the run that was not dropped
    if was_deferred(task_id) or was_postponed(task_id):
        _started_at().pop(task_id, None)
        return  # the try was already moved to deferred, or back to queued
    if state == celery_states.REJECTED and getattr(retval, "requeue", False):
        _requeued(context, task, task_id, "rejected with requeue=True: back in the queue")
        return
    if state is None and never_entered(task, task_id):
        # Celery failed before the body (an unreachable result backend refused STARTED)
        # and acknowledges the message: the try is as unstarted as a lost message.
        _requeued(context, task, task_id, NEVER_RAN_REASON)
        return
    outcome = _OUTCOMES.get(state or "")
    if outcome is None:
        outcome = (TaskState.FAILED, f"ended in state {state or 'unknown (process stopped)'}")
    new, reason = outcome
    error = _take_aside(task_id)
    now = utcnow()
    values: dict[str, Any] = {"state": new, "ended_at": now, "updated_at": now}
    if new is TaskState.UP_FOR_RETRY:
        values["state_reason"] = error
    elif error is not None:
        values["error"] = error
    if reason is not None:
        values["state_reason"] = reason
    try_number = try_number_of(request)
    runtime = context.runtime
    runtime.writer.finish(task_id, try_number, values)
    started = _started_at().pop(task_id, None)
    if started is not None and time.monotonic() - started >= context.settings.zombie_threshold:
        # Long enough to have been declared dead meanwhile (a pause, a partition): if a
        # sweep recovered this try, keep what it finally did beside the recovery.
        runtime.write(WriteKind.LATE, (task_id, try_number, new.value, now))


def _requeued(context: Any, task: Any, task_id: str, reason: str) -> None:
    """The try is ``queued`` again: its message is back in the queue
    (``Reject(requeue=True)``), or gone although the body never ran.

    A redelivery then claims it as usual (recording it finished would make that
    redelivery look redundant and be dropped); a message that is gone is sent again
    by the lost-message sweep after ``recovery_queued_timeout``.
    """
    _started_at().pop(task_id, None)
    _take_aside(task_id)
    now = utcnow()
    context.runtime.write(
        WriteKind.TRANSITION,
        Transition(
            task_id,
            try_number_of(task.request),
            (TaskState.RUNNING,),
            {
                "state": TaskState.QUEUED,
                "job_id": None,
                "queued_at": now,
                "updated_at": now,
                "state_reason": reason,
            },
        ),
    )


@never_raises
def on_revoked(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    expired: bool = False,
    signum: Any = None,
    **_: Any,
) -> None:
    context = context_for_app(sender.app) if sender is not None else None
    if context is None or request is None:
        return
    expected: tuple[TaskState, ...] = (TaskState.QUEUED, TaskState.RUNNING)
    if expired:
        reason = "expired before it ran"
    elif terminated:
        reason = f"revoked and terminated (signal {signum})"
        # The killed pool process may report the kill as a failure first.
        expected += (TaskState.FAILED,)
    else:
        reason = "revoked"
    now = utcnow()
    context.runtime.write(
        WriteKind.TRANSITION,
        Transition(
            request.id,
            try_number_of(request),
            expected,
            {
                "state": TaskState.REVOKED,
                "state_reason": reason,
                "ended_at": now,
                "updated_at": now,
            },
        ),
    )


def _runs_here(task_id: str) -> bool:
    """Whether this thread started ``task_id``'s body (else it is the worker's main process)."""
    return task_id in _started_at()


def _started_at() -> dict[str, float]:
    started = getattr(_aside, "started", None)
    if started is None:
        started = _aside.started = {}
    return started


def _set_aside(task_id: str, text: str | None) -> None:
    if not hasattr(_aside, "errors"):
        _aside.errors = {}
    _aside.errors[task_id] = text


def _take_aside(task_id: str) -> str | None:
    errors = getattr(_aside, "errors", None)
    return errors.pop(task_id, None) if errors else None


def connect() -> None:
    task_prerun.connect(on_prerun, weak=False, dispatch_uid=__name__ + ".prerun")
    task_failure.connect(on_failure, weak=False, dispatch_uid=__name__ + ".failure")
    task_retry.connect(on_retry, weak=False, dispatch_uid=__name__ + ".retry")
    task_postrun.connect(on_postrun, weak=False, dispatch_uid=__name__ + ".postrun")
    task_revoked.connect(on_revoked, weak=False, dispatch_uid=__name__ + ".revoked")
