"""``defer()``: give up the worker slot until a trigger fires, then resume or finish.

``defer(trigger, method_name=...)`` inside a task body records the try as
``deferred`` together with its trigger row (one transaction), marks the
task ``DEFERRED`` in the result backend, and raises :class:`TaskDeferred`
(an ``Ignore``), so Celery acknowledges the message and frees the slot
without storing a result.  The triggerer later either completes the task
itself or publishes it again with the resume header; the task's ``__call__``
(wrapped for every task of the app, and told by the task class's
``before_start`` which delivery is a resume) then runs
``method_name(event, **kwargs)`` instead of the body.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from celery import current_task
from celery.exceptions import Ignore

from celery_recovery.core.durations import positive_seconds
from celery_recovery.core.errors import DeferralError, StoreError
from celery_recovery.core.patching import wrap_once
from celery_recovery.core.states import DEFERRED_STATE
from celery_recovery.core.thread_marks import Ending, delivery_ending
from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.headers import RESUME_HEADER
from celery_recovery.messages.records import record_from_request, try_number_of
from celery_recovery.runtime.context import context_for_app
from celery_recovery.triggers.base import DEFAULT_TRIGGER_QUEUE, BaseTrigger
from celery_recovery.triggers.loading import allowed_prefixes, check_json, serialize_trigger

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext

logger = logging.getLogger("celery_recovery.deferral")

#: Seconds before a task that could not defer (store unavailable) runs again.
STORE_RETRY_COUNTDOWN = 10


class _Resumes(threading.local):
    #: (task, request, resume header) of the resumed delivery whose ``before_start``
    #: this thread passed last, for its ``__call__``; None for any other delivery.
    pending: tuple[Any, Any, dict[str, Any]] | None = None


_resumes = _Resumes()


class TaskDeferred(Ignore):
    """Raised by :func:`defer`; Celery acknowledges the message and records nothing.

    Do not catch it in the task body (``except Exception`` would), just as
    Celery's own ``Retry``.
    """

    def __init__(
        self,
        message: str = "deferred",
        trigger: BaseTrigger | None = None,
        method_name: str | None = None,
    ) -> None:
        # Only the message travels: the pool pickles exceptions as cls(*args).
        super().__init__(message)
        self.trigger = trigger
        self.method_name = method_name


def defer(
    trigger: BaseTrigger,
    method_name: str | None = None,
    kwargs: dict[str, Any] | None = None,
    timeout: float | timedelta | None = None,
) -> NoReturn:
    """Release this task's worker slot until ``trigger`` fires.

    When the trigger yields ``TriggerEvent(payload)``, the task runs again on a
    worker (same id, same try) in ``method_name(event, **kwargs)``, looked up
    on the task's class first, then as a function ``method_name(task, event,
    **kwargs)`` in the task's module; with no ``method_name`` the body runs
    again with ``self.request.trigger_event`` set.  ``TaskSuccessEvent(value)``
    completes the task with ``value`` and ``TaskFailedEvent(error)`` fails it,
    with no worker at all.  After ``timeout`` seconds the task fails with
    :class:`~celery_recovery.core.errors.TriggerTimeoutError`.

    Raises :class:`~celery_recovery.core.errors.DeferralError` for wrong arguments
    (before anything is recorded).
    """
    task = current_task._get_current_object() if current_task else None
    if task is None or task.request.called_directly or task.request.is_eager:
        raise DeferralError("defer() must be called from a task body run by a Celery worker")
    context = context_for_app(task.app)
    if context is None:
        raise DeferralError(f"defer() needs celery-recovery installed on app {task.app.main!r}")
    prefixes = allowed_prefixes(task.app, context.settings.trigger_allowed_modules)
    classpath, trigger_kwargs = serialize_trigger(trigger, prefixes)
    if method_name is not None:
        resolve_method(task, method_name)
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise DeferralError(f"defer() kwargs={kwargs!r} must be a dict")
        check_json(kwargs, "defer() kwargs")
    queue = getattr(trigger, "queue", None) or DEFAULT_TRIGGER_QUEUE
    if not isinstance(queue, str):
        raise DeferralError(f"trigger queue={queue!r} must be a string")
    timeout_at = None
    if timeout is not None:
        seconds = positive_seconds("defer() timeout", timeout, DeferralError, timedelta_ok=True)
        timeout_at = utcnow() + timedelta(seconds=seconds)
    _record_deferral(
        context,
        task,
        {
            "classpath": classpath,
            "kwargs": trigger_kwargs,
            "method_name": method_name,
            "method_kwargs": kwargs,
            "queue": queue,
            "timeout_at": timeout_at,
        },
    )
    raise TaskDeferred(f"deferred until {trigger!r} fires", trigger, method_name)


def _record_deferral(context: RecoveryContext, task: Any, trigger_row: dict[str, Any]) -> None:
    request = task.request
    runtime = context.runtime
    now = utcnow()
    # The try's running claim may still wait in this process's write buffer.
    runtime.writer.flush(timeout=5.0)
    record = record_from_request(task, now, runtime.job_id)
    try:
        done, state = context.store.triggers.defer_try(
            record, {**trigger_row, "created_at": now}, now
        )
    except StoreError as exc:
        runtime.health.record_failure(exc, f"deferring {request.id}")
        logger.warning(
            "celery-recovery: cannot defer %s[%s] while the store is unavailable (%s); "
            "it runs again in %ss",
            task.name,
            request.id,
            exc,
            STORE_RETRY_COUNTDOWN,
        )
        # Not counted against max_retries: the task itself did not fail.
        raise task.retry(
            countdown=STORE_RETRY_COUNTDOWN, max_retries=request.retries + 1, exc=exc
        ) from None
    if not done:
        raise DeferralError(
            f"try {try_number_of(request)} of {task.name}[{request.id}] is {state} in the "
            "store, so it cannot be deferred"
        )
    delivery_ending.mark(request.id, Ending.DEFERRED)
    try:
        task.backend.store_result(
            request.id,
            {"trigger": trigger_row["classpath"], "queue": trigger_row["queue"]},
            DEFERRED_STATE,
            request=request,
        )
    except Exception as exc:  # the record is what recovery relies on; the state is a courtesy
        logger.warning(
            "celery-recovery: could not store %s for %s: %s", DEFERRED_STATE, request.id, exc
        )


def resolve_method(task: Any, name: str) -> Callable[..., Any]:
    """``name`` on the task's class (bound), else a function in the task's module
    called with the task first."""
    if not isinstance(name, str) or not name.isidentifier():
        raise DeferralError(f"method_name={name!r} must be a method or function name")
    if callable(getattr(type(task), name, None)):
        return getattr(task, name)
    module = sys.modules.get(type(task).__module__)
    function = getattr(module, name, None) if module is not None else None
    if callable(function):
        return functools.partial(function, task)
    raise DeferralError(
        f"method_name={name!r}: no method {name}() on {type(task).__name__} and no function "
        f"{name}() in module {type(task).__module__}"
    )


def note_delivery(task: Any, request: Any) -> None:
    """As a delivery starts (its task class's ``before_start``, which has the request
    at hand): keep its resume, if it is one, for its ``__call__``, so that the
    ``__call__`` of every other task need not walk Celery's request stack (about
    1.3 µs).  Every delivery replaces what the one before it left."""
    resume = getattr(request, RESUME_HEADER, None)
    _resumes.pending = (task, request, resume) if isinstance(resume, dict) else None


def install_resume(cls: type) -> None:
    """Make ``cls`` run the resume method of a resumed delivery instead of its body."""
    wrap_once(cls, "__call__", lambda _inherited: _resuming_call(cls), per_class=True)


def _resuming_call(cls: type) -> Any:
    # The class's own __call__ is kept; an inherited one is looked up at each call.
    # A worker replaces Celery's Task.__call__ with one that skips pushing a second
    # request (setup_worker_optimizations), and an app finalized before the worker
    # starts had its tasks wrapped before that: holding the method found then would
    # push a copy of every request onto the stack, about 16 us per task.
    own = cls.__dict__.get("__call__")

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        pending = _resumes.pending
        if pending is not None and pending[0] is self:
            _resumes.pending = None
            _task, request, resume = pending
            event = resume.get("event")
            method = resume.get("method")
            if method is not None:
                return resolve_method(self, method)(event, **(resume.get("kwargs") or {}))
            request.trigger_event = event
        if own is not None:
            return own(self, *args, **kwargs)
        return super(cls, self).__call__(*args, **kwargs)  # type: ignore[arg-type]

    return __call__


def resume_header(method: str | None, kwargs: Any, event: Any) -> dict[str, Any]:
    return {"method": method, "kwargs": kwargs or {}, "event": event}
