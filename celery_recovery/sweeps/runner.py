"""One sweep pass: zombies, lost messages, dead jobs, deferred tasks, then failure callbacks."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from .. import metrics
from ..timeutils import utcnow
from .callbacks import deliver_callbacks
from .context import SweepContext, SweepReport
from .deferred import sweep_deferred
from .jobs import sweep_dead_jobs
from .lost_messages import sweep_lost_messages
from .zombies import sweep_zombies

if TYPE_CHECKING:
    from ..recovery import Recovery

logger = logging.getLogger("celery_recovery.sweep")

#: Name under which a finished sweep is recorded (read by the workers' fallback).
SWEEP_COMPLETION = "sweep"

STEPS: tuple[tuple[str, Callable[[SweepContext], None]], ...] = (
    ("zombies", sweep_zombies),
    ("lost messages", sweep_lost_messages),
    ("dead jobs", sweep_dead_jobs),
    ("deferred tasks", sweep_deferred),
    ("callbacks", deliver_callbacks),
)


def run_sweep(recovery: Recovery, now: datetime | None = None) -> SweepReport:
    """Run every sweep step once; never raises because of data or a store error."""
    started = time.perf_counter()
    report = SweepReport()
    holder = f"{socket.gethostname()}:{os.getpid()}"
    ctx = SweepContext(recovery, now or utcnow(), report, holder)
    for name, step in STEPS:
        with ctx.isolated(f"the {name} step"):
            step(ctx)
    with ctx.isolated("recording the sweep's completion"):
        recovery.store.mark_completed(SWEEP_COMPLETION, utcnow())
    with ctx.isolated("reading the gauges of metrics"):
        metrics.refresh_gauges(recovery.store, ctx.now)
    report.duration = time.perf_counter() - started
    metrics.sweep_finished(report)
    if report.errors or report.zombies or report.lost_messages or report.dead_jobs:
        logger.info("celery-recovery: sweep %s", report.as_dict())
    return report
