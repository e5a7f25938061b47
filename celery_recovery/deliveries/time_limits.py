"""Time limits: a try killed for overrunning its hard limit ends failed, for the limit.

The worker's main process enforces a hard limit: billiard fails the job with
``TimeLimitExceeded`` (Celery's ``Request.on_failure`` stores FAILURE and sends
``task_failure``), then calls ``Request.on_timeout`` and kills the pool process.
What ``on_timeout`` does depends on the Celery version: 5.7 calls the task's
``on_failure`` and sends ``task_failure`` again; 5.5 and 5.6 only log.  No
signal tells which, so ``on_timeout`` itself is wrapped (in the worker's main
process, once; a rare path, not the per-task one).  The wrapper notes whether
Celery sent ``task_failure`` for the request, before or during the call (5.7
calls ``on_failure`` just before its signal), then records the try failed with
an outbox row that names what Celery already did: ``on_failure``,
``task_failure`` and the failure listeners each run once on every version, and
no sweep runs the try again (it would hit the limit again).

The killed pool process reports nothing useful: its body is interrupted by the
terminating signal and Celery's ``task_postrun`` comes with no state, which
:mod:`celery_recovery.signals.tasks` leaves to this verdict.

A soft limit raises ``SoftTimeLimitExceeded`` in the body; when the task lets it
escape, the try fails in its own process like any other exception, and
:func:`soft_limit_reason` names the limit in the try's reason.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from celery_recovery.core.outbox import CallbackStep
from celery_recovery.core.patching import wrap_once
from celery_recovery.core.records import OutboxedTransition, Transition, WriteKind
from celery_recovery.core.states import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.deliveries.worker_lost import worker_callback_row
from celery_recovery.messages.records import try_number_of
from celery_recovery.runtime.context import RecoveryContext, context_for_app


class _Timeouts(threading.local):
    #: Id of the request whose ``on_timeout`` this thread is running, and whether Celery
    #: sent ``task_failure`` for it meanwhile (class-level defaults: see
    #: :mod:`celery_recovery.core.thread_marks`).
    task_id: str | None = None
    signalled: bool = False


_timeouts = _Timeouts()

#: Ids of requests for which Celery sent ``task_failure`` (``TimeLimitExceeded``) from the
#: main process, awaiting their ``on_timeout``; billiard calls both from one thread, so
#: this stays as small as the number of limits being handled at once.
_signalled: set[str] = set()
#: More entries than this means ``on_timeout`` stopped following: forget them.
_SIGNALLED_MAX = 10_000


def install() -> None:
    """Wrap Celery's ``Request.on_timeout`` (idempotent); done as a worker starts."""
    from celery.worker.request import Request

    wrap_once(Request, "on_timeout", _on_timeout)


def _on_timeout(original: Any) -> Any:
    @functools.wraps(original)
    def on_timeout(self: Any, soft: bool, timeout: float) -> Any:
        context = None if soft else _context_of(self)
        if context is None:
            return original(self, soft, timeout)
        _timeouts.task_id, _timeouts.signalled = self.id, False
        try:
            return original(self, soft, timeout)
        finally:
            hooks_called = _timeouts.signalled
            _timeouts.task_id = None
            signal_sent = hooks_called or self.id in _signalled
            _signalled.discard(self.id)
            _record_hard_limit(context, self, timeout, signal_sent, hooks_called)

    return on_timeout


def note_failure_signal(task_id: str, exception: BaseException | None) -> bool:
    """At ``task_failure`` in the worker's main process: True when it is Celery's report
    of a hard limit (the try is recorded by the ``on_timeout`` wrapper instead)."""
    if not isinstance(exception, TimeLimitExceeded):
        return False
    if _timeouts.task_id == task_id:
        _timeouts.signalled = True
    else:
        if len(_signalled) >= _SIGNALLED_MAX:
            _signalled.clear()
        _signalled.add(task_id)
    return True


def soft_limit_reason(exception: BaseException | None, task: Any, request: Any) -> str | None:
    """The try's reason when ``exception`` is an escaped soft time limit, else None."""
    if not isinstance(exception, SoftTimeLimitExceeded):
        return None
    limits = getattr(request, "timelimit", None) or (None, None)
    soft = limits[1] if len(limits) > 1 and limits[1] else task.soft_time_limit
    soft = soft or task.app.conf.task_soft_time_limit
    return f"soft time limit ({_seconds(soft)}) exceeded"


def _record_hard_limit(
    context: RecoveryContext,
    request: Any,
    timeout: float,
    signal_sent: bool,
    hooks_called: bool,
) -> None:
    from celery.worker import state as worker_state

    if getattr(worker_state, "should_terminate", None):
        # A cold shutdown's kill, which 5.7 does not count as a failure: the try is
        # left running, to be recovered with the rest of the stopping worker's.
        return
    limit = f"hard time limit ({_seconds(timeout)}) exceeded"
    now = utcnow()
    context_ = request._context  # the task's request context (id, retries, hostname)
    change = Transition.ending(
        context_.id,
        try_number_of(context_),
        (TaskState.QUEUED, TaskState.RUNNING),
        TaskState.FAILED,
        f"{limit}; its pool process was killed by the worker's main process",
        now,
        error=f"{TimeLimitExceeded.__name__}: {limit}",
    )
    done: list[str] = [CallbackStep.RESULT_BACKEND]
    if signal_sent:
        done.append(CallbackStep.FAILURE_SIGNAL)
    if hooks_called:  # 5.7: on_failure, then task_failure, within on_timeout
        done.append(CallbackStep.ON_FAILURE)
    callback = worker_callback_row(
        request.task_name,
        context_,
        kind="failure",
        reason=limit,
        exception=TimeLimitExceeded.__name__,
        args=request.args,
        kwargs=request.kwargs,
        done=done,
        now=now,
    )
    context.runtime.write(WriteKind.OUTBOXED, OutboxedTransition(change, callback))


def _context_of(request: Any) -> RecoveryContext | None:
    task = getattr(request, "task", None)
    if task is None:
        return None
    context = context_for_app(task.app)
    if context is None or (context.exclusions and context.exclusions.request(task.name, request)):
        return None
    return context


def _seconds(value: Any) -> str:
    """``1`` for 1.0, ``2.5`` for 2.5: a limit as its user wrote it, with its unit."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "unknown"
    return f"{number:g} s"
