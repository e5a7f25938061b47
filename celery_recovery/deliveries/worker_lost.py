"""Pool processes that die under a live worker: the OOM killer's usual victim.

When a prefork child is killed, the worker's main process sees it and Celery
(``celery/worker/request.py``, ``Request.on_failure``) does one of three things:

- by default it stores FAILURE (``WorkerLostError``) and sends ``task_failure``
  from the main process, but never calls the task's ``on_failure``.  The try is
  recorded failed at once, with a callback row (the outbox) that runs
  ``on_failure`` and the failure listeners once, from the sweep;
- with ``task_retry_on_worker_lost`` it retries the task itself and calls
  ``on_retry``.  The try is recorded ``up_for_retry``, and the failure
  listeners hear of it from the outbox;
- with ``acks_late`` and ``task_reject_on_worker_lost`` it requeues the message,
  sends no signal, and has nothing to count how often: a task that kills its own
  process would run for ever.  The main process records that verdict (the try
  ``queued`` again, one death counted) from ``Request.reject``, so that no sweep
  republishes a try whose message is back in the queue however long its
  redelivery takes; the lost-message sweep covers a requeue that never arrives.
  Every ``acks_late`` try is also claimed durably before its body runs, and a
  claim that finds its try still ``running`` in another process counts one death
  (see :meth:`~celery_recovery.store.Store.claim_counting_deaths`): whichever of
  the two lands first counts the death, the other finds the try no longer that
  process's.  Once the
  runs allowed are used up (``max_retries + 1`` in all, each death counting as a
  retry; ``recovery_max_lost_runs`` for ``max_retries=None``), the try is failed:
  FAILURE in the result backend, ``on_failure`` from the outbox, and the message
  acknowledged so it stops coming back.
"""

from __future__ import annotations

import functools
import logging
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError

from celery_recovery.core.errors import StoreError
from celery_recovery.core.outbox import (
    CallbackKind,
    CallbackPayload,
    CallbackStep,
    OutboxRow,
    callback_row,
)
from celery_recovery.core.patching import wrap_once
from celery_recovery.core.records import OutboxedTransition, Transition, WriteKind
from celery_recovery.core.states import TaskState
from celery_recovery.core.thread_marks import Ended, Ending, delivery_ending
from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.records import encode_json, try_number_of
from celery_recovery.runtime.context import context_for_app

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext

logger = logging.getLogger("celery_recovery.worker_lost")

#: Where Celery leaves the try of a killed pool process: claimed, or not yet.
_UNFINISHED = (TaskState.QUEUED, TaskState.RUNNING)


class _Failing(threading.local):
    #: The request whose ``Request.on_failure`` this thread of the worker's main process
    #: runs, and its exception (class-level defaults: see
    #: :mod:`celery_recovery.core.thread_marks`).
    request: Any = None
    exception: BaseException | None = None


_failing = _Failing()


def install_failure_context() -> None:
    """Wrap Celery's ``Request.on_failure`` (idempotent; as a worker starts) so that the
    ``task_failure`` it sends can be told which request failed.

    Celery 5.7 pushes the request's context on the task's stack around that signal;
    5.5 and 5.6 do not, and ``task.request`` there is empty.  A failure path only.
    """
    from celery.worker.request import Request

    wrap_once(Request, "on_failure", _on_failure)
    wrap_once(Request, "reject", _reject)


