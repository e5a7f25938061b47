"""The sweep as a Celery task, for beat to run (see :mod:`celery_recovery.beat_schedules`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import sentry

if TYPE_CHECKING:
    from ..recovery import Recovery

SWEEP_TASK = "celery_recovery.sweep"


def register_sweep_task(recovery: Recovery) -> None:
    app = recovery.app

    @app.task(name=SWEEP_TASK, shared=False, ignore_result=True)
    def sweep() -> dict[str, Any]:
        """One recovery pass (celery-recovery); scheduled by beat."""
        report = recovery.sweep()
        # Only scheduled sweeps check in: the workers' fallback sweep must not
        # hide a stopped beat from the cron monitor.
        sentry.sweep_checkin(recovery.settings, report)
        return report.as_dict()
