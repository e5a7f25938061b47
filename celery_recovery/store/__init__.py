"""The metadata store shared by workers, beats, triggerers and the CLI."""

from .store import Store, Transition

__all__ = ["Store", "Transition"]
