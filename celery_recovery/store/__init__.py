"""The metadata store shared by workers, beats, triggerers and the CLI."""

from .store import Store, Transition
from .sweep_ops import ResetPlan

__all__ = ["ResetPlan", "Store", "Transition"]
