"""The triggerer: runs deferred tasks' triggers on one asyncio loop per process."""

from .runner import Triggerer

__all__ = ["Triggerer"]
