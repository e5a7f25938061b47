"""Idempotency locks with fencing tokens (used by ``@recoverable``)."""

from .redis_lock import ACQUIRED, DONE, HELD, Acquisition, IdempotencyLocks
from .renewal import LeaseRenewer

__all__ = ["ACQUIRED", "DONE", "HELD", "Acquisition", "IdempotencyLocks", "LeaseRenewer"]
