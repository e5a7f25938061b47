"""Reserved messages of dead workers: published again in the same sweep as their running tries.

A worker holds more messages than it runs: prefetched ones (``worker_prefetch
_multiplier``, 4 by default) and ETA or countdown tasks waiting for their
time.  When the whole worker dies, the broker keeps them as unacknowledged
(Redis restores them only after its visibility timeout, an hour by default).
Each was recorded as reserved by the worker's job (see
:mod:`..signals.reservations`), so once that job is dead its tries that never
started are checked against the result backend and published again as the
next try, keeping their ETA.  The broker's own copy, if it ever comes back, is
dropped at the worker as superseded.  Messages no worker took stay with the
lost-message sweep and ``recovery_queued_timeout``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_recovery.core.states import TaskState
from celery_recovery.messages.backend_probe import Probe, never_started
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.sweeps.probed import decide_each
from celery_recovery.sweeps.resets import republish_unstarted, take_backend_outcome
from celery_recovery.sweeps.second_opinion import leave_partitioned
from celery_recovery.telemetry import metrics


def sweep_reserved(ctx: SweepContext) -> None:
    settings = ctx.settings
    reserved = ctx.store.reservations.find_reserved_by_dead_jobs(ctx.now, settings.zombie_threshold)
    # A worker silent in the store but answering over the broker still holds them.
    reserved = leave_partitioned(ctx, reserved, "reserved", job_key="reserved_by")
    if not reserved:
        return
    ctx.report.reserved += len(reserved)
    decide_each(
        ctx,
        reserved,
        "reserved",
        lambda record, seen, live: _handle(ctx, record, seen, live),
        # No Sentry event per message: the dead worker is reported once, as a zombie or
        # a dead job.
        lambda record, action: metrics.sweep_action("reserved", action),
    )


def _handle(
    ctx: SweepContext, record: Mapping[str, Any], seen: Probe, live: dict[tuple[Any, Any], Any]
) -> str | None:
    """Decide on one reserved try of a dead job; returns what was done or None."""
    why = (
        f"reserved by dead worker job {record['reserved_by']} ({record.get('job_hostname')}, "
        f"pid {record.get('job_pid')}), last heartbeat {record.get('job_heartbeat')}; never started"
    )
    taken = take_backend_outcome(ctx, record, seen, TaskState.QUEUED, why)
    if taken is not None:
        return taken
    if not never_started(seen, live):
        return None  # started in a live worker: its own signals will catch up
    return republish_unstarted(
        ctx, record, seen, why, "reserved_republished", dead_job_id=record["reserved_by"]
    )
