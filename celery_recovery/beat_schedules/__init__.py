"""Ready beat schedules and timing presets for celery-recovery."""

from celery_recovery.beat_schedules.schedule import recovery_beat_schedule
from celery_recovery.core.presets import PRESETS, preset_settings

__all__ = ["PRESETS", "preset_settings", "recovery_beat_schedule"]
