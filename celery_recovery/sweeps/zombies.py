"""Zombies: running tries whose worker stopped heartbeating.

Each zombie is first checked against the result backend (adoption): a
finished task takes its real outcome and is not run again; a task a live
worker reports as started is re-pointed to that worker; a task the worker
had already retried is marked ``up_for_retry``.  Only when nothing alive
knows the task is it reset (retried as the next try, or failed).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import states

from celery_recovery.core.audit import AuditAction, AuditReason
from celery_recovery.core.records import JobRow, SweepOutcome, ZombieRow
from celery_recovery.core.states import RETRY_RECONCILED_REASON, JobState, JobType, TaskState
from celery_recovery.messages.backend_probe import Probe
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.sweeps.parents import awaits_parent, parents_by_process
from celery_recovery.sweeps.probed import count_reset, decide_each
from celery_recovery.sweeps.resets import reset, take_backend_outcome
from celery_recovery.sweeps.second_opinion import leave_partitioned
from celery_recovery.sweeps.untold import fails_when_untold, untold_because
from celery_recovery.telemetry import metrics, sentry

logger = logging.getLogger("celery_recovery.sweep")


def sweep_zombies(ctx: SweepContext) -> None:
    settings = ctx.settings
    store = ctx.store
    zombies = _judged_here(ctx, store.try_recovery.find_zombies(ctx.now, settings.zombie_threshold))
    # A worker silent in the store but answering over the broker is partitioned, not dead.
    zombies = leave_partitioned(ctx, zombies, "zombie")
    if not zombies:
        return
    ctx.report.zombies += len(zombies)

    def counted(zombie: ZombieRow, action: str) -> None:
        metrics.sweep_action("zombie", action)
        sentry.capture_zombie(zombie, action, ctx.now)

    decide_each(ctx, zombies, "zombie", lambda z, seen, live: _handle(ctx, z, seen, live), counted)


def _judged_here(ctx: SweepContext, zombies: list[ZombieRow]) -> list[ZombieRow]:
    """The zombies whose death is not left to their worker's live main process."""
    if not any(z.get("job_parent_pid") is not None for z in zombies):
        return zombies
    settings = ctx.settings
    parents = parents_by_process(ctx.store.jobs.list_jobs(JobType.WORKER, JobState.RUNNING))
    return [
        z
        for z in zombies
        if not awaits_parent(
            z.get("job_hostname"),
            z.get("job_parent_pid"),
            z.get("job_heartbeat"),
            parents,
            ctx.now,
            settings,
            settings.zombie_threshold,
        )
    ]


def _handle(
    ctx: SweepContext, zombie: ZombieRow, seen: Probe, live: dict[tuple[Any, Any], JobRow]
) -> str | None:
    """Decide on one zombie; returns what was done (a :class:`SweepOutcome`) or None."""
    store = ctx.store
    task_id, try_number, job_id = zombie["task_id"], zombie["try_number"], zombie["job_id"]
    taken = take_backend_outcome(ctx, zombie, seen, TaskState.RUNNING, "worker lost")
    if taken is not None:
        return taken
    if seen.state == states.RETRY and _retry_recorded(ctx, task_id, try_number):
        reason = RETRY_RECONCILED_REASON
        if store.try_recovery.reconcile_try(
            task_id,
            try_number,
            TaskState.RUNNING,
            job_id,
            TaskState.UP_FOR_RETRY,
            reason,
            ctx.now,
            audit=ctx.decision(AuditAction.RECONCILED, AuditReason.WORKER_LOST, zombie, reason),
        ):
            ctx.report.reconciled += 1
            return SweepOutcome.RECONCILED
        return None
    owner = live.get((seen.hostname, seen.pid)) if seen.state == states.STARTED else None
    if owner is not None and owner["id"] != job_id and zombie.get("adopted_until") is None:
        # Celery stores STARTED before a task's before_start, so the STARTED may come
        # from a delivery that was then dropped as redundant: adopt with a deadline, which
        # the adopter's own claim of the try cancels; otherwise it is reset then.
        until = ctx.now + timedelta(seconds=ctx.settings.adoption_timeout)
        reason = (
            f"adopted by live job {owner['id']} ({seen.hostname}, pid {seen.pid}) "
            f"until {until.isoformat()}"
        )
        audit = ctx.decision(AuditAction.ADOPTED, AuditReason.WORKER_LOST, zombie, reason)
        if store.try_recovery.adopt_try(
            task_id, try_number, job_id, owner["id"], reason, ctx.now, until, audit
        ):
            ctx.report.adopted += 1
            return SweepOutcome.ADOPTED
        return None
    retry_never_sent = seen.state == states.RETRY
    if zombie.get("adopted_until") is not None:
        # The adopter never claimed the try: it is not running it.  The adopter itself
        # is alive, so its job is left alone.
        why, dead_job = f"adoption by job {job_id} expired without its claim", None
    else:
        why = (
            f"worker lost: job {job_id} ({zombie.get('job_hostname')}, pid "
            f"{zombie.get('job_pid')}) last heartbeat {zombie.get('job_heartbeat')}"
        )
        dead_job = job_id
    if retry_never_sent:
        why = (
            f"{why}; the result backend reads RETRY, but no try {try_number + 1} was ever "
            "recorded: the retry was never sent (a cold shutdown stores RETRY for the tasks "
            "it terminates)"
        )
    give_up = None
    untold = untold_because(ctx, zombie, seen)
    if untold is not None:
        why = f"{why}; {untold}"
        if fails_when_untold(ctx, zombie["task_name"]):
            give_up = "not run again: recovery_unknown_outcome is 'fail'"
        else:
            why = f"{why}, so it runs again in case it had not finished"
    result = reset(
        ctx,
        zombie,
        expected_state=TaskState.RUNNING,
        why=why,
        dead_job_id=dead_job,
        give_up=give_up,
    )
    return count_reset(ctx, result, "republished")


def _retry_recorded(ctx: SweepContext, task_id: str, try_number: int) -> bool:
    """Whether a later try of ``task_id`` was recorded: the RETRY the backend reads was a
    real retry, whose publisher records the next try within its flush interval, long
    before a zombie threshold has passed."""
    return any(t["try_number"] > try_number for t in ctx.store.tries.history(task_id))
