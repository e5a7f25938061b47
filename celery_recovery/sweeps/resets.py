"""Reset a try whose worker or message was lost: retry it as the next try, or fail it.

The decision, the next try's record, the failure callback row and the dead
job all change in one transaction; the new message is published only after
that transaction committed, and only by the sweep that won it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from celery import states

from celery_recovery.core.audit import AuditAction, AuditReason
from celery_recovery.core.outbox import CallbackKind, CallbackPayload, OutboxRow, callback_row
from celery_recovery.core.records import ResetPlan, SweepOutcome
from celery_recovery.core.states import TaskState
from celery_recovery.messages.backend_probe import Probe
from celery_recovery.messages.dead_receives import republish_delay
from celery_recovery.messages.headers import ROUTE_KEYS
from celery_recovery.messages.republish import republish
from celery_recovery.store import MESSAGE_COLUMNS, unreadable
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.sweeps.probed import count_reset
from celery_recovery.sweeps.untold import untold_because

logger = logging.getLogger("celery_recovery.sweep")

#: Celery's own default for ``Task.max_retries``, used when the task is not
#: registered in the sweeping process.
CELERY_DEFAULT_MAX_RETRIES = 3

#: Columns copied from a try to the try that replaces it (an ETA task keeps its ETA).
_COPIED_COLUMNS = ("task_name", "eta", *MESSAGE_COLUMNS)
#: Columns a new publish is built from; all must have decoded as JSON.
_PAYLOAD_COLUMNS = ("args", "kwargs", "headers", "options")


def take_backend_outcome(
    ctx: SweepContext, record: Mapping[str, Any], seen: Probe, expected_state: TaskState, why: str
) -> str | None:
    """If the backend says the task finished, give the try that outcome.

    Returns None when the backend reports no outcome, else ``"reconciled"``
    or ``LOST_RACE`` (the try changed meanwhile).
    """
    outcome = {states.SUCCESS: TaskState.SUCCESS, states.FAILURE: TaskState.FAILED}.get(seen.state)
    if outcome is None:
        return None
    reason = f"reconciled: the result backend reports {seen.state} ({why})"
    if ctx.store.try_recovery.reconcile_try(
        record["task_id"],
        record["try_number"],
        expected_state,
        record.get("job_id"),
        outcome,
        reason,
        ctx.now,
        audit=ctx.decision(AuditAction.RECONCILED, _cause(expected_state, record), record, reason),
    ):
        ctx.report.reconciled += 1
        return SweepOutcome.RECONCILED
    ctx.report.races_lost += 1
    return SweepOutcome.LOST_RACE


def max_retries_of(ctx: SweepContext, task_name: str) -> int | None:
    task = ctx.app.tasks.get(task_name)
    if task is None:
        return CELERY_DEFAULT_MAX_RETRIES
    return task.max_retries


def reset(
    ctx: SweepContext,
    record: Mapping[str, Any],
    *,
    expected_state: TaskState,
    why: str,
    count_retries: bool = True,
    dead_job_id: str | None = None,
    publish_count: int = 1,
    cause: AuditReason | None = None,
    retry_limit: int | None = None,
    give_up: str | None = None,
    callback: bool = True,
    expected_reason: str | None = None,
) -> str:
    """Retry or fail one try; returns a :class:`SweepOutcome`: republished, failed or lost race.

    ``cause`` names the audit reason when the try's state does not tell it (a hung try);
    ``retry_limit`` bounds the retries of a task whose ``max_retries`` is None;
    ``give_up`` fails the try for that reason instead of running it again;
    ``callback=False`` writes no ``on_retry`` row (the worker that retried ran it);
    ``expected_reason`` is compared too, for a reset that leaves the state as it was.
    """
    try_number = int(record["try_number"])
    max_retries = max_retries_of(ctx, record["task_name"])
    bound = f"max_retries ({max_retries})"
    if max_retries is None and retry_limit is not None:
        max_retries, bound = retry_limit, f"the poison bound ({retry_limit} retries)"
    if give_up is not None:
        new_state, reason = TaskState.FAILED, f"{why}; {give_up}"
    elif unreadable(*(record.get(c) for c in _PAYLOAD_COLUMNS)):
        new_state = TaskState.FAILED
        reason = f"{why}; its stored message is not valid JSON, so it is not published again"
    elif not record.get("republishable", True):
        new_state, reason = TaskState.FAILED, f"{why}; {record.get('republish_error')}"
    elif count_retries and max_retries is not None and try_number > max_retries:
        new_state, reason = TaskState.FAILED, f"{why}; {bound} exceeded"
    elif publish_count > ctx.settings.max_republish + 1:
        new_state = TaskState.FAILED
        reason = f"{why}; published {publish_count - 1} times, never started"
    else:
        new_state, reason = TaskState.UP_FOR_RETRY, f"{why}; retried as try {try_number + 1}"
    next_record = None
    if new_state is TaskState.UP_FOR_RETRY:
        next_record = {c: record.get(c) for c in _COPIED_COLUMNS}
        next_record.update(
            task_id=record["task_id"],
            try_number=try_number + 1,
            state=TaskState.QUEUED.value,
            external_executor_id=record["task_id"],
            queued_at=ctx.now,
            updated_at=ctx.now,
            publish_count=publish_count,
            state_reason=f"published by the recovery sweep after try {try_number}",
        )
    plan = ResetPlan(
        task_id=record["task_id"],
        try_number=try_number,
        expected_state=expected_state,
        expected_job_id=record.get("job_id"),
        new_state=new_state,
        reason=reason,
        next_record=next_record,
        callback=_callback_row(ctx, record, new_state, reason) if callback else None,
        dead_job_id=dead_job_id,
        expected_reason=expected_reason,
        audit=ctx.decision(
            _ACTION[new_state], cause or _cause(expected_state, record), record, reason
        ),
    )
    won, inserted = ctx.store.try_recovery.apply_reset(plan, ctx.now)
    if not won:
        ctx.report.races_lost += 1
        logger.debug("celery-recovery: try %s/%s changed meanwhile", plan.task_id, try_number)
        return SweepOutcome.LOST_RACE
    logger.warning(
        "celery-recovery: task %s[%s] try %d %s",
        record["task_name"],
        record["task_id"],
        try_number,
        reason,
    )
    if new_state is TaskState.FAILED:
        return SweepOutcome.FAILED
    if inserted:
        # After the commit: a publish failure leaves the next try queued, and the
        # lost-message sweep publishes it once it is overdue.
        # A dead worker's receive may still be open on the broker (SQS): wait it out.
        delay = republish_delay(ctx.app) if dead_job_id is not None else 0
        republish(ctx.app, record, try_number + 1, delay)
    return SweepOutcome.REPUBLISHED


#: The audit action of a reset, by the state it gave the try.
_ACTION = {TaskState.UP_FOR_RETRY: AuditAction.REPUBLISHED, TaskState.FAILED: AuditAction.FAILED}


def _cause(expected_state: TaskState, record: Mapping[str, Any]) -> AuditReason:
    """Why a try in ``expected_state`` is being recovered: its worker or its message was lost."""
    if expected_state is TaskState.QUEUED:
        if record.get("reserved_by") is not None:
            return AuditReason.RESERVED_BY_DEAD_WORKER
        return AuditReason.MESSAGE_LOST
    if record.get("adopted_until") is not None:
        return AuditReason.ADOPTION_EXPIRED
    return AuditReason.WORKER_LOST


def _callback_row(
    ctx: SweepContext, record: Mapping[str, Any], new_state: TaskState, reason: str
) -> OutboxRow:
    headers = record.get("headers")
    route = (
        {k: headers[k] for k in ROUTE_KEYS if headers.get(k)}
        if isinstance(headers, Mapping)
        else {}
    )
    payload = CallbackPayload(
        task_name=record["task_name"],
        reason=reason,
        args=_readable(record.get("args"), []),
        kwargs=_readable(record.get("kwargs"), {}),
        job_id=record.get("job_id"),
        hostname=record.get("job_hostname") or record.get("worker_hostname"),
        # Where the failure reaches the caller when the backend replies to it (rpc://).
        reply_route=route,
    )
    kind: CallbackKind = "failure" if new_state is TaskState.FAILED else "retry"
    return callback_row(record["task_id"], int(record["try_number"]), kind, payload, ctx.now)


def _readable(value: Any, empty: Any) -> Any:
    """A payload for a callback row: ``empty`` when the stored one could not be decoded."""
    return empty if value is None or unreadable(value) else value


def republish_unstarted(
    ctx: SweepContext,
    record: Mapping[str, Any],
    seen: Probe,
    why: str,
    action: str,
    dead_job_id: str | None = None,
) -> str | None:
    """Publish again a ``queued`` try that never started (a lost message, a dead worker's
    reserved one), as the same try, its publish counted; returns what was done."""
    untold = untold_because(ctx, record, seen)
    if untold is not None:
        why = f"{why} in the store's records; {untold}"
    result = reset(
        ctx,
        record,
        expected_state=TaskState.QUEUED,
        why=why,
        count_retries=False,
        dead_job_id=dead_job_id,
        publish_count=int(record.get("publish_count") or 1) + 1,
    )
    return count_reset(ctx, result, action)
