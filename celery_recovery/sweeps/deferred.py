"""Deferred tasks nobody is waiting for: time out overdue triggers, warn about unserved queues.

A triggerer times out its own triggers.  When no live triggerer holds an
overdue trigger (none runs, or none serves its queue), the sweep fails the
task with a timeout after ``recovery_health_check_threshold`` of grace, so a
``defer(..., timeout=...)`` is kept even with no triggerer at all.
"""

from __future__ import annotations

import hashlib
import logging

from celery_recovery.core.log_once import LogOnce
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.triggerer.outcomes import OutcomeApplier, timed_out

logger = logging.getLogger("celery_recovery.sweep")

#: Seconds between two warnings about the same unserved queue, per process.
UNSERVED_WARNING_INTERVAL = 300.0
_unserved_warned = LogOnce(every=UNSERVED_WARNING_INTERVAL)


def sweep_deferred(ctx: SweepContext) -> None:
    settings = ctx.settings
    store = ctx.store
    threshold = settings.health_check_threshold
    # A holder name that fits the column and cannot be a triggerer's job id.
    owner = "sweep-" + hashlib.sha1(ctx.holder.encode()).hexdigest()[:26]
    applier = OutcomeApplier(ctx.context)
    for row in store.triggers.overdue_triggers(ctx.now, threshold, threshold):
        with ctx.isolated(f"overdue trigger {row['id']} of {row['task_id']}"):
            if not store.triggers.take_triggers([row["id"]], owner, row["triggerer_id"]):
                ctx.report.races_lost += 1
                continue
            row = {**row, "triggerer_id": owner}
            if applier.apply(owner, [timed_out(row)]):
                ctx.report.deferred_timeouts += 1
    _warn_unserved(ctx, store.triggers.waiting_queues(ctx.now, threshold))


def _warn_unserved(ctx: SweepContext, waiting: dict[str, int]) -> None:
    for queue, count in sorted(waiting.items()):
        ctx.report.unserved_triggers += count
        if not _unserved_warned.first(queue):
            continue
        logger.warning(
            "celery-recovery: %d deferred task(s) wait in trigger queue %r, which no live "
            "triggerer serves; start one: celery -A proj recovery triggerer --queues %s",
            count,
            queue,
            queue,
        )
