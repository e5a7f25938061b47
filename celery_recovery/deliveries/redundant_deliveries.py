"""Redundant deliveries: a try's body never runs twice.

A delivery is redundant when its try no longer needs it: the try was
superseded by a later try, is already finished, is deferred, or is running in
a live job.  Such a delivery is dropped: its body is skipped, a warning says
"dropping stale delivery", and the audit log records it (reason
``stale_delivery``).

They happen after a sweep re-published a try, when the broker still hands
out the original message (Redis restores unacknowledged messages after its
visibility timeout, RabbitMQ requeues them when the dead worker's connection
drops, and a message the lost-message sweep replaced may only have been
slow).  Redis also restores a message whose task is still running past the
visibility timeout.

The check runs as the delivery starts (the task's ``before_start``, see
:mod:`celery_recovery.signals.tasks`), before the try is claimed, and only for
deliveries that can be redundant (so the hot path does not pay a round
trip): those the broker marks redelivered (or SQS counts as received
before), resumes of deferred tries, those published longer ago than half
of ``recovery_queued_timeout`` (the lost-message sweep only replaces older
ones), and those that waited in this worker longer than a heartbeat
interval (the reserved sweep replaces the messages of a worker judged dead,
which a paused one still holds).  One that
may be redundant and is not is claimed at once, not through the writer: a
sweep replacing the try at the same moment then either sees the claim or
makes the claim fail.  A dropped delivery's ``before_start`` raises
``Ignore``: Celery acknowledges the message and skips the body.

Celery's built-in tasks are checked too.  ``celery.chord_unlock`` retries
itself until its chord's header is ready, each retry a new try of the same
task id, so a restored copy of an earlier try is dropped as superseded; the
chord body itself is published under a claim (see :mod:`.canvas`), which also
covers two copies of the same try.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery_recovery.core.audit import retry_never_sent, stale_delivery
from celery_recovery.core.errors import StoreError
from celery_recovery.core.records import WriteKind
from celery_recovery.core.states import (
    FINISHED_TASK_STATES,
    RETRY_RECONCILED_REASON,
    JobState,
    TaskState,
)
from celery_recovery.core.thread_marks import Ending, delivery_ending
from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.backend_probe import finished_state
from celery_recovery.messages.headers import (
    PUBLISHED_AT_HEADER,
    RECEIVED_BEFORE_HEADER,
    RESENT_HEADER,
    RESERVED_AT_HEADER,
    RESUME_HEADER,
)
from celery_recovery.messages.records import record_from_request, try_number_of
from celery_recovery.messages.resends import is_resent

if TYPE_CHECKING:
    from celery_recovery.core.settings import RecoverySettings
    from celery_recovery.runtime.context import RecoveryContext

logger = logging.getLogger("celery_recovery.redundant_deliveries")

#: The endings in which the body was skipped.
_DROPS = (Ending.DROPPED, Ending.FAILED_INSTEAD)


def drop_if_redundant(
    context: RecoveryContext, task: Any, task_id: str, request: Any = None
) -> bool:
    """As a delivery starts: True (and the body will be skipped) for a redundant delivery;
    a delivery that may be redundant and is not is claimed.

    ``request`` is ``task.request``, passed by a caller that already read it.
    """
    if request is None:
        request = task.request
    if not _may_be_redundant(request, context.settings):
        return False
    try_number = try_number_of(request)
    runtime = context.runtime
    # This process may have just finished the try, with its outcome still buffered.
    runtime.writer.flush(timeout=2.0)
    try:
        view = context.store.try_recovery.delivery_view(task_id, try_number)
    except StoreError as exc:
        # Availability over certainty: without the store the delivery runs.
        runtime.health.record_failure(exc, f"checking a redelivery of {task_id}")
        return False
    # "Live" here means it beat within two intervals: a worker that died a moment
    # ago must not make us drop the broker's redelivery of its task.
    fresh = 2 * context.settings.heartbeat_interval
    why = _redundant_because(view, try_number, fresh)
    if why is not None and why.owner_may_be_dead:
        try:
            view = _settle_owner(context, task_id, try_number, view, fresh)
        except StoreError as exc:
            runtime.health.record_failure(exc, f"checking a redelivery of {task_id}")
            return False
        why = _redundant_because(view, try_number, fresh)
    if why is None and is_resent(request):
        # The original may have run in a worker that died before its outcome reached
        # the store; the result backend has it then.
        state = finished_state(context.app, task_id)
        if state is not None:
            why = Redundant(f"sent again by a new run of its publisher; it already ran ({state})")
    if why is None and _retry_never_sent(view, try_number):
        reason = (
            f"its own message came back and no try {try_number + 1} was ever recorded: "
            "the retry the result backend read was never sent; run"
        )
        audit = retry_never_sent(task.name, task_id, try_number, reason, view)
        try:
            runtime.store.try_recovery.reopen_retry_never_sent(
                task_id, try_number, reason, utcnow(), audit
            )
        except StoreError as exc:
            runtime.health.record_failure(exc, f"reopening {task_id}")
            return False
        logger.warning(
            "celery-recovery: running %s[%s] try %d: %s", task.name, task_id, try_number, reason
        )
    if why is None:
        try:
            if runtime.store.tries.mark_running(
                record_from_request(task, utcnow(), runtime.job_id, request)
            ):
                return False
        except StoreError as exc:
            runtime.health.record_failure(exc, f"claiming a redelivery of {task_id}")
            return False
        why = Redundant("the try changed while this delivery was checked (a sweep replaced it)")
    logger.warning(
        "celery-recovery: dropping stale delivery of %s[%s] try %d: %s",
        task.name,
        task_id,
        try_number,
        why.reason,
    )
    audit = stale_delivery(task.name, task_id, try_number, why.reason, view)
    runtime.write(WriteKind.AUDIT, audit)
    drop_delivery(task_id)
    return True


def drop_delivery(task_id: str) -> None:
    """Skip the body of the delivery of ``task_id`` this thread is starting
    (its ``before_start`` raises ``Ignore``, and the message is acknowledged)."""
    delivery_ending.mark(task_id, Ending.DROPPED)


def _settle_owner(
    context: RecoveryContext, task_id: str, try_number: int, view: dict[str, Any], fresh: float
) -> dict[str, Any]:
    """Wait until the job that runs the try proves alive (beats again) or dead.

    A fresh heartbeat alone does not tell: RabbitMQ requeues a dead worker's
    unacknowledged message the moment its connection closes, so the redelivery
    arrives while the dead job's last beat is still fresh, on a host that cannot
    see the process.  Dropping it would leave the try to the zombie sweep and an
    adoption timeout (minutes); waiting at most ``fresh`` seconds settles it.
    """
    seen = view["job_heartbeat"]
    deadline = time.monotonic() + fresh + context.settings.heartbeat_interval
    while time.monotonic() < deadline:
        time.sleep(context.settings.heartbeat_interval / 4)
        now_view = context.store.try_recovery.delivery_view(task_id, try_number)
        heartbeat = now_view["job_heartbeat"]
        changed = (now_view["state"], now_view["job_id"]) != (view["state"], view["job_id"])
        if changed or heartbeat != seen:
            return now_view  # it moved on, or its owner beat again: alive
        if heartbeat is None or utcnow() - heartbeat >= timedelta(seconds=fresh):
            return now_view  # no beat for two intervals: the owner is dead
    return context.store.try_recovery.delivery_view(task_id, try_number)


def was_dropped(task_id: str, forget: bool = True) -> bool:
    """True when this thread dropped the delivery of ``task_id`` (as redundant, or
    failed instead of run); ``forget`` clears the mark."""
    ended = delivery_ending.peek(task_id)
    if ended is None or ended.how not in _DROPS:
        return False
    if forget:
        delivery_ending.take(task_id)
    return True


@dataclass(frozen=True)
class Redundant:
    """Why a delivery is redundant, as the log and the audit say it."""

    reason: str
    #: The try runs in a job whose heartbeat is fresh: that alone does not prove the
    #: job alive (see :func:`_settle_owner`).
    owner_may_be_dead: bool = False


def _retry_never_sent(view: dict[str, Any], try_number: int) -> bool:
    """The try is ``up_for_retry`` only because a sweep read RETRY in the result backend,
    and no later try was ever recorded: its retry never came (Celery 5.5.3 stores RETRY
    on a cold shutdown without sending one), so this delivery is the way forward.  A
    real retry's next try is recorded long before: the sweep decided a zombie threshold
    after the worker's last heartbeat."""
    return (
        view["state"] == TaskState.UP_FOR_RETRY
        and view.get("state_reason") == RETRY_RECONCILED_REASON
        and view["latest"] == try_number
    )


