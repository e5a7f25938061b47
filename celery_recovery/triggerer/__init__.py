"""The triggerer: runs deferred tasks' triggers on one asyncio loop per process."""

from celery_recovery.triggerer.runner import Triggerer

__all__ = ["Triggerer"]
