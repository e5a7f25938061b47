"""Run a delivery again later as the same try: the duplicate of a held idempotency key.

``task.retry()`` would count the wait as a retry: the try number grows with
every postponement, and a later genuine ``self.retry()`` could find
``max_retries`` spent by waiting.  Instead the same message (same id, same
``retries``) is published again with a countdown, the try goes back to
``queued``, and the delivery ends with ``Ignore`` (acknowledged, no result).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, NoReturn

from celery import states
from celery.exceptions import Ignore

from celery_recovery.core.errors import StoreError
from celery_recovery.core.states import TaskState
from celery_recovery.core.thread_marks import Ending, delivery_ending
from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.records import try_number_of

logger = logging.getLogger("celery_recovery.recoverable")


def postpone(recovery: Any, task: Any, countdown: float, why: str) -> NoReturn:
    """Publish this delivery again in ``countdown`` seconds as the same try; never returns."""
    request = task.request
    if request.is_eager:
        # apply() has no broker to wait in: Celery's eager retry runs it again at once.
        raise task.retry(countdown=countdown, max_retries=request.retries + 1)
    now = utcnow()
    runtime = recovery.runtime
    try:
        # Before the publish, so the next delivery finds the try queued, not running.
        runtime.writer.flush(timeout=2.0)
        recovery.store.tries.transition(
            request.id,
            try_number_of(request),
            TaskState.RUNNING,
            TaskState.QUEUED,
            queued_at=now,
            eta=now + timedelta(seconds=countdown),
            updated_at=now,
            state_reason=f"postponed {countdown:g}s: {why}",
        )
    except StoreError as exc:
        runtime.health.record_failure(exc, f"postponing {request.id}")
    _forget_start(task, request)
    task.signature_from_request(request, countdown=countdown, retries=request.retries).apply_async()
    delivery_ending.mark(request.id, Ending.POSTPONED)
    raise Ignore()


def _forget_start(task: Any, request: Any) -> None:
    """Say in the result backend that the try is waiting again, not started.

    With ``task_track_started`` Celery stored STARTED for this delivery, in the
    name of a live worker: left there, every sweep would take the postponed try
    for one a live worker runs, and if the worker that later holds the new
    message dies, nobody would ever publish it again.
    """
    if not task.track_started:
        return
    try:
        task.backend.store_result(request.id, None, states.PENDING, request=request)
    except Exception as exc:  # an unreachable backend must not keep the delivery running
        logger.warning("celery-recovery: could not reset %s to PENDING: %s", request.id, exc)
