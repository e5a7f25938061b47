"""The metadata store shared by workers, beats, triggerers and the CLI."""

from .store import OutboxedTransition, Store, Transition
from .sweep_ops import ResetPlan

__all__ = ["OutboxedTransition", "ResetPlan", "Store", "Transition"]