def _redundant_because(view: dict[str, Any], try_number: int, fresh: float) -> Redundant | None:
    state = view["state"]
    if view["latest"] > try_number:
        return Redundant(f"superseded by try {view['latest']}")
    if state == TaskState.REVOKED and view.get("recovered_at") is not None:
        return None  # a sweep's presumption from a revoke or purge: the delivery proves it wrong
    if _retry_never_sent(view, try_number):
        return None
    if state in FINISHED_TASK_STATES:
        return Redundant(f"the try is already {state}")
    if state == TaskState.DEFERRED:
        return Redundant("the try is deferred, waiting for its trigger")
    if state == TaskState.RUNNING and view["job_state"] == JobState.RUNNING:
        heartbeat = view["job_heartbeat"]
        fresh_beat = heartbeat is not None and utcnow() - heartbeat < timedelta(seconds=fresh)
        if fresh_beat and not _died_here(view.get("job_hostname"), view.get("job_pid")):
            return Redundant(f"the try is running in live job {view['job_id']}", True)
    return None


def _died_here(hostname: str | None, pid: int | None) -> bool:
    """True when the job's process was on this host and is gone.

    A pool process killed a moment ago still has a fresh heartbeat, and with
    ``task_reject_on_worker_lost`` its message comes straight back to this
    worker: that redelivery is the recovery and must run.
    """
    if not pid or hostname != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return _is_zombie_process(pid)


def _is_zombie_process(pid: int) -> bool:
    # A killed child not yet reaped by its parent still answers signal 0.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def _may_be_redundant(request: Any, settings: RecoverySettings) -> bool:
    delivery = request.delivery_info or {}
    if delivery.get("redelivered") or getattr(request, RECEIVED_BEFORE_HEADER, None):
        return True  # handed out before (SQS says so only in its own receive count)
    if getattr(request, RESUME_HEADER, None) is not None:
        return True  # a triggerer that died after publishing may have published it twice
    reserved = getattr(request, RESERVED_AT_HEADER, None)
    if isinstance(reserved, int | float) and time.time() - reserved > settings.heartbeat_interval:
        return True
    if getattr(request, RESENT_HEADER, None):
        return True  # maybe a copy of what an earlier run of its publisher sent
    published = getattr(request, PUBLISHED_AT_HEADER, None)
    if isinstance(published, int | float):
        return time.time() - published > settings.queued_timeout / 2
    return False
