"""Small functions the sweeps, the store health and the locks call to count what happens.

Each is a counter increment or a gauge set: no I/O except, in multiprocess
mode, a write to a memory-mapped file.  None of them ever raises: a metrics
failure (a full disk under ``PROMETHEUS_MULTIPROC_DIR``, a bug) is logged
once and must not break a sweep or a user's task.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec

from celery_recovery.core.errors import StoreSchemaError, StoreUnavailableError
from celery_recovery.core.log_once import LogOnce
from celery_recovery.telemetry.metrics import definitions as m

if TYPE_CHECKING:
    from celery_recovery.core.records import SweepReport

logger = logging.getLogger("celery_recovery.metrics")

P = ParamSpec("P")
_failures = LogOnce()


def quietly(func: Callable[P, None]) -> Callable[P, None]:
    """Never let ``func`` raise; log its first failure with a traceback, later ones at debug."""
    name = func.__qualname__

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            func(*args, **kwargs)
        except Exception:
            logger.log(
                logging.WARNING if _failures.first(name) else logging.DEBUG,
                "celery-recovery: recording metric %s failed; carrying on without it",
                name,
                exc_info=True,
            )

    return wrapper


@quietly
def sweep_finished(report: SweepReport) -> None:
    """Count what one sweep pass found, from its report (one call per pass)."""
    m.SWEEP_DURATION.observe(report.duration)
    m.LAST_SWEEP.set(time.time())
    if not report.errors:
        m.LAST_CLEAN_SWEEP.set(time.time())
    for step in report.failing_steps:
        m.SWEEP_STEP_FAILURES.labels(step if step in m.SWEEP_STEPS else "other").inc()
    if report.zombies:
        m.ZOMBIES_FOUND.inc(report.zombies)
    if report.lost_messages:
        m.LOST_MESSAGES.inc(report.lost_messages)
    if report.races_lost:
        m.RACES_LOST.inc(report.races_lost)
    if report.errors:
        m.SWEEP_ERRORS.inc(report.errors)


@quietly
def sweep_action(cause: str, action: str) -> None:
    """A sweep changed a try: ``cause`` in CAUSES, ``action`` in ACTIONS."""
    m.SWEEP_ACTIONS.labels(cause, action).inc()


@quietly
def dead_job(job_type: str) -> None:
    m.DEAD_JOBS.labels(str(job_type)).inc()


@quietly
def marker_death(found_by: str, marker: str) -> None:
    """A job found dead by ``marker`` (MARKERS), by ``found_by`` (MARKER_FINDERS)."""
    m.MARKER_DEATHS.labels(found_by, marker).inc()


@quietly
def callback_outcome(kind: str, outcome: str) -> None:
    m.CALLBACKS.labels(kind, outcome).inc()


@quietly
def store_error(exc: BaseException) -> None:
    if isinstance(exc, StoreUnavailableError):
        kind = "unavailable"
    elif isinstance(exc, StoreSchemaError):
        kind = "schema"
    else:
        kind = "other"
    m.STORE_ERRORS_TOTAL.labels(kind).inc()


@quietly
def dropped_writes(count: int) -> None:
    m.DROPPED_WRITES.inc(count)


@quietly
def lock_acquisition(outcome: str) -> None:
    """One ``@recoverable`` acquisition: ``acquired``, ``held``, ``done`` or ``error``."""
    m.LOCK_ACQUISITIONS.labels(outcome).inc()


@quietly
def lease_lost() -> None:
    m.LEASES_LOST.inc()


@quietly
def consumer_stalled(stalled: bool) -> None:
    """A worker's consumer became stalled (``True``) or consumes again (``False``)."""
    if stalled:
        m.STALLED_CONSUMERS.inc()
    m.CONSUMERS_STALLED.set(1 if stalled else 0)
