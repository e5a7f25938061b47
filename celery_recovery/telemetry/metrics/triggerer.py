"""What the triggerer process reports; it calls these, cheap and never raising."""

from __future__ import annotations

import contextlib

from celery_recovery.telemetry.metrics import definitions as m
from celery_recovery.telemetry.metrics.record import quietly


@quietly
def triggers_running(triggerer_id: str, count: int) -> None:
    """Set how many triggers the triggerer job ``triggerer_id`` runs now."""
    m.TRIGGERS_RUNNING.labels(triggerer_id).set(count)


@quietly
def triggerer_stopped(triggerer_id: str) -> None:
    """Drop the triggerer's series, so a stopped triggerer does not linger at its last count."""
    with contextlib.suppress(KeyError):  # it never reported any
        m.TRIGGERS_RUNNING.remove(triggerer_id)


@quietly
def trigger_event(kind: str) -> None:
    """A trigger finished: ``kind`` is one of TRIGGER_EVENT_KINDS.

    ``resumed``: a ``TriggerEvent`` published the task to resume on a worker;
    ``succeeded`` / ``failed``: a ``TaskSuccessEvent`` / ``TaskFailedEvent``
    completed the task with no worker; ``timed_out``: the trigger's timeout
    passed; ``error``: the trigger raised.
    """
    if kind not in m.TRIGGER_EVENT_KINDS:
        raise ValueError(f"unknown trigger event kind {kind!r}; known: {m.TRIGGER_EVENT_KINDS}")
    m.TRIGGER_EVENTS.labels(kind).inc()


@quietly
def blocked_loop() -> None:
    """The triggerer's event loop was blocked longer than allowed (logged by the caller)."""
    m.BLOCKED_LOOP.inc()
