"""Beat entries that run the recovery sweep."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery_recovery.core.presets import preset_settings
from celery_recovery.core.timeutils import seconds
from celery_recovery.sweeps.tasks import SWEEP_TASK


def recovery_beat_schedule(
    preset: str = "default", sweep_interval: float | timedelta | None = None
) -> dict[str, dict[str, Any]]:
    """Entries to merge into ``app.conf.beat_schedule``.

    The sweep runs every ``sweep_interval`` seconds (the preset's, unless
    given); use the same preset for ``recovery_preset`` so thresholds match::

        app.conf.recovery_preset = "kubernetes"
        app.conf.beat_schedule = {**app.conf.beat_schedule,
                                  **recovery_beat_schedule("kubernetes")}

    A sweep message not picked up within two intervals expires: a later one
    does the same work.
    """
    interval = (
        preset_settings(preset)["sweep_interval"]
        if sweep_interval is None
        else seconds(sweep_interval)
    )
    return {
        "celery-recovery-sweep": {
            "task": SWEEP_TASK,
            "schedule": interval,
            "options": {"expires": interval * 2},
        }
    }
