"""The recovery audit log: one row for every decision a sweep, worker or triggerer takes.

It answers "why did my task run twice / not run / fail?": which try, which
process died (host, pid, last heartbeat), why, what was done, and how long
after the process's last heartbeat.  A decision that changes the store is
logged in the same transaction as the change, so the log never claims a
change that lost its compare-and-set, nor misses one that won.

A new decision point adds one line: ``audit=ctx.decision(action, reason, record)``
on the store call that applies it (or ``runtime.write(WriteKind.AUDIT, ...)`` in a worker).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from celery_recovery.core.timeutils import utcnow


class AuditAction(StrEnum):
    """What was done."""

    #: Published again as the next try (same task id).
    REPUBLISHED = "republished"
    #: Failed for good (no retries left, or nothing to publish).
    FAILED = "failed"
    #: Re-pointed to a live worker that reports it started (or given a deadline).
    ADOPTED = "adopted"
    #: Given the outcome the result backend reports, without running again.
    RECONCILED = "reconciled"
    #: Ended ``revoked`` instead of published again (revoked, expired or purged).
    REVOKED = "revoked"
    #: A delivery of a try that was superseded, finished or running elsewhere: not run.
    DROPPED = "dropped"
    #: Left alone: its worker, silent in the store, answered over the broker and holds it.
    PARTITIONED = "partitioned"
    #: A delivery of a try a sweep had given up on as retried, whose retry never came:
    #: run after all.
    DELIVERY_RUN = "delivery_run"
    #: ``on_failure``/``on_retry`` and listeners ran from the outbox.
    CALLBACK_DELIVERED = "callback_delivered"
    #: A callback from the outbox raised or timed out (run once, not again).
    CALLBACK_FAILED = "callback_failed"
    #: A callback row given up after too many deliveries that died midway.
    CALLBACK_ABANDONED = "callback_abandoned"
    #: A worker found its own consumer stalled (alive, not taking messages).
    STALLED = "stalled"
    #: A beat took the lead of the schedule (the lease's previous holder let it go).
    BEAT_LEAD_TAKEN = "beat_lead_taken"
    #: A beat sent a scheduled run late, after runs no beat sent in time.
    BEAT_CAUGHT_UP = "beat_caught_up"
    #: Scheduled runs no beat sent in time were recorded as missed, none sent.
    BEAT_SKIPPED = "beat_skipped"
    #: A beat sent a run another leader had claimed and never confirmed sent.
    BEAT_RESENT = "beat_resent"


#: Actions that recovered a try (the overview's chart counts these).
RECOVERY_ACTIONS = frozenset(
    {AuditAction.REPUBLISHED, AuditAction.FAILED, AuditAction.ADOPTED, AuditAction.RECONCILED}
)


class AuditReason(StrEnum):
    """Why it was done: what the sweep (or worker) found."""

    #: The worker running the try stopped heartbeating (a zombie).
    WORKER_LOST = "worker_lost"
    #: A live worker adopted the try but never claimed it before the deadline.
    ADOPTION_EXPIRED = "adoption_expired"
    #: Queued longer than ``recovery_queued_timeout`` and never started.
    MESSAGE_LOST = "message_lost"
    #: Received (prefetched, or held for its ETA) by a worker that died before starting it.
    RESERVED_BY_DEAD_WORKER = "reserved_by_dead_worker"
    #: The task was revoked (by id or stamp), expired, or its queue was purged.
    REVOKED = "revoked"
    #: The broker delivered a try that no longer needs running.
    STALE_DELIVERY = "stale_delivery"
    #: A try failed by a sweep owes its ``on_failure`` / ``on_retry``.
    CALLBACK_DUE = "callback_due"
    #: A deferred try's trigger failed (raised, or yielded a failure).
    TRIGGER_FAILED = "trigger_failed"
    #: A deferred try's ``defer(timeout=...)`` passed before its trigger fired.
    TRIGGER_TIMEOUT = "trigger_timeout"
    #: Free slots and ready messages but nothing received, or its broker unreachable,
    #: for ``recovery_stalled_consumer_timeout``.
    CONSUMER_STALLED = "consumer_stalled"
    #: A running try did not call ``heartbeat()`` for its ``recovery_heartbeat_timeout``.
    HUNG = "hung"
    #: No beat held the schedule's lease (its leader died, paused or stopped).
    BEAT_LEADER_GONE = "beat_leader_gone"
    #: Scheduled runs fell due while no beat led; the entry's catch-up policy decided.
    BEAT_MISSED_RUNS = "beat_missed_runs"
    #: The entry's previous run was still queued or running (its overlap policy decided).
    BEAT_OVERLAP = "beat_overlap"
    #: A leader claimed a run and lost the lead before confirming it sent.
    BEAT_UNSENT_CLAIM = "beat_unsent_claim"


#: Record keys that name the process that ran the try (a zombie query's join).
_PROCESS_KEYS = (
    ("job_id", ("job_id", "reserved_by")),
    ("hostname", ("job_hostname", "worker_hostname")),
    ("pid", ("job_pid", "worker_pid")),
    ("last_heartbeat", ("job_heartbeat",)),
)


@dataclass(frozen=True)
class Decision:
    """One audit row before it is written; ``at`` is the decision's time (aware UTC)."""

    at: datetime
    action: AuditAction
    reason: AuditReason
    task_id: str | None
    try_number: int | None
    task_name: str | None = None
    detail: str | None = None
    job_id: str | None = None
    hostname: str | None = None
    pid: int | None = None
    last_heartbeat: datetime | None = None
    actor: str | None = None

    @classmethod
    def of(
        cls,
        at: datetime,
        action: AuditAction,
        reason: AuditReason,
        record: Mapping[str, Any],
        detail: str | None = None,
        actor: str | None = None,
    ) -> Decision:
        """A decision about the try ``record`` (a task record, a zombie row or a view)."""
        process = {
            field: next((record[k] for k in keys if record.get(k) is not None), None)
            for field, keys in _PROCESS_KEYS
        }
        try_number = record.get("try_number")
        return cls(
            at=at,
            action=AuditAction(action),
            reason=AuditReason(reason),
            task_id=record.get("task_id"),
            try_number=int(try_number) if try_number is not None else None,
            task_name=record.get("task_name"),
            detail=detail if detail is not None else record.get("state_reason"),
            actor=actor,
            **process,
        )

    def row(self) -> dict[str, Any]:
        """The ``audit_log`` row: with the seconds from the last heartbeat to the decision."""
        seconds = None
        if self.last_heartbeat is not None:
            seconds = round((self.at - self.last_heartbeat).total_seconds(), 3)
        return {
            "at": self.at,
            "action": self.action.value,
            "reason": self.reason.value,
            "task_id": self.task_id,
            "try_number": self.try_number,
            "task_name": self.task_name,
            "detail": self.detail,
            "job_id": self.job_id,
            "hostname": self.hostname,
            "pid": self.pid,
            "last_heartbeat": self.last_heartbeat,
            "recovery_seconds": seconds,
            "actor": self.actor,
        }


