"""Sentry: zombies, lost messages and dead beats as events; cron check-ins of sweep and triggerer.

Active only when ``sentry-sdk`` is installed (``pip install
'celery-recovery[sentry]'``) and initialised in the process
(``sentry_sdk.init(dsn=...)``, e.g. where the Celery app is configured);
otherwise every function here returns at once.

- Each try a sweep changed because its worker was lost (a zombie) or its
  message was lost is captured as a ``warning`` event with the task name,
  id, try, worker host and heartbeat age, grouped into one issue per task
  name and kind.
- A beat or triggerer whose heartbeat stopped is captured the same way.
- Scheduled sweeps (beat's sweep task, ``celery-recovery sweep``) check in
  to the cron monitor :data:`SWEEP_MONITOR`, the triggerer to
  :data:`TRIGGERER_MONITOR`; Sentry creates the monitors from the first
  check-in and alerts when check-ins stop.  The workers' fallback sweep
  does not check in, so a stopped beat is alerted even while workers cover
  for it.

Events are sent by the SDK's background thread; nothing here waits on the
network, and nothing here ever raises into a sweep.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_recovery.core.records import SweepReport
    from celery_recovery.core.settings import RecoverySettings

logger = logging.getLogger("celery_recovery.sentry")

#: Cron monitor of scheduled sweeps (beat's sweep task, ``celery-recovery sweep``).
SWEEP_MONITOR = "celery-recovery-sweep"
#: Cron monitor of triggerer processes.
TRIGGERER_MONITOR = "celery-recovery-triggerer"
#: Seconds between two check-ins of one monitor from one process: sweeps run
#: every few seconds, Sentry's schedules count in minutes.
CHECKIN_PERIOD = 60.0

_last_checkin: dict[str, float] = {}
_checkin_lock = threading.Lock()


def active() -> bool:
    """True when sentry-sdk is installed and initialised in this process."""
    # Initialised means imported: a process that never imported sentry-sdk is not
    # asked to.  Importing it costs up to a second (it imports gevent and eventlet,
    # when installed, to see whether they patched the process), which would land on a
    # sweep's first action in every process, or on a triggerer's event loop.
    sentry_sdk = sys.modules.get("sentry_sdk")
    if sentry_sdk is None:
        return False
    try:
        return bool(sentry_sdk.get_client().is_active())
    except Exception:
        return False


def capture_zombie(record: Mapping[str, Any], action: str, now: datetime) -> None:
    """A sweep changed the running try ``record`` (from ``find_zombies``) whose worker was lost."""
    heartbeat = record.get("job_heartbeat")
    _capture(
        "zombie",
        f"Zombie task {record.get('task_name')}: its worker stopped heartbeating",
        record,
        {
            "action": action,
            "worker_host": record.get("job_hostname"),
            "worker_node": record.get("job_node_name"),
            "worker_pid": record.get("job_pid"),
            "job_id": record.get("job_id"),
            "heartbeat_age_seconds": _age(now, heartbeat),
        },
    )


def capture_lost_message(record: Mapping[str, Any], action: str, now: datetime) -> None:
    """A sweep published again (or failed) the queued try ``record`` no worker ever started."""
    _capture(
        "lost_message",
        f"Lost message of task {record.get('task_name')}: queued but never started",
        record,
        {
            "action": action,
            "queue": record.get("queue"),
            "queued_age_seconds": _age(now, record.get("queued_at")),
            "times_published": record.get("publish_count") or 1,
            # No worker ever ran it: there is no worker host or heartbeat to report.
            "worker_host": None,
            "heartbeat_age_seconds": None,
        },
    )


def capture_dead_job(job: Mapping[str, Any], now: datetime) -> None:
    """A beat or triggerer stopped heartbeating and a sweep marked it failed."""
    job_type = str(job.get("job_type"))
    _capture(
        f"dead_{job_type}",
        f"celery-recovery {job_type} on {job.get('hostname')} stopped heartbeating",
        {},
        {
            "job_id": job.get("id"),
            "worker_host": job.get("hostname"),
            "pid": job.get("pid"),
            "heartbeat_age_seconds": _age(now, job.get("latest_heartbeat")),
        },
        group=job_type,
    )


def sweep_checkin(settings: RecoverySettings, report: SweepReport) -> None:
    """Check in to :data:`SWEEP_MONITOR` after a scheduled sweep (``error`` if it had errors)."""
    checkin(
        SWEEP_MONITOR,
        "error" if report.errors else "ok",
        interval=settings.sweep_interval,
        margin=3 * settings.sweep_interval,
        duration=report.duration,
    )


def triggerer_checkin(settings: RecoverySettings, ok: bool = True) -> None:
    """Check in to :data:`TRIGGERER_MONITOR`; call it on every pass of the triggerer's loop."""
    checkin(
        TRIGGERER_MONITOR,
        "ok" if ok else "error",
        interval=settings.heartbeat_interval,
        margin=settings.health_check_threshold,
    )


def checkin(
    slug: str, status: str, *, interval: float, margin: float, duration: float | None = None
) -> None:
    """Send a cron check-in for ``slug`` at most every :data:`CHECKIN_PERIOD` seconds.

    The monitor is created or updated from ``monitor_config``: an interval
    schedule of ``interval`` seconds (rounded up to Sentry's whole minutes)
    and a grace of ``margin`` seconds before a missed check-in alerts.
    """
    if not active():
        return
    with _checkin_lock:
        last = _last_checkin.get(slug)
        if last is not None and time.monotonic() - last < CHECKIN_PERIOD:
            return
        _last_checkin[slug] = time.monotonic()
    try:
        from sentry_sdk.crons import capture_checkin

        capture_checkin(
            monitor_slug=slug,
            status=status,
            duration=duration,
            monitor_config={
                "schedule": {
                    "type": "interval",
                    "value": _minutes(max(interval, CHECKIN_PERIOD)),
                    "unit": "minute",
                },
                "checkin_margin": _minutes(margin),
                # One failed sweep (a flaky probe) is not worth an alert; two in a row are.
                "failure_issue_threshold": 2,
            },
        )
    except Exception as exc:
        logger.debug("celery-recovery: Sentry check-in %s failed: %s", slug, exc)


def _capture(
    kind: str,
    message: str,
    record: Mapping[str, Any],
    details: dict[str, Any],
    group: str | None = None,
) -> None:
    if not active():
        return
    try:
        import sentry_sdk

        task_name = str(record.get("task_name") or "")
        context = {
            "task_name": task_name or None,
            "task_id": record.get("task_id"),
            "try_number": record.get("try_number"),
            **details,
        }
        with sentry_sdk.new_scope() as scope:
            scope.set_level("warning")
            scope.fingerprint = ["celery-recovery", kind, group or task_name]
            scope.set_tag("celery_recovery.kind", kind)
            for tag in ("task_name", "task_id", "try_number", "action", "worker_host"):
                if context.get(tag) is not None:
                    scope.set_tag(f"celery_recovery.{tag}", str(context[tag]))
            scope.set_context("celery_recovery", context)
            # No stack: the sweep's says nothing about the task, and its frames' local
            # variables hold the store's URL and the task's arguments.  (An event that
            # names its own, empty, threads gets none attached: sentry-sdk 3 attaches
            # one to every message by default.)
            sentry_sdk.capture_event(
                {"message": message, "level": "warning", "threads": {"values": []}}
            )
    except Exception as exc:
        logger.debug("celery-recovery: capturing a %s event in Sentry failed: %s", kind, exc)


def _age(now: datetime, then: datetime | None) -> float | None:
    return round((now - then).total_seconds(), 3) if then is not None else None


def _minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))
