"""Ready beat schedules and timing presets for celery-recovery."""

from .presets import PRESETS, preset_settings
from .schedule import recovery_beat_schedule

__all__ = ["PRESETS", "preset_settings", "recovery_beat_schedule"]