def stale_delivery(
    task_name: str, task_id: str, try_number: int, why: str, view: Mapping[str, Any]
) -> Decision:
    """A worker dropped a delivery of a try (``view``: the store's view of that try)."""
    record = {**view, "task_id": task_id, "try_number": try_number, "task_name": task_name}
    actor = f"{socket.gethostname()}:{os.getpid()}"
    dropped, stale = AuditAction.DROPPED, AuditReason.STALE_DELIVERY
    return Decision.of(utcnow(), dropped, stale, record, why, actor)


def retry_never_sent(
    task_name: str, task_id: str, try_number: int, why: str, view: Mapping[str, Any]
) -> Decision:
    """A worker runs a delivery of a try the sweep had made ``up_for_retry`` from the
    backend's RETRY, no later try having been recorded (``view``: the store's view)."""
    record = {**view, "task_id": task_id, "try_number": try_number, "task_name": task_name}
    actor = f"{socket.gethostname()}:{os.getpid()}"
    return Decision.of(
        utcnow(), AuditAction.DELIVERY_RUN, AuditReason.MESSAGE_LOST, record, why, actor
    )


def beat_decision(
    action: AuditAction,
    reason: AuditReason,
    entry: str,
    task_name: str | None,
    task_id: str | None,
    detail: str,
    at: datetime | None = None,
) -> Decision:
    """A beat scheduler's decision about schedule entry ``entry`` (named in ``detail``)."""
    return Decision(
        at=at or utcnow(),
        action=action,
        reason=reason,
        task_id=task_id,
        try_number=1 if task_id is not None else None,
        task_name=task_name,
        detail=f"{entry}: {detail}",
        actor=f"{socket.gethostname()}:{os.getpid()}",
    )
