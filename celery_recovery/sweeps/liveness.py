"""Dead processes, found by their liveness markers before the zombie threshold.

Runs before the zombie step: a job found dead here is marked ``failed``,
and the zombie step then recovers its running tries in the same pass.

- Process marker, checked on the job's own host: gone means dead.  A process
  id cannot come back to life, so one look is enough.
- Advisory lock, checked in ``pg_locks``: missing means the holder's
  connection ended.  A live holder takes its lock again within a moment of
  losing it (a server restart, a terminated session), so a missing lock
  counts only when two sweeps at least :data:`CONFIRM_AFTER` apart saw it
  missing.

Either way the job must also be late: no heartbeat for more than one
interval (two for the lock, which a live holder whose connection was cut
also misses for a moment).  A paused, busy or partitioned process keeps its
markers and is judged by the threshold, exactly as without markers.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from celery_recovery.liveness import Verdict
from celery_recovery.liveness.job import uses_lock_marker
from celery_recovery.liveness.process import check_process
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.sweeps.jobs import report_dead_job
from celery_recovery.sweeps.parents import awaits_parent, parents_by_process
from celery_recovery.telemetry import metrics

logger = logging.getLogger("celery_recovery.sweep")

#: Seconds a lock must have been seen missing before it counts (at least): a live
#: holder reconnects within RECONNECT_DELAY of the store answering, and a sweep
#: happens rarely more often than this.
CONFIRM_AFTER = 2.0
PROCESS_GONE = "its process is gone"
LOCK_GONE = "its liveness lock is gone"


def sweep_dead_processes(ctx: SweepContext) -> None:
    settings = ctx.settings
    if settings.liveness_markers == "off":
        return
    store = ctx.store
    marked = store.liveness.marked_jobs()
    if not marked:
        return
    check_locks = uses_lock_marker(settings) and any(j["marker_lock"] for j in marked)
    held = store.liveness.held_marker_locks() if check_locks else set()
    late_before = ctx.now - timedelta(seconds=settings.heartbeat_interval)
    confirm = timedelta(seconds=max(CONFIRM_AFTER, settings.heartbeat_interval / 2))
    parents = parents_by_process(marked)
    for job in marked:
        with ctx.isolated(f"the liveness markers of job {job['id']}"):
            how = _judge(ctx, job, held if check_locks else None, late_before, confirm)
            if how is not None and awaits_parent(
                job["hostname"],
                job["parent_pid"],
                job["latest_heartbeat"],
                parents,
                ctx.now,
                settings,
                settings.heartbeat_interval,
            ):
                continue  # its worker's main process records the death (sweeps/parents.py)
            if how is not None and store.liveness.fail_job_if_silent(
                job["id"], job["latest_heartbeat"], ctx.now
            ):
                ctx.report.dead_jobs += 1
                ctx.report.marker_deaths += 1
                metrics.marker_death("sweep", "process" if how == PROCESS_GONE else "lock")
                report_dead_job(job, how, ctx.now)


def _judge(
    ctx: SweepContext,
    job: dict[str, Any],
    held: set[int] | None,
    late_before: datetime,
    confirm: timedelta,
) -> str | None:
    """Why the job is dead now, or None to leave it to the threshold."""
    late = job["latest_heartbeat"] < late_before
    process = check_process(job["process_marker"], job["pid"])
    if process == Verdict.GONE:
        return PROCESS_GONE if late else None
    if process == Verdict.PRESENT or held is None or job["marker_lock"] is None:
        return None
    store = ctx.store
    missing_since = job["marker_missing_since"]
    if job["marker_lock"] in held:
        if missing_since is not None:
            store.liveness.note_marker_present(job["id"])
        return None
    if missing_since is None:
        store.liveness.note_marker_missing(job["id"], ctx.now)
        return None
    # A missing lock may also be a cut connection the holder is taking back: the job
    # must have missed a whole beat, not only be a moment behind its next one.
    silent = job["latest_heartbeat"] < late_before - timedelta(
        seconds=ctx.settings.heartbeat_interval
    )
    if silent and ctx.now - missing_since >= confirm:
        return LOCK_GONE
    return None
