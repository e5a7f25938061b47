"""Store health in one process: back off after failures, warn once per outage.

The signal handlers and background threads of a process share one
:class:`StoreHealth`.  While the store is failing they skip it (so a down or
slow database never delays the user's tasks), the first failure of an outage
logs one warning, later ones only count, and the first success logs that
recovery resumed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from celery_recovery.core.errors import StoreSchemaError
from celery_recovery.telemetry import metrics

logger = logging.getLogger("celery_recovery.store")

#: Seconds to wait after the first failure before trying the store again.
BACKOFF_INITIAL = 0.5
#: Longest wait between two attempts while the store keeps failing.
BACKOFF_MAX = 30.0


class StoreHealth:
    """Circuit breaker and outage logging for the store, shared by a process's threads."""

    def __init__(
        self,
        description: str,
        *,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.description = description
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._retry_at = 0.0
        #: Store operations that failed in this process since it started.
        self.failures = 0
        #: Buffered writes dropped because the buffer overflowed during an outage.
        self.dropped = 0
        self._dropped_warned = False

    @property
    def down(self) -> bool:
        return self._consecutive > 0

    def available(self) -> bool:
        """True when the store may be tried now (up, or the backoff has passed)."""
        return self._consecutive == 0 or self._clock() >= self._retry_at

    def seconds_until_retry(self) -> float:
        return max(0.0, self._retry_at - self._clock()) if self._consecutive else 0.0

    def record_failure(self, exc: BaseException, doing: str) -> None:
        with self._lock:
            self.failures += 1
            self._consecutive += 1
            first = self._consecutive == 1
            delay = min(self.backoff_max, self.backoff_initial * 2 ** (self._consecutive - 1))
            if isinstance(exc, StoreSchemaError):
                delay = self.backoff_max
            self._retry_at = self._clock() + delay
        metrics.store_error(exc)
        if first:
            logger.warning(
                "celery-recovery: the metadata store failed while %s: %s. Tasks keep running; "
                "recovery is degraded until the store answers again (retrying with backoff, "
                "further failures are counted, not logged).",
                doing,
                exc,
            )
        else:
            logger.debug("celery-recovery: store still failing while %s: %s", doing, exc)

    def record_success(self) -> None:
        if self._consecutive == 0:
            return
        with self._lock:
            failed, self._consecutive = self._consecutive, 0
            dropped, self._dropped_warned = self.dropped, False
        logger.warning(
            "celery-recovery: metadata store %s answers again after %d failed attempts "
            "(%d buffered writes dropped in total); recovery resumed.",
            self.description,
            failed,
            dropped,
        )

    def record_dropped(self, count: int, limit: int) -> None:
        with self._lock:
            self.dropped += count
            warn, self._dropped_warned = not self._dropped_warned, True
        metrics.dropped_writes(count)
        if warn:
            logger.warning(
                "celery-recovery: more than %d writes are waiting for the store; the oldest "
                "are being dropped (their tasks still run; their records will be incomplete).",
                limit,
            )
