"""The sweep as a Celery task, for beat to run (see :mod:`celery_recovery.beat_schedules`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..recovery import Recovery

SWEEP_TASK = "celery_recovery.sweep"


def register_sweep_task(recovery: Recovery) -> None:
    app = recovery.app

    @app.task(name=SWEEP_TASK, shared=False, ignore_result=True)
    def sweep() -> dict[str, Any]:
        """One recovery pass (celery-recovery); scheduled by beat."""
        return recovery.sweep().as_dict()
