"""Retries that never came: a try left ``up_for_retry`` by a decision of ours whose next
try never appeared gets one, so no try stays a dead end.

The zombie step makes a dead worker's try ``up_for_retry`` when the result backend
reads RETRY: the worker had retried it, and its retry published the next try.
Celery 5.5.3 stores RETRY on a cold shutdown's running task without publishing
anything, and the try's own message, restored to the queue, is then dropped as
stale: nothing would ever run the task again.  So once ``recovery_queued_timeout``
has passed since that decision (the age at which a queued message counts as lost:
a next try's message may wait in a queue that long, or for its countdown) with no
later try recorded, the next try is published, as the lost-message step would,
and the audit log says why.  Its ``on_retry`` is not run again: the retry that
was stored ran it, or there was none to run.
"""

from __future__ import annotations

from celery_recovery.core.audit import AuditReason
from celery_recovery.core.states import RETRY_RECONCILED_REASON, TaskState
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.sweeps.probed import count_reset
from celery_recovery.sweeps.resets import reset
from celery_recovery.telemetry import metrics


def sweep_retries_never_sent(ctx: SweepContext) -> None:
    timeout = ctx.settings.queued_timeout
    for record in ctx.store.try_recovery.find_retries_never_sent(ctx.now, timeout):
        with ctx.isolated(f"retry never sent {record['task_id']}/{record['try_number']}"):
            ctx.report.lost_messages += 1
            next_try = int(record["try_number"]) + 1
            result = reset(
                ctx,
                record,
                expected_state=TaskState.UP_FOR_RETRY,
                why=(
                    f"no try {next_try} appeared within {int(timeout)}s of the result "
                    "backend's RETRY (the retry was never sent)"
                ),
                count_retries=False,
                cause=AuditReason.MESSAGE_LOST,
                callback=False,
                expected_reason=RETRY_RECONCILED_REASON,
            )
            action = count_reset(ctx, result, "lost_republished")
            if action in metrics.definitions.ACTIONS:
                metrics.sweep_action("lost_message", action)
