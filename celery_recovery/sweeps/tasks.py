"""The sweep as a Celery task, for beat to run (see :mod:`celery_recovery.beat_schedules`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_recovery.sweeps.runner import run_sweep
from celery_recovery.telemetry import sentry

if TYPE_CHECKING:
    from celery_recovery.runtime.context import RecoveryContext

SWEEP_TASK = "celery_recovery.sweep"


def register_sweep_task(context: RecoveryContext) -> None:
    app = context.app

    @app.task(name=SWEEP_TASK, shared=False, ignore_result=True)
    def sweep() -> dict[str, Any]:
        """One recovery pass (celery-recovery); scheduled by beat."""
        report = run_sweep(context)
        # Only scheduled sweeps check in: the workers' fallback sweep must not
        # hide a stopped beat from the cron monitor.
        sentry.sweep_checkin(context.settings, report)
        return report.as_dict()
