"""Durable failure callbacks: run ``on_failure``/``on_retry`` for tries a sweep failed.

A callback row is written in the same transaction that fails or retries the
try (the outbox).  Delivery claims due rows under a lease (row locks with
SKIP LOCKED on PostgreSQL), commits, and only then, with no transaction
open, stores a failure in the result backend (failures only; so that
``AsyncResult.get()`` returns), runs the task's ``on_failure`` (or ``on_retry``), Celery's
``task_failure`` signal (failures only) and the listeners registered with
:meth:`celery_recovery.Recovery.add_failure_listener`, each in a thread
given ``recovery_callback_timeout`` seconds.  The row is deleted afterwards.
A row may name steps Celery itself already took (``done`` in its payload, e.g. the
result backend and the signal for a pool process Celery saw die): those are
skipped, so each runs once.

Exactly once in the normal case.  Twice: the delivering process dies (or
stalls past the claim lease) after running the callbacks and before deleting
the row, so another sweep claims it again: once the lease runs out, or as soon
as a sweep records the delivering process's job dead (a pool process running
the fallback sweep, stopped for a hung try it ran, must not hold its rows for
the whole lease).  Never: the row is dropped after
:data:`MAX_ATTEMPTS` deliveries that each died, or the store loses it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery.exceptions import TimeLimitExceeded
from celery.signals import task_failure

from celery_recovery.core.audit import AuditAction, AuditReason, Decision
from celery_recovery.core.errors import LostWorkerError, TriggerFailedError, TriggerTimeoutError
from celery_recovery.core.outbox import UNKNOWN_REASON, CallbackPayload, CallbackStep
from celery_recovery.messages.result_backends import caller_request
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.telemetry import metrics

logger = logging.getLogger("celery_recovery.callbacks")

#: Deliveries of one row that may die before it is given up.
MAX_ATTEMPTS = 5

#: Exceptions a callback row may name (a deferred try failed by its trigger, a pool
#: process Celery saw die or killed at its hard time limit); anything else is a lost worker.
_EXCEPTIONS: dict[str, Callable[[str], BaseException]] = {
    cls.__name__: cls
    for cls in (TriggerFailedError, TriggerTimeoutError, WorkerLostError, TimeLimitExceeded)
}


def deliver_callbacks(ctx: SweepContext) -> None:
    settings = ctx.settings
    store = ctx.store
    lease = settings.callback_timeout * 4 + 10
    rows = store.outbox.claim_callbacks(ctx.now, ctx.holder, lease)
    for row in rows:
        with ctx.isolated(f"callback {row['id']} of {row['task_id']}"):
            # None: not written by this package; nothing is run with it.
            payload = CallbackPayload.from_json(row["payload"] or {})
            if row["attempts"] > MAX_ATTEMPTS:
                logger.error(
                    "celery-recovery: giving up the %s callback of %s try %s after %d attempts",
                    row["kind"],
                    row["task_id"],
                    row["try_number"],
                    row["attempts"] - 1,
                )
                audit = _audit(ctx, row, payload, "abandoned")
                store.outbox.delete_callback(row["id"], ctx.holder, audit)
                metrics.callback_outcome(row["kind"], "abandoned")
                continue
            ok = _deliver(ctx, row, payload)
            store.outbox.delete_callback(
                row["id"], ctx.holder, _audit(ctx, row, payload, ok and "delivered")
            )
            if ok:
                ctx.report.callbacks_delivered += 1
            else:
                ctx.report.callbacks_failed += 1
            metrics.callback_outcome(row["kind"], "delivered" if ok else "failed")


def _audit(
    ctx: SweepContext, row: Mapping[str, Any], payload: CallbackPayload | None, outcome: str | bool
) -> Decision:
    """The audit row of a delivery: ``outcome`` is delivered, abandoned, or False (failed)."""
    task_name, job_id = (payload.task_name, payload.job_id) if payload else (None, None)
    record = {**row, "task_name": task_name, "job_id": job_id}
    action = AuditAction(f"callback_{outcome or 'failed'}")
    detail = f"{row['kind']} callback: {payload.reason if payload else UNKNOWN_REASON}"
    return ctx.decision(action, AuditReason.CALLBACK_DUE, record, detail)


def _deliver(ctx: SweepContext, row: Mapping[str, Any], payload: CallbackPayload | None) -> bool:
    if payload is None:
        logger.error(
            "celery-recovery: the %s callback row %s of %s is not a JSON object; dropped",
            row["kind"],
            row["id"],
            row["task_id"],
        )
        return False
    task_id, try_number, kind = row["task_id"], row["try_number"], row["kind"]
    reason = payload.reason
    named = _EXCEPTIONS.get(payload.exception or "")
    exc = named(reason) if named else LostWorkerError(reason, task_id, try_number)
    einfo = _einfo(exc)
    args, kwargs = payload.args, payload.kwargs
    task = ctx.app.tasks.get(payload.task_name or "")
    timeout = ctx.settings.callback_timeout
    done = set(payload.done)
    ok = True
    if kind == "failure" and CallbackStep.RESULT_BACKEND not in done:
        # As a worker's own failure would, the result backend learns the outcome first:
        # otherwise AsyncResult stays STARTED or PENDING and get() never returns.
        # A stored SUCCESS is never overwritten, so a late real outcome still wins.
        backend = ctx.app.backend
        request = caller_request(task_id, payload.reply_route)
        ok &= _run(
            "result backend", timeout, backend.mark_as_failure, task_id, exc, request=request
        )
    if task is not None:
        handler = task.on_failure if kind == "failure" else task.on_retry
        if f"on_{kind}" not in done:
            ok &= _run(
                f"{task.name}.on_{kind}", timeout, handler, exc, task_id, args, kwargs, einfo
            )
        if kind == "failure" and CallbackStep.FAILURE_SIGNAL not in done:
            ok &= _run(
                "task_failure signal",
                timeout,
                task_failure.send,
                sender=task,
                task_id=task_id,
                exception=exc,
                args=args,
                kwargs=kwargs,
                traceback=einfo.traceback,
                einfo=einfo,
            )
    for listener in list(ctx.context.failure_listeners):
        ok &= _run(
            getattr(listener, "__qualname__", repr(listener)),
            timeout,
            listener,
            task_id=task_id,
            task_name=payload.task_name,
            try_number=try_number,
            kind=kind,
            exception=exc,
        )
    return ok


def _run(name: str, timeout: float, func: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Run one callback in its own thread; a slow or raising one cannot hold up the rest."""
    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            func(*args, **kwargs)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"celery-recovery-callback {name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        logger.error(
            "celery-recovery: callback %s still running after %ss; moving on", name, timeout
        )
        return False
    if "error" in outcome:
        logger.error("celery-recovery: callback %s raised %r", name, outcome["error"])
        return False
    return True


def _einfo(exc: BaseException) -> ExceptionInfo:
    try:
        raise exc
    except type(exc):
        return ExceptionInfo()
