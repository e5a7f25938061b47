"""Write-behind: signal handlers hand their writes to a per-process flusher thread.

Most lifecycle writes do not need to be durable before the task goes on: a
lost ``queued`` record is re-created when a worker starts the task, and a lost
terminal state is reconciled from the result backend by the sweeps.  Batching
them turns one commit per write into one commit per flush, which is what keeps
the hot path near plain Celery's speed.  Writes keep their order.

Batching adapts to what waits.  A ``running`` claim whose task is still
running is committed within :data:`CLAIM_INTERVAL` of its start: that is the
window in which a killed process leaves its try ``queued`` rather than
``running`` (docs/recovery.md), so it must stay short.  A reservation (a
message a worker's main process holds) is the same window for a prefetched
message: it is committed within the claim interval too while the writer has
prompt commits in hand (:data:`RESERVATION_BURST`, one more earned per flush
interval), and else when it earns the next one (so a busy main process still
commits a few times a second, and a quiet one at once, even for the few
messages it takes back to back).  Everything else (a publisher's ``queued`` rows, finished
outcomes, audit rows) may wait :data:`FLUSH_INTERVAL`, so that batches grow
and commits get rarer.  An outcome that finds its try's claim still waiting
here is folded into it (one row write, and the claim is no longer urgent), as
:func:`celery_recovery.store.batches.coalesce` would do at write time.

A write may be built (:meth:`WriteBehindWriter.submit_built`): the caller
hands over what it captured, and the flusher thread builds the record when
the batch is taken, or drops the write if by then it records nothing new.  A
publisher's ``queued`` records are made that way, so that ``apply_async`` only
waits for what cannot wait (encoding the arguments before the caller may
change them); so are the reservations of a worker's main process: most
messages it holds are handed to a pool process within milliseconds, whose
claim then says more, so only those still waiting when the batch is written
cost a row.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from celery_recovery.core.errors import StoreError, StoreSchemaError, StoreUnavailableError
from celery_recovery.core.records import COMPLETE_WHEN_WRITTEN, Transition, WriteKind
from celery_recovery.core.states import TaskState
from celery_recovery.runtime.health import StoreHealth

logger = logging.getLogger("celery_recovery.write_behind")

#: Seconds a ``running`` claim of a task still running may wait: the recovery
#: window of a process killed as its task starts (docs/recovery.md).
CLAIM_INTERVAL = 0.02
#: Seconds any other write may wait so that others can share its commit.
FLUSH_INTERVAL = 0.15
#: Prompt commits a quiet writer makes for reservations back to back, before they
#: wait for the flush interval: a worker takes its next message as its first task
#: starts, and when that start is slow to be seen the first message's reservation
#: takes one commit and the next message's another.
RESERVATION_BURST = 3
#: Most writes applied in one transaction.
MAX_BATCH = 500
#: Most writes kept while the store is down; older ones are dropped past it.
MAX_PENDING = 10_000

Write = tuple[WriteKind, Any]
_RUNNING_ONLY = (TaskState.RUNNING,)


class _Built:
    """A pending write whose item is ``build(source)``, made when its batch is taken
    (none if that returns ``None``)."""

    __slots__ = ("build", "source")

    def __init__(self, build: Callable[[Any], Any], source: Any) -> None:
        self.build = build
        self.source = source


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
        claim_interval: float = CLAIM_INTERVAL,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.tries = tries
        self.health = health
        self.flush_interval = flush_interval
        self.claim_interval = claim_interval
        self.max_pending = max_pending
        self._pending: deque[Write] = deque()
        # Submitters take the lock itself, not the condition (whose ``with`` runs two
        # Python-level calls): they run on the task's path, once or twice a task.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._in_flight = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self._hurry = False
        #: When the oldest pending write arrived (monotonic seconds).
        self._oldest = math.inf
        #: Claims waiting here whose task has not ended: (task_id, try) -> (record, arrival).
        self._open_claims: dict[tuple[str, int], tuple[dict[str, Any], float]] = {}
        #: Whether this process claims tries (a pool process): then the flusher looks
        #: at the buffer at least every claim interval.
        self._takes_claims = False
        #: When the first reservation waiting here arrived (monotonic seconds).
        self._first_reserved = math.inf
        #: Prompt commits in hand for reservations (a token bucket: at most
        #: RESERVATION_BURST, one earned per flush interval), as of ``_credit_at``.
        self._credit = float(RESERVATION_BURST)
        self._credit_at = time.monotonic()

    def submit(self, kind: WriteKind, item: Any) -> None:
        """Queue one write; never blocks on the store.  A ``running`` claim's dict then
        belongs to the writer (its outcome is folded into it): the caller keeps no use
        of it."""
        overflow = 0
        with self._lock:
            if kind == WriteKind.TRANSITION and self._fold_outcome(item):
                return
            now = time.monotonic()
            if kind == WriteKind.RUNNING:
                # The caller hands the claim over: an outcome is folded into this dict.
                self._open_claims[(item["task_id"], item["try_number"])] = (item, now)
                if not self._takes_claims:
                    # The flusher may be in a longer wait, planned before claims came.
                    self._takes_claims = True
                    self._cond.notify()
            if kind == WriteKind.RESERVED and self._first_reserved == math.inf:
                self._first_reserved = now
                # The flusher may be in a longer wait, planned before it came.
                self._cond.notify()
            if not self._pending:
                self._oldest = now
                # The flusher sleeps while nothing is pending; once something is, it
                # looks again at least every claim interval, so later writes need not
                # wake it (a wake-up per task costs more than the write).
                self._cond.notify()
            self._pending.append((kind, item))
            overflow = len(self._pending) - self.max_pending
            for _ in range(max(0, overflow)):
                self._forget(self._pending.popleft())
            if self._thread is None:
                self._start()
        if overflow > 0:
            self.health.record_dropped(overflow, self.max_pending)

    def finish(self, task_id: str, try_number: int, values: dict[str, Any]) -> None:
        """Queue a running try's outcome: folded into its claim while that still waits
        here (the usual case for a short task), else a compare-and-set from ``running``."""
        with self._lock:
            if self._fold(task_id, try_number, values):
                return
        self.submit(WriteKind.TRANSITION, Transition(task_id, try_number, _RUNNING_ONLY, values))

    def submit_built(self, kind: WriteKind, build: Callable[[Any], Any], source: Any) -> None:
        """Queue one write whose item is ``build(source)``, called in the flusher thread
        when its batch is taken: work a caller need not wait for (a record built from
        what it captured) is done there instead of on the caller's path.  ``build``
        returns ``None`` when the write is no longer needed (superseded meanwhile); one
        that raises drops that write, logged, and no other."""
        self.submit(kind, _Built(build, source))

    def _fold_outcome(self, change: Transition) -> bool:
        """Fold an outcome into its try's claim when that claim still waits here."""
        if change.expected != _RUNNING_ONLY or change.try_number is None:
            return False
        return self._fold(change.task_id, change.try_number, change.values)

    def _fold(self, task_id: str, try_number: int, values: dict[str, Any]) -> bool:
        """Merge ``values`` into the waiting claim of this try, if there is one (lock held)."""
        open_claim = self._open_claims.pop((task_id, try_number), None)
        if open_claim is None:
            return False
        open_claim[0].update(values)
        return True

    def _forget(self, write: Write) -> None:
        kind, item = write
        if kind == WriteKind.RUNNING:
            self._open_claims.pop((item["task_id"], item["try_number"]), None)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued write is applied; False if the store did not take them."""
        with self._cond:
            self._hurry = True
            self._cond.notify_all()
            return self._cond.wait_for(
                lambda: not self._pending and not self._in_flight, timeout=timeout
            )

    def close(self, timeout: float = 5.0) -> bool:
        """Flush, then stop the thread."""
        done = self.flush(timeout) if self._thread is not None else not self._pending
        with self._cond:
            self._closed = True
            self._hurry = True
            self._cond.notify_all()
        return done

    @property
    def pending(self) -> int:
        return len(self._pending) + self._in_flight

    def _start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="celery-recovery-writer", daemon=True
        )
        self._thread.start()

    def _due(self) -> float:
        """When the pending writes must be written: the earliest of their deadlines."""
        due = self._oldest + self.flush_interval
        for _record, arrived in self._open_claims.values():
            due = min(due, arrived + self.claim_interval)
        if self._first_reserved != math.inf:
            prompt = self._first_reserved + self.claim_interval
            earned = self._credit_at + max(0.0, 1.0 - self._credit) * self.flush_interval
            due = min(due, max(prompt, earned))
        return due

    def _spend_credit(self, now: float) -> None:
        """A batch is taken: it costs one prompt commit (lock held)."""
        interval = self.flush_interval
        earned = (now - self._credit_at) / interval if interval > 0 else math.inf
        self._credit = max(0.0, min(float(RESERVATION_BURST), self._credit + earned) - 1.0)
        self._credit_at = now

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed and not self._pending:
                        return
                    if not self._pending:
                        self._cond.wait()
                        continue
                    wait = self._due() - time.monotonic()
                    if self._hurry or wait <= 0:
                        break
                    if self._takes_claims:
                        # A claim submitted meanwhile does not wake this thread.
                        wait = min(wait, self.claim_interval)
                    self._cond.wait(wait)
                self._hurry = False
            wait = self.health.seconds_until_retry()
            if wait > 0:
                with self._cond:
                    self._hurry = False  # only a flush() asked from now on cuts the wait short
                    self._cond.wait_for(lambda: self._hurry or self._closed, timeout=wait)
                continue
            with self._cond:
                batch = [self._pending.popleft() for _ in range(min(MAX_BATCH, len(self._pending)))]
                for write in batch:
                    self._forget(write)
                # What is left is already late: write it next, at once.
                self._oldest = -math.inf if self._pending else math.inf
                self._first_reserved = math.inf
                self._spend_credit(time.monotonic())
                self._in_flight = len(batch)
            # Outside the lock: submitters do not wait for the checks and the building.
            batch = _resolved(batch)
            applied = self._apply(batch)
            with self._cond:
                if not applied:
                    self._pending.extendleft(reversed(batch))
                    self._oldest = -math.inf
                self._in_flight = 0
                self._cond.notify_all()

    def _apply(self, batch: Sequence[Write]) -> bool:
        """Apply a batch; False when it must be retried later (the store is down)."""
        if not batch:
            return True
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
                    self._oldest = -math.inf
                return True
            except (StoreError, Exception) as exc:
                logger.error("celery-recovery: dropped an unwritable record %r: %s", write, exc)
            else:
                self.health.record_success()
        return True


def _resolved(batch: list[Write]) -> list[Write]:
    """The batch as it is written: built writes built, or dropped if no longer needed;
    claims completed (:data:`~celery_recovery.core.records.COMPLETE_WHEN_WRITTEN`)."""
    kept: list[Write] = []
    for kind, item in batch:
        if isinstance(item, _Built):
            try:
                item = item.build(item.source)
            except Exception:
                logger.exception("celery-recovery: dropped a %s record it could not build", kind)
                continue
            if item is None:
                continue
        elif kind == WriteKind.RUNNING and COMPLETE_WHEN_WRITTEN in item:
            complete = item.pop(COMPLETE_WHEN_WRITTEN)
            try:
                complete(item)
            except Exception:
                # The claim as it stands is still the truth about the run: written.
                logger.exception(
                    "celery-recovery: could not complete the claim of %s", item.get("task_id")
                )
        kept.append((kind, item))
    return kept
