"""Idempotency locks with fencing tokens (used by ``@recoverable``)."""

from celery_recovery.locks.redis_lock import ACQUIRED, DONE, HELD, Acquisition, IdempotencyLocks
from celery_recovery.locks.renewal import LeaseRenewer

__all__ = ["ACQUIRED", "DONE", "HELD", "Acquisition", "IdempotencyLocks", "LeaseRenewer"]
