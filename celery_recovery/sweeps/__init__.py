"""Recovery sweeps: zombies, orphan adoption, lost messages, dead jobs, failure callbacks."""

from celery_recovery.core.records import SweepReport
from celery_recovery.sweeps.runner import run_sweep

__all__ = ["SweepReport", "run_sweep"]
