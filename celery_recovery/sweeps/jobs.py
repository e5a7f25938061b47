"""Dead jobs: processes whose heartbeat stopped are marked ``failed``; a dead beat is reported."""

from __future__ import annotations

import logging
from typing import Any

from celery_recovery import metrics, sentry
from celery_recovery.core.states import JobType
from celery_recovery.sweeps.context import SweepContext

logger = logging.getLogger("celery_recovery.sweep")


def sweep_dead_jobs(ctx: SweepContext) -> None:
    settings = ctx.settings
    thresholds = {
        # Worker jobs are ended by the zombie sweep together with their tries;
        # only idle ones (no running try) are left for this pass.
        JobType.WORKER: settings.zombie_threshold,
        JobType.BEAT: settings.health_check_threshold,
        JobType.TRIGGERER: settings.health_check_threshold,
    }
    for job in ctx.store.jobs.fail_dead_jobs(ctx.now, thresholds):
        ctx.report.dead_jobs += 1
        report_dead_job(ctx, job, "it stopped heartbeating")


def report_dead_job(ctx: SweepContext, job: dict[str, Any], how: str) -> None:
    """Count, alert and log a job this sweep marked failed (after the change committed)."""
    metrics.dead_job(job["job_type"])
    if job["job_type"] != JobType.WORKER:
        # A dead worker shows up as the zombies it leaves; a dead beat or triggerer
        # leaves nothing else behind to alert on.
        sentry.capture_dead_job(job, ctx.now)
    log = logger.warning if job["job_type"] != JobType.WORKER else logger.info
    log(
        "celery-recovery: %s job %s on %s (pid %s) is dead: %s (last heartbeat %s); marked failed",
        job["job_type"],
        job["id"],
        job["hostname"],
        job["pid"],
        how,
        job["latest_heartbeat"],
    )
