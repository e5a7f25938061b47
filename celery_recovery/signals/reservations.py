"""Reservations: a worker's main process records each message it takes.

``task_received`` is sent in the worker's main process for every message it
takes from the broker (prefetched, or held for its ETA or countdown), before
the message is reserved or scheduled.  The handler queues one small write (the
try, the main process's job, the time) to the batched writer, so that when the
whole worker dies its reserved tries are published again in the same sweep as
its running ones, not ``recovery_queued_timeout`` later.

It also stamps the reception time on the request, which reaches the pool
process: a delivery that waited in this worker longer than a heartbeat
interval may have been published again meanwhile (its job was judged dead
during a pause), so it is checked before it runs (see :mod:`..redundant_deliveries`).

A reservation says "this live worker holds the message", which keeps the
lost-message sweep off the try.  When the worker's broker connection breaks,
Celery forgets every message it held and did not start (they cannot be
acknowledged on a new channel; the broker keeps them, Redis for its visibility
timeout): :class:`ForgetReservationsOnReconnect`, a consumer step, deletes the
job's reservations then, so those tries fall back to the queued timeout.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from celery import bootsteps
from celery.signals import task_received
from celery.worker import state as worker_state

from celery_recovery.core.errors import StoreError
from celery_recovery.core.records import WriteKind
from celery_recovery.core.timeutils import from_timestamp
from celery_recovery.messages.headers import RECEIVED_BEFORE_HEADER, RESERVED_AT_HEADER
from celery_recovery.runtime.context import context_for_app
from celery_recovery.signals.guard import handler_failed

#: Seconds a prefork worker's main process keeps between two commits.  It is the
#: busiest process of the worker (it takes every message and hands it to a pool
#: process), so a busy one commits a few times a second, not fifty; a quiet one
#: commits a reservation within the writer's claim interval (20 ms).  A worker
#: killed before the commit leaves those few messages to the queued timeout.
MAIN_PROCESS_FLUSH_INTERVAL = 0.2


def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    try:
        _reserve(sender, request)
    except Exception:
        handler_failed("on_received")


def _reserve(sender: Any, request: Any) -> None:
    context = context_for_app(getattr(sender, "app", None))
    if context is None or request is None:
        return
    exclusions = context.exclusions
    if exclusions and exclusions.request(request.task_name, request):
        return
    runtime = context.runtime
    job_id = runtime.job_id
    if job_id is None:
        return  # not a worker job (yet): the queued timeout stays the net
    details = request.request_dict
    received = time.time()
    details[RESERVED_AT_HEADER] = received
    if _received_before(request):
        details[RECEIVED_BEFORE_HEADER] = True
    try_number = int(details.get("retries") or 0) + 1
    # Held weakly: kept alive by the buffer, every request (its message, headers, body)
    # would outlive its task by up to a flush interval, and the garbage collector would
    # pass over all of them again and again.
    runtime.writer.submit_built(
        WriteKind.RESERVED, _reservation, (weakref.ref(request), try_number, job_id, received)
    )


def _received_before(request: Any) -> bool:
    """True when the broker says it handed this message out before.

    SQS counts the receives of a message (``ApproximateReceiveCount``, which
    kombu asks for), but kombu does not turn a second one into Celery's
    ``redelivered``: a message SQS hands out again once its visibility timeout
    passed (the unacknowledged messages of a dead worker) would look new to the
    pool process, whose check of redundant deliveries would let it run again.
    """
    info = getattr(getattr(request, "message", None), "delivery_info", None) or {}
    sqs_message = info.get("sqs_message")
    if not isinstance(sqs_message, dict):
        return False
    count = (sqs_message.get("Attributes") or {}).get("ApproximateReceiveCount", 1)
    try:
        return int(count) > 1
    except (TypeError, ValueError):
        return False


def _reservation(held: tuple[weakref.ref[Any], int, str, float]) -> tuple | None:
    """The reservation row of a request still waiting when the batch is written.

    None once it is started (its pool process's claim covers it: the row would be
    for nothing) or gone: Celery lets go of a request only once it is done with its
    message (run, revoked, expired, rejected, or forgotten with a lost connection,
    whose reservations are deleted anyway).
    """
    ref, try_number, job_id, received = held
    request = ref()
    if request is None or request.time_start is not None:
        return None
    return (request.id, try_number, job_id, from_timestamp(received))


class ForgetReservationsOnReconnect(bootsteps.StartStopStep):
    """A consumer step whose ``stop`` runs when the consumer restarts after a lost
    broker connection, after Celery cleared its reserved and scheduled messages: the
    job's reservations go too (not at shutdown: see :meth:`stop`)."""

    def create(self, c: Any) -> ForgetReservationsOnReconnect:
        return self

    def start(self, c: Any) -> None:
        pass

    def stop(self, c: Any) -> None:
        if worker_state.should_stop is not None or worker_state.should_terminate is not None:
            # A shutdown, not a reconnect: the messages go back to the broker only if this
            # process gets to close its connection.  Killed before (a deploy's SIGKILL
            # after its grace period), the sweep must still know this job held them; if
            # it exits cleanly, its job ends and another worker's claim supersedes them.
            return
        context = context_for_app(c.app)
        if context is None:
            return
        runtime = context.runtime
        job_id = runtime.job_id
        if job_id is None:
            return
        # Reservations still buffered would otherwise be written after the delete.
        runtime.writer.flush(timeout=2.0)
        try:
            context.store.reservations.forget_job(job_id)
        except StoreError as exc:
            runtime.health.record_failure(exc, f"forgetting the reservations of job {job_id}")

    def shutdown(self, c: Any) -> None:
        pass  # see stop(): a shutdown keeps the reservations


def connect() -> None:
    task_received.connect(on_received, weak=False, dispatch_uid=__name__ + ".received")
