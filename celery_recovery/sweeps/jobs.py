"""Dead jobs: processes whose heartbeat stopped are marked ``failed``; a dead beat is reported."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from celery_recovery.core.states import JobType
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.sweeps.second_opinion import ask
from celery_recovery.telemetry import metrics, sentry

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
    spared = _answering_workers(ctx, thresholds)
    for job in ctx.store.jobs.fail_dead_jobs(ctx.now, thresholds, spared):
        ctx.report.dead_jobs += 1
        report_dead_job(job, "it stopped heartbeating", ctx.now)


def _answering_workers(ctx: SweepContext, thresholds: dict[JobType, float]) -> set[str]:
    """Silent worker jobs whose worker answers over the broker: its main process (which
    answered), and the pool processes running one of the tries it holds.  Their ends
    wait: partitioned from the store, not dead (see :mod:`.second_opinion`)."""
    workers = {JobType.WORKER: thresholds[JobType.WORKER]}
    silent = ctx.store.jobs.silent_jobs(ctx.now, workers)
    if not silent:
        return set()
    answers = ask(ctx, (job.get("node_name") for job in silent), ())
    return {
        job["id"]
        for job in silent
        if answers.answered(job.get("node_name"))
        and (job.get("parent_pid") is None or answers.runs_in(job.get("node_name"), job["pid"]))
    }


def report_dead_job(job: dict[str, Any], how: str, now: datetime) -> None:
    """Count, alert and log a job a sweep or the marker watch marked failed (after the
    change committed)."""
    metrics.dead_job(job["job_type"])
    if job["job_type"] != JobType.WORKER:
        # A dead worker shows up as the zombies it leaves; a dead beat or triggerer
        # leaves nothing else behind to alert on.
        sentry.capture_dead_job(job, now)
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