def _on_failure(original: Any) -> Any:
    @functools.wraps(original)
    def on_failure(self: Any, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
        outer = _failing.request, _failing.exception
        _failing.request, _failing.exception = self, _unwrapped(exc_info)
        try:
            return original(self, exc_info, *args, **kwargs)
        finally:
            _failing.request, _failing.exception = outer

    return on_failure


def _reject(original: Any) -> Any:
    @functools.wraps(original)
    def reject(self: Any, requeue: bool = False) -> Any:
        done = original(self, requeue=requeue)
        exception = _failing.exception
        if requeue and _failing.request is self and isinstance(exception, WorkerLostError):
            _record_requeued_death(self, exception)
        return done

    return reject


def failing_request(task: Any, task_id: str) -> Any:
    """The request context of ``task_id`` at a ``task_failure`` sent by the worker's main
    process, on every Celery version; None when it cannot be told."""
    request = task.request
    if getattr(request, "id", None) == task_id:
        return request
    failing = _failing.request
    if failing is not None and failing.id == task_id:
        return failing._context
    return None


def record_lost_process(
    context: RecoveryContext,
    task: Any,
    task_id: str,
    exception: BaseException,
    args: Any,
    kwargs: Any,
) -> None:
    """In the worker's main process, at Celery's ``task_failure`` for a killed pool process."""
    request = failing_request(task, task_id)
    if request is None:
        logger.warning(
            "celery-recovery: no request for the lost process of %s[%s]; the sweep recovers it",
            task.name,
            task_id,
        )
        return
    error = f"{type(exception).__name__}: {exception}"
    reason = f"its pool process died ({error})"
    now = utcnow()
    change = Transition.ending(
        request.id,
        try_number_of(request),
        _UNFINISHED,
        TaskState.FAILED,
        f"{reason}; failed by the worker's main process",
        now,
        error=error,
    )
    # Celery stored the outcome (as the result settings say) and sent the signal.
    done: list[str] = [CallbackStep.RESULT_BACKEND, CallbackStep.FAILURE_SIGNAL]
    callback = _callback_row(task, request, "failure", reason, args, kwargs, done, now)
    context.runtime.write(WriteKind.OUTBOXED, OutboxedTransition(change, callback))


def _unwrapped(exc_info: Any) -> BaseException | None:
    """The exception Celery judges (a pool's error comes wrapped with its traceback)."""
    exc = getattr(exc_info, "exception", None)
    return exc.exc if isinstance(exc, ExceptionWithTraceback) else exc


def _record_requeued_death(request: Any, exception: BaseException) -> None:
    """Celery requeued the message of a try whose pool process died: the try is
    ``queued`` again with one more death, if it is still that process's."""
    try:
        context = context_for_app(request.task.app)
        pid = request.worker_pid
        if context is None or pid is None:
            return  # not recorded here, or never accepted: the sweep judges it
        now = utcnow()
        reason = (
            f"its pool process died ({type(exception).__name__}: {exception}); "
            "requeued by Celery (task_reject_on_worker_lost)"
        )
        values = {
            "state": TaskState.QUEUED,
            "job_id": None,
            "queued_at": now,
            "updated_at": now,
            "state_reason": reason,
        }
        change = Transition(
            request.id, try_number_of(request._context), (TaskState.RUNNING,), values, pid
        )
        context.runtime.write(WriteKind.TRANSITION, change)
    except Exception:
        # Celery's own handling of the death has happened; ours must not break it.
        logger.exception("celery-recovery: recording the requeue of %s failed", request.id)


def record_lost_retry(context: RecoveryContext, task: Any, reason: Any) -> None:
    """In the worker's main process, at ``task_retry`` sent by ``task_retry_on_worker_lost``."""
    request = task.request
    now = utcnow()
    change = _ending(
        task,
        _UNFINISHED,
        TaskState.UP_FOR_RETRY,
        f"its pool process died; retried by Celery: {reason}",
        now,
    )
    # Celery already published the next try and called on_retry: the listeners remain.
    text = f"its pool process died ({reason})"
    done: list[str] = [CallbackStep.ON_RETRY]
    callback = _callback_row(task, request, "retry", text, request.args, request.kwargs, done, now)
    context.runtime.write(WriteKind.OUTBOXED, OutboxedTransition(change, callback))


def is_lost_process_retry(reason: Any) -> bool:
    return isinstance(getattr(reason, "exc", None), WorkerLostError)


def runs_allowed(max_retries: int | None, retries: int, unbounded_cap: int) -> int:
    """Runs a try may have when each run that dies counts as one of the task's retries."""
    if max_retries is None:
        return unbounded_cap
    return max(1, max_retries + 1 - retries)


def claim_counting_deaths(context: RecoveryContext, task: Any, record: dict[str, Any]) -> bool:
    """In the pool process, before an ``acks_late`` body runs: claim the try durably.

    True when the try already used up its runs: it is failed instead, and the
    body is skipped (the message is acknowledged).
    """
    runtime = context.runtime
    if not runtime.health.available():
        runtime.record_start(record)  # the store is down: availability over counting
        return False
    try:
        deaths = context.store.tries.claim_counting_deaths(record)
    except StoreError as exc:
        runtime.health.record_failure(exc, f"claiming {record['task_id']}")
        runtime.record_start(record)
        return False
    runtime.health.record_success()
    request = task.request
    allowed = runs_allowed(
        task.max_retries, int(request.retries or 0), context.settings.max_lost_runs
    )
    if deaths is None or deaths < allowed:
        return False
    limit = (
        f"recovery_max_lost_runs ({allowed}) for max_retries=None"
        if task.max_retries is None
        else f"max_retries ({task.max_retries}) exceeded"
    )
    reason = f"its process died in each of its {deaths} runs; not run again: {limit}"
    if not _fail(context, task, reason):
        return False
    logger.error(
        "celery-recovery: task %s[%s] try %d failed: %s",
        task.name,
        request.id,
        record["try_number"],
        reason,
    )
    return True


def _fail(context: RecoveryContext, task: Any, reason: str) -> bool:
    request = task.request
    exc = WorkerLostError(reason)
    now = utcnow()
    change = _ending(task, (TaskState.RUNNING,), TaskState.FAILED, reason, now)
    change.values["error"] = f"WorkerLostError: {reason}"
    done: list[str] = [CallbackStep.RESULT_BACKEND]
    callback = _callback_row(
        task, request, "failure", reason, request.args, request.kwargs, done, now
    )
    try:
        won = context.store.tries.apply_outboxed([OutboxedTransition(change, callback)]) == 1
    except StoreError as exc_:
        context.runtime.health.record_failure(exc_, f"failing {request.id}")
        return False
    # The body is skipped either way; FAILURE is stored at task_postrun (so that it
    # replaces the STARTED Celery stored before this) by the delivery that failed the try.
    if won:
        delivery_ending.mark(request.id, Ending.FAILED_INSTEAD, exc)
    else:
        delivery_ending.mark(request.id, Ending.DROPPED)
    return True


def store_refused_failure(task: Any, ended: Ended) -> None:
    """At ``task_postrun`` of a try failed instead of run: FAILURE in the result backend."""
    task_id = ended.task_id
    request = task.request
    ignored = getattr(request, "ignore_result", False) or task.ignore_result
    # As Celery stores a failure (errbacks and chord counting included).
    task.backend.mark_as_failure(
        task_id,
        ended.error,
        request=request,
        store_result=not ignored or task.store_errors_even_if_ignored,
    )


def _ending(
    task: Any, expected: tuple[TaskState, ...], state: TaskState, reason: str, now: Any
) -> Transition:
    """The compare-and-set that ends the current try of ``task``'s request."""
    request = task.request
    return Transition.ending(request.id, try_number_of(request), expected, state, reason, now)


def _callback_row(
    task: Any,
    request: Any,
    kind: CallbackKind,
    reason: str,
    args: Any,
    kwargs: Any,
    done: list[str],
    now: datetime,
) -> OutboxRow:
    """The outbox row of a try whose pool process died (``request``: its context)."""
    return worker_callback_row(
        task.name,
        request,
        kind=kind,
        reason=reason,
        exception=WorkerLostError.__name__,
        args=args,
        kwargs=kwargs,
        done=done,
        now=now,
    )


def worker_callback_row(
    task_name: str,
    request: Any,
    *,
    kind: CallbackKind,
    reason: str,
    exception: str,
    args: Any,
    kwargs: Any,
    done: list[str],
    now: datetime,
) -> OutboxRow:
    """The outbox row of a try the worker's main process ended: ``done`` names what Celery
    already did of the callbacks, so that delivery does the rest once."""
    payload = CallbackPayload(
        task_name=task_name,
        reason=reason,
        exception=exception,
        args=_json_or(list(args or ()), []),
        kwargs=_json_or(dict(kwargs or {}), {}),
        hostname=getattr(request, "hostname", None),
        done=tuple(done),
    )
    return callback_row(request.id, try_number_of(request), kind, payload, now)


def _json_or(value: Any, empty: Any) -> Any:
    """``value`` when the store can keep it as JSON, else ``empty`` (never the whole row lost)."""
    encoded, _ = encode_json(value)
    return value if encoded is not None else empty
