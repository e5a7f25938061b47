"""What a beat running celery_recovery.beat:Scheduler reports; cheap and never raising."""

from __future__ import annotations

from celery_recovery.telemetry.metrics import definitions as m
from celery_recovery.telemetry.metrics.record import quietly


@quietly
def beat_lead(taken: bool) -> None:
    """This beat took the lead (``taken``) or lost it."""
    m.BEAT_LEAD_CHANGES.labels("taken" if taken else "lost").inc()
    m.BEAT_LEADING.set(1 if taken else 0)


@quietly
def beat_runs(outcome: str, count: int = 1) -> None:
    """``count`` scheduled runs decided with ``outcome`` (one of BEAT_RUN_OUTCOMES)."""
    if outcome not in m.BEAT_RUN_OUTCOMES:
        raise ValueError(f"unknown beat run outcome {outcome!r}; known: {m.BEAT_RUN_OUTCOMES}")
    if count:
        m.BEAT_RUNS.labels(outcome).inc(count)
