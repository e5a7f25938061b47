"""Keep the leases of the tasks running in this process alive, in one round trip per tick.

A daemon thread per process renews every lease it holds every third of the
shortest lease; when the process dies renewal stops and the leases expire.
A lease found lost (expired during a long pause, taken by a newer attempt)
is dropped with a warning: the body's fencing token is now stale.
"""

from __future__ import annotations

import logging
import threading

from celery_recovery.locks.redis_lock import IdempotencyLocks
from celery_recovery.telemetry import metrics

logger = logging.getLogger("celery_recovery.locks")


class LeaseRenewer:
    def __init__(self, locks: IdempotencyLocks) -> None:
        self.locks = locks
        self._held: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, key: str, value: str, ttl: float) -> None:
        with self._lock:
            self._held[key] = (value, ttl)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-recovery-leases", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def drop(self, key: str) -> None:
        with self._lock:
            self._held.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                ttls = [ttl for _, ttl in self._held.values()]
            self._wake.wait(min(ttls, default=30.0) / 3)
            self._wake.clear()
            # Read the leases after the wait: one dropped meanwhile (its task ended and
            # released the key) must not be renewed, nor reported lost.
            with self._lock:
                leases = [(k, v, ttl) for k, (v, ttl) in self._held.items()]
            if not leases:
                continue
            try:
                held = self.locks.renew_many(leases)
            except Exception as exc:
                logger.warning("celery-recovery: could not renew %d lease(s): %s", len(leases), exc)
                continue
            for (key, value, _), still in zip(leases, held, strict=True):
                if not still and self._drop_if_held(key, value):
                    metrics.lease_lost()
                    logger.warning(
                        "celery-recovery: lease on idempotency key %r (%s) was lost; "
                        "a newer attempt may hold it",
                        key,
                        value,
                    )

    def _drop_if_held(self, key: str, value: str) -> bool:
        """Drop ``key`` if this process still holds it as ``value``; whether it did."""
        with self._lock:
            if self._held.get(key, (None, 0.0))[0] != value:
                return False  # released by its task while the renewal was in flight
            del self._held[key]
            return True
