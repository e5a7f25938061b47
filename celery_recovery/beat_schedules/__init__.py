"""Ready-made timings (and, with the sweeps, beat schedules) for celery-recovery."""

from .presets import PRESETS, preset_settings

__all__ = ["PRESETS", "preset_settings"]
