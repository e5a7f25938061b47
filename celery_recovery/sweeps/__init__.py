"""Recovery sweeps: zombies, orphan adoption, lost messages, dead jobs, failure callbacks."""

from .context import SweepReport
from .runner import run_sweep

__all__ = ["SweepReport", "run_sweep"]
