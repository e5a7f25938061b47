"""Lost messages: queued tries no worker started within ``recovery_queued_timeout``.

A message can vanish between publisher and worker (a broker restart without
persistence, a purge made outside Celery, a transport that keeps
unacknowledged messages only in a worker's memory, a worker SIGKILLed holding
prefetched messages).  A try that was revoked, expired or purged through a
Recovery app ends ``revoked`` instead (:mod:`celery_recovery.sweeps.revocations`).  Only our
publish-time record can tell "still queued" from "lost": the result backend
reads ``PENDING`` for both.  For a later try the backend still shows what the
earlier try left there (``RETRY``, or ``STARTED`` by a process now dead), or
``DEFERRED`` for a resume published but never started, which say nothing
about this try either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import states

from celery_recovery.core.audit import AuditAction, AuditReason
from celery_recovery.core.records import SweepOutcome, TryRow
from celery_recovery.core.states import NEVER_RAN_REASON, TaskState
from celery_recovery.messages.backend_probe import Probe, never_started
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.sweeps.probed import decide_each
from celery_recovery.sweeps.resets import republish_unstarted, take_backend_outcome
from celery_recovery.sweeps.revocations import revoked_because
from celery_recovery.telemetry import metrics, sentry


def sweep_lost_messages(ctx: SweepContext) -> None:
    settings = ctx.settings
    lost = ctx.store.try_recovery.find_lost(
        ctx.now, settings.queued_timeout, settings.zombie_threshold
    )
    if not lost:
        return
    revocations: list[dict[str, Any]] | None = None
    with ctx.isolated("reading revocations"):
        # find_lost only returns tries queued before its cutoff: queued_at is set.
        since = min(r["queued_at"] or ctx.now for r in lost)
        revocations = ctx.store.revocations.revocations_for([r["task_id"] for r in lost], since)
    if revocations is None:
        return  # without them a revoked or purged task could be published again
    found = revocations

    def counted(record: TryRow, action: str) -> None:
        metrics.sweep_action("lost_message", action)
        if action != SweepOutcome.RECONCILED:  # a reconciled one ran: its message was not lost
            sentry.capture_lost_message(record, action, ctx.now)

    decide_each(
        ctx, lost, "queued", lambda r, seen, live: _handle(ctx, r, seen, live, found), counted
    )


def _handle(
    ctx: SweepContext,
    record: Mapping[str, Any],
    seen: Probe,
    live: dict[tuple[Any, Any], Any],
    revocations: list[dict[str, Any]],
) -> str | None:
    """Decide on one overdue queued try; returns what was done or None."""
    # Celery failed before this try's body and may have stored that failure once its
    # backend answered again: the body never ran, so the try is sent again, not failed.
    never_ran = seen.state == states.FAILURE and record.get("state_reason") == NEVER_RAN_REASON
    if not never_ran:
        taken = take_backend_outcome(
            ctx, record, seen, TaskState.QUEUED, "its start was not recorded"
        )
        if taken is not None:
            return taken
    if seen.state == states.REVOKED:
        return _revoke(ctx, record, "the result backend reports REVOKED")
    if not never_ran and not never_started(seen, live):
        return None  # started in a live worker: its own signals will catch up
    why = revoked_because(record, revocations, ctx.now)
    if why is not None:
        return _revoke(ctx, record, why)
    ctx.report.lost_messages += 1
    waited = int(ctx.settings.queued_timeout)
    since = _counted_from(record)
    lost = f"message lost: not started within {waited}s {since}"
    return republish_unstarted(ctx, record, seen, lost, "lost_republished")


def _revoke(ctx: SweepContext, record: Mapping[str, Any], why: str) -> str:
    """Give an overdue queued try the end its revoke, expiry or purge meant (compare-and-set).

    A delivery that still comes may claim it from there and run (see
    :mod:`celery_recovery.sweeps.revocations`).
    """
    reason = f"not published again: {why}"
    if ctx.store.try_recovery.reconcile_try(
        record["task_id"],
        record["try_number"],
        TaskState.QUEUED,
        record.get("job_id"),
        TaskState.REVOKED,
        reason,
        ctx.now,
        audit=ctx.decision(AuditAction.REVOKED, AuditReason.REVOKED, record, reason),
    ):
        ctx.report.revoked += 1
        return SweepOutcome.REVOKED
    ctx.report.races_lost += 1
    return SweepOutcome.LOST_RACE


def _counted_from(record: Mapping[str, Any]) -> str:
    """What the queued timeout ran from: a delayed task's ETA, not its publish."""
    eta, queued_at = record.get("eta"), record.get("queued_at")
    if eta is not None and (queued_at is None or eta > queued_at):
        return f"of its ETA {eta.isoformat(timespec='seconds')}"
    return "of being queued"
