"""Typed records that cross layers: rows the store returns, writes the workers buffer,
what a sweep decides and reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, TypedDict

from celery_recovery.core.audit import Decision
from celery_recovery.core.outbox import OutboxRow
from celery_recovery.core.states import TaskState

#: Check-in of a finished sweep, clean or not, with its report: someone is watching (the
#: heartbeat grace, the console).
SWEEP_COMPLETION = "sweep"
#: Check-in of a sweep with no failing step: what the workers' fallback, `jobs check
#: --sweeps` and the console count.  A sweeper that runs but fails a step on every pass
#: (its result backend not set up, say) recovers nothing, and is not a sweeper.
CLEAN_SWEEP = "sweep-clean"


@dataclass
class SweepReport:
    """Counts of what one sweep pass found and did; ``duration`` in seconds."""

    zombies: int = 0
    #: Queued tries found reserved (received, not started) by a dead worker.
    reserved: int = 0
    reserved_republished: int = 0
    republished: int = 0
    failed: int = 0
    adopted: int = 0
    reconciled: int = 0
    lost_messages: int = 0
    lost_republished: int = 0
    #: Overdue queued tries ended ``revoked`` (revoked, expired or purged) instead.
    revoked: int = 0
    dead_jobs: int = 0
    #: Of the dead jobs, those found by their liveness markers before the threshold.
    marker_deaths: int = 0
    #: Tries left alone because their worker, silent in the store, answered over the
    #: broker and holds them (partitioned from the store, not dead).
    partitioned: int = 0
    callbacks_delivered: int = 0
    callbacks_failed: int = 0
    deferred_timeouts: int = 0
    unserved_triggers: int = 0
    races_lost: int = 0
    errors: int = 0
    #: The steps of this pass that failed (each once, in order): a sweep with any
    #: is not a clean one, and the workers' fallback does not count it.
    failing_steps: list[str] = field(default_factory=list)
    #: The first failure's exception, on one line ("AppRegistryNotReady: Apps aren't ...").
    first_error: str | None = None
    #: Seconds left in which no process is judged dead (after a gap in sweeping).
    heartbeat_grace: float = 0.0
    duration: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class WriteKind(StrEnum):
    """What a buffered write is; the write-behind writer applies runs of one kind together."""

    QUEUED = "queued"  # a publisher's record of a new try
    RUNNING = "running"  # a worker's claim of a try
    TRANSITION = "transition"  # a compare-and-set (a Transition)
    OUTBOXED = "outboxed"  # a transition with the callback row it makes due
    LATE = "late"  # an outcome reported after a sweep had recovered the try
    AUDIT = "audit"  # a Decision for the audit log
    RESERVED = "reserved"  # a message a worker received: (task_id, try, job_id, at)


#: Key of a ``running`` claim (a dict) that is completed when its batch is taken: the
#: writer's thread pops the callable stored there and calls it with the claim, which
#: by then holds the try's outcome if the task ended meanwhile (see
#: :func:`celery_recovery.messages.records.claim_from_request`).
COMPLETE_WHEN_WRITTEN = "_complete_when_written"


class SweepOutcome(StrEnum):
    """What a sweep did with one try."""

    REPUBLISHED = "republished"
    FAILED = "failed"
    ADOPTED = "adopted"
    RECONCILED = "reconciled"
    REVOKED = "revoked"
    #: Its worker's heartbeats stopped, but it answered over the broker and holds the try.
    PARTITIONED = "partitioned"
    #: The try changed under the sweep (another sweep, or its worker); nothing done.
    LOST_RACE = "lost race"


@dataclass(frozen=True)
class Transition:
    """One compare-and-set on a task try, as queued by the write-behind writer.

    ``try_number=None`` targets whichever try of the task is in an expected
    state (used where Celery does not say which try, e.g. a lost pool process).
    ``died_in_pid`` is only for a change that sends a try back to ``queued``.
    """

    task_id: str
    try_number: int | None
    expected: tuple[TaskState, ...]
    values: dict[str, Any] = field(default_factory=dict)
    #: The pool process (pid) whose death ends the run: the change applies only while
    #: the try is still that process's, and counts one of its deaths.
    died_in_pid: int | None = None

    @classmethod
    def ending(
        cls,
        task_id: str,
        try_number: int | None,
        expected: tuple[TaskState, ...],
        state: TaskState,
        reason: str | None,
        now: Any,
        **values: Any,
    ) -> Transition:
        """The compare-and-set that ends a try in ``state`` for ``reason`` at ``now``;
        ``values`` are more columns it sets (its ``error``)."""
        ended = {"state": state, "state_reason": reason, "ended_at": now, "updated_at": now}
        return cls(task_id, try_number, expected, {**ended, **values})


@dataclass(frozen=True)
class MissedRuns:
    """Runs of a beat entry that were not sent: how many, up to which scheduled time,
    and why (recorded with the entry's next claim, or alone)."""

    count: int
    up_to: datetime
    reason: str


@dataclass(frozen=True)
class OutboxedTransition:
    """A transition and the callback row it makes due, written in one transaction
    (the outbox): the row exists if and only if the transition won."""

    transition: Transition
    callback: OutboxRow


@dataclass(frozen=True)
class ResetPlan:
    """What a sweep decided for one zombie or lost try, applied in one transaction."""

    task_id: str
    try_number: int
    expected_state: TaskState
    expected_job_id: str | None
    new_state: TaskState
    reason: str
    next_record: dict[str, Any] | None = None
    callback: OutboxRow | None = None
    dead_job_id: str | None = None
    #: The audit row, written only when the reset wins.
    audit: Decision | None = None
    #: The try's reason must still be this one (a reset that leaves its state as it
    #: was: only the first of two sweeps wins it).
    expected_reason: str | None = None


class JobRow(TypedDict, total=False):
    """A ``jobs`` row: one process that takes part (worker process, beat, triggerer)."""

    id: str
    job_type: str
    hostname: str
    node_name: str | None
    pid: int
    state: str
    start_date: datetime
    end_date: datetime | None
    latest_heartbeat: datetime
    queues: str | None
    process_marker: str | None
    marker_lock: int | None
    marker_missing_since: datetime | None
    #: A worker main process's consumer state (see celery_recovery.core.consumer).
    consumer: dict[str, Any] | None


class TryRow(TypedDict, total=False):
    """A ``task_records`` row: one try of one task, with the message to publish it again."""

    task_id: str
    try_number: int
    task_name: str
    state: str
    queue: str | None
    exchange: str | None
    routing_key: str | None
    priority: int | None
    args: Any
    kwargs: Any
    headers: Any
    options: Any
    republishable: bool
    republish_error: str | None
    eta: datetime | None
    expires: datetime | None
    job_id: str | None
    worker_hostname: str | None
    worker_pid: int | None
    external_executor_id: str | None
    queued_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    updated_at: datetime
    state_reason: str | None
    error: str | None
    publish_count: int
    adopted_until: datetime | None
    recovered_at: datetime | None
    late_state: str | None
    late_at: datetime | None
    idempotency_key: str | None
    fencing_token: int | None
    deaths: int


class TriggerRow(TypedDict, total=False):
    """A ``triggers`` row: the trigger of one deferred try."""

    id: int
    classpath: str
    kwargs: Any
    task_id: str
    try_number: int
    method_name: str | None
    method_kwargs: Any
    queue: str | None
    timeout_at: datetime | None
    triggerer_id: str | None
    created_at: datetime
    claimed_at: datetime | None
    fired_at: datetime | None
    event_kind: str | None
    event: Any


class CallbackRow(TypedDict, total=False):
    """A ``callbacks`` row: a failure callback due for one try (the outbox)."""

    id: int
    task_id: str
    try_number: int
    kind: str
    payload: Any
    created_at: datetime
    claimed_by: str | None
    claimed_until: datetime | None
    attempts: int


class ZombieRow(TryRow, total=False):
    """A running try whose job stopped heartbeating, with what the store knows of that job."""

    job_heartbeat: datetime | None
    job_state: str | None
    job_hostname: str | None
    job_node_name: str | None
    job_pid: int | None
    job_parent_pid: int | None


class ReservedRow(ZombieRow, total=False):
    """A queued try whose message a dead worker job received and never started."""

    reserved_by: str


class BeatEntryRow(TypedDict, total=False):
    """One ``beat_entries`` row: a beat_schedule entry's state in the store."""

    name: str
    task: str
    schedule: str | None
    last_run_at: datetime
    total_run_count: int
    pending_run_at: datetime | None
    pending_task_id: str | None
    pending_token: int | None
    last_sent_run_at: datetime | None
    last_task_id: str | None
    last_sent_at: datetime | None
    missed_count: int
    last_missed_at: datetime | None
    last_missed_reason: str | None
    updated_at: datetime
