"""One sweep pass: zombies and their reserved messages, lost messages, dead jobs, deferred
tasks, then failure callbacks."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from celery_recovery.core.records import CLEAN_SWEEP, SWEEP_COMPLETION, SweepReport
from celery_recovery.sweeps.callbacks import deliver_callbacks
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.sweeps.dead_ends import sweep_retries_never_sent
from celery_recovery.sweeps.deferred import sweep_deferred
from celery_recovery.sweeps.jobs import sweep_dead_jobs
from celery_recovery.sweeps.liveness import sweep_dead_processes
from celery_recovery.sweeps.lost_messages import sweep_lost_messages
from celery_recovery.sweeps.reserved import sweep_reserved
from celery_recovery.sweeps.zombies import sweep_zombies
from celery_recovery.telemetry import metrics

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext

logger = logging.getLogger("celery_recovery.sweep")

#: Name under which the end of a heartbeat grace period is recorded.
HEARTBEAT_GRACE = "heartbeat-grace"

#: Steps that judge processes dead from their heartbeats; they wait out a grace.
JUDGING_STEPS = frozenset({"dead processes", "zombies", "reserved", "dead jobs"})

STEPS: tuple[tuple[str, Callable[[SweepContext], None]], ...] = (
    # First: the zombie step then recovers the running tries of the processes it finds.
    ("dead processes", sweep_dead_processes),
    ("zombies", sweep_zombies),
    # Right after the zombies: a dead worker's reserved messages go with its running tries.
    ("reserved", sweep_reserved),
    ("lost messages", sweep_lost_messages),
    ("retries never sent", sweep_retries_never_sent),
    ("dead jobs", sweep_dead_jobs),
    ("deferred tasks", sweep_deferred),
    ("callbacks", deliver_callbacks),
)


def run_sweep(context: RecoveryContext, now: datetime | None = None) -> SweepReport:
    """Run every sweep step once; never raises because of data or a store error."""
    started = time.perf_counter()
    report = SweepReport()
    if now is None:
        try:
            # Judge heartbeats, leases and ages on the store's clock, as they were written.
            context.store.follow_clock()
        except Exception as exc:  # the steps below fail too, and report it
            logger.debug("celery-recovery: could not read the store's clock: %s", exc)
    holder = f"{socket.gethostname()}:{os.getpid()}"
    ctx = SweepContext(context, now or context.clock(), report, holder)
    with ctx.isolated("checking for a gap in sweeping"):
        report.heartbeat_grace = _heartbeat_grace(ctx)
    for name, step in STEPS:
        if name in JUDGING_STEPS and report.heartbeat_grace > 0:
            continue
        ctx.step = name
        with ctx.isolated(f"the {name} step"):
            step(ctx)
    ctx.step = None
    report.duration = time.perf_counter() - started
    with ctx.isolated("recording the sweep's completion"):
        finished = context.clock()
        context.store.checkins.mark_completed(SWEEP_COMPLETION, finished, report.as_dict())
        if not report.errors:
            context.store.checkins.mark_completed(CLEAN_SWEEP, finished)
    with ctx.isolated("reading the gauges of metrics"):
        metrics.refresh_gauges(context.store, ctx.now, context.settings)
    report.duration = time.perf_counter() - started
    metrics.sweep_finished(report)
    found = report.zombies + report.reserved + report.lost_messages + report.dead_jobs
    if report.errors or found:
        logger.info("celery-recovery: sweep %s", report.as_dict())
    return report


def _heartbeat_grace(ctx: SweepContext) -> float:
    """Seconds left during which no process may be judged dead from its heartbeat.

    When no sweep finished for longer than the zombie threshold, nobody was
    watching, and most likely the store was down: every heartbeat is old
    because no process could write it, not because they all died.  Judging
    at once would retry tasks that still run.  So the first sweep after such
    a gap starts a grace of two heartbeat intervals (heartbeats are tried
    every interval even during an outage), in which every live process that
    reaches the store beats again; those still silent after it are dead.
    """
    store = ctx.store
    settings = ctx.settings
    # Wall-clock time, like the completions it is compared with (a caller may
    # sweep "as of" another time).
    now = ctx.context.clock()
    grace_until = store.checkins.last_completed(HEARTBEAT_GRACE)
    if grace_until is not None and now < grace_until:
        return (grace_until - now).total_seconds()
    last = store.checkins.last_completed(SWEEP_COMPLETION)
    if last is None or (now - last).total_seconds() <= settings.zombie_threshold:
        return 0.0
    grace = 2 * settings.heartbeat_interval
    grace_until = now + timedelta(seconds=grace)
    store.checkins.mark_completed(HEARTBEAT_GRACE, grace_until)
    logger.warning(
        "celery-recovery: no sweep finished for %.0fs (the store was down, or nothing swept); "
        "no process is judged dead from its heartbeat until %s, so live ones can beat again",
        (now - last).total_seconds(),
        grace_until.isoformat(timespec="seconds"),
    )
    return grace
