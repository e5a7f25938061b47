"""Typed records that cross layers: what a sweep reports, what the store returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from celery_recovery.core.audit import Decision
from celery_recovery.core.states import TaskState


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
    callbacks_delivered: int = 0
    callbacks_failed: int = 0
    deferred_timeouts: int = 0
    unserved_triggers: int = 0
    races_lost: int = 0
    errors: int = 0
    #: Seconds left in which no process is judged dead (after a gap in sweeping).
    heartbeat_grace: float = 0.0
    duration: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CallbackStep(StrEnum):
    """A step of a failure callback that its outbox row may say was already taken
    (``payload["done"]``), so that delivery does not take it twice."""

    RESULT_BACKEND = "result backend"
    FAILURE_SIGNAL = "task_failure signal"


@dataclass(frozen=True)
class Transition:
    """One compare-and-set on a task try, as queued by the write-behind writer.

    ``try_number=None`` targets whichever try of the task is in an expected
    state (used where Celery does not say which try, e.g. a lost pool process).
    """

    task_id: str
    try_number: int | None
    expected: tuple[TaskState, ...]
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OutboxedTransition:
    """A transition and the callback row it makes due, written in one transaction
    (the outbox): the row exists if and only if the transition won."""

    transition: Transition
    callback: dict[str, Any]


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
    callback: dict[str, Any] | None = None
    dead_job_id: str | None = None
    #: The audit row, written only when the reset wins.
    audit: Decision | None = None
