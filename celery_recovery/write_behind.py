"""Write-behind: signal handlers hand their writes to a per-process flusher thread.

Most lifecycle writes do not need to be durable before the task goes on: a
lost ``queued`` record is re-created when a worker starts the task, and a lost
terminal state is reconciled from the result backend by the sweeps.  Batching
them turns one commit per write into one commit per flush, which is what keeps
the hot path near plain Celery's speed.  Writes keep their order.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from celery_recovery.core.errors import StoreError, StoreSchemaError, StoreUnavailableError
from celery_recovery.core.records import WriteKind
from celery_recovery.health import StoreHealth

logger = logging.getLogger("celery_recovery.write_behind")

#: Seconds a write may wait so that others can share its commit.  Short enough
#: that a running claim is durable almost as soon as its task starts; long
#: enough that a short task's claim and outcome share one row write.
FLUSH_INTERVAL = 0.02
#: Most writes applied in one transaction.
MAX_BATCH = 500
#: Most writes kept while the store is down; older ones are dropped past it.
MAX_PENDING = 10_000

Write = tuple[WriteKind, Any]


class BatchTarget(Protocol):
    """Where batches go: :class:`~celery_recovery.store.tries.TryRepository`."""

    def apply_writes(self, writes: Sequence[Write]) -> None: ...


class WriteBehindWriter:
    """An ordered buffer of store writes and the daemon thread that applies them."""

    def __init__(
        self,
        tries: BatchTarget,
        health: StoreHealth,
        *,
        flush_interval: float = FLUSH_INTERVAL,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.tries = tries
        self.health = health
        self.flush_interval = flush_interval
        self.max_pending = max_pending
        self._pending: deque[Write] = deque()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._hurry = threading.Event()

    def submit(self, kind: WriteKind, item: Any) -> None:
        """Queue one write; never blocks on the store."""
        with self._cond:
            self._pending.append((kind, item))
            overflow = len(self._pending) - self.max_pending
            for _ in range(max(0, overflow)):
                self._pending.popleft()
            if self._thread is None:
                self._start()
            self._cond.notify()
        if overflow > 0:
            self.health.record_dropped(overflow, self.max_pending)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued write is applied; False if the store did not take them."""
        self._hurry.set()
        with self._cond:
            self._cond.notify_all()
            return self._cond.wait_for(
                lambda: not self._pending and not self._in_flight, timeout=timeout
            )

    def close(self, timeout: float = 5.0) -> bool:
        """Flush, then stop the thread."""
        done = self.flush(timeout) if self._thread is not None else not self._pending
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._hurry.set()
        return done

    @property
    def pending(self) -> int:
        return len(self._pending) + self._in_flight

    def _start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="celery-recovery-writer", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if self._closed and not self._pending:
                    return
            # Let writes that arrive meanwhile share this commit (flush() cuts it short).
            self._hurry.wait(self.flush_interval)
            self._hurry.clear()
            wait = self.health.seconds_until_retry()
            if wait > 0:
                self._hurry.wait(wait)
                continue
            with self._cond:
                batch = [self._pending.popleft() for _ in range(min(MAX_BATCH, len(self._pending)))]
                self._in_flight = len(batch)
            applied = self._apply(batch)
            with self._cond:
                if not applied:
                    self._pending.extendleft(reversed(batch))
                self._in_flight = 0
                self._cond.notify_all()

    def _apply(self, batch: Sequence[Write]) -> bool:
        """Apply a batch; False when it must be retried later (the store is down)."""
        try:
            self.tries.apply_writes(batch)
        except (StoreUnavailableError, StoreSchemaError) as exc:
            self.health.record_failure(exc, f"writing {len(batch)} task records")
            return False
        except Exception as exc:
            # One bad row must not poison the batch: apply one at a time, drop the bad ones.
            logger.warning("celery-recovery: batch write failed (%s); retrying one by one", exc)
            return self._apply_singly(batch)
        self.health.record_success()
        return True

    def _apply_singly(self, batch: Sequence[Write]) -> bool:
        for index, write in enumerate(batch):
            try:
                self.tries.apply_writes([write])
            except (StoreUnavailableError, StoreSchemaError) as exc:
                self.health.record_failure(exc, "writing task records")
                with self._cond:
                    self._pending.extendleft(reversed(batch[index:]))
                return True
            except (StoreError, Exception) as exc:
                logger.error("celery-recovery: dropped an unwritable record %r: %s", write, exc)
            else:
                self.health.record_success()
        return True
