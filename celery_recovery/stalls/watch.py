"""A worker's main process watches its own consumer, and says when it is stalled.

:class:`ConsumerWatch` holds what the consumer's state needs: when the last
message arrived (a ``task_received`` receiver stores a monotonic time, no
more), whether the consumer's broker connection is up, and the pool's free
slots (Celery's own request sets).  A thread of its own asks the broker for
the ready messages of the worker's queues when the worker is idle with free
slots (a probe can wait for its timeout, which must never delay a
heartbeat); the heartbeat thread calls :meth:`ConsumerWatch.snapshot` at
every beat, which judges the consumer (:class:`~celery_recovery.core.consumer.StallJudge`)
and returns the state written with the heartbeat.

When the verdict turns to stalled the worker logs a warning, counts a
metric and writes an audit row, once per stall; with
``recovery_on_stalled_consumer = "exit"`` it then shuts itself down warm
(SIGTERM to its own main process, Celery's warm shutdown).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

from celery.worker import state as worker_state

from celery_recovery.core.audit import AuditAction, AuditReason, Decision
from celery_recovery.core.consumer import ConsumerFacts, QueueProbe, StallJudge
from celery_recovery.core.process_id import HOSTNAME
from celery_recovery.core.records import WriteKind
from celery_recovery.core.timeutils import from_timestamp, utcnow
from celery_recovery.runtime.context import RecoveryContext
from celery_recovery.stalls.broker import ready_messages
from celery_recovery.telemetry import metrics

logger = logging.getLogger("celery_recovery.stalls")

#: Exit status of a stalled worker whose shutdown hung (EX_SOFTWARE).
EXIT_STUCK = 70


def _pool_pids(consumer: Any) -> list[int]:
    """The pids of a prefork pool's processes (none for other pools)."""
    processes = getattr(getattr(getattr(consumer, "pool", None), "_pool", None), "_pool", None)
    return [p.pid for p in processes or () if getattr(p, "pid", None)]


class ConsumerWatch:
    """The consumer of one worker, watched from its main process."""

    def __init__(self, context: RecoveryContext, consumer: Any) -> None:
        self.context = context
        self.consumer = consumer
        self.timeout = context.settings.stalled_consumer_timeout
        now = time.monotonic()
        #: Set by every ``task_received`` (a float store: free on the hot path).
        self.last_received = now
        self.judge = StallJudge(self.timeout, now)
        self._connected = True
        self._connection_since = now
        self._stalled_since: float | None = None
        #: Set when the worker starts shutting down: it stops consuming on purpose.
        self._shutting_down = False
        #: When it sent itself SIGTERM, then SIGQUIT (``recovery_on_stalled_consumer = "exit"``).
        self._exit_requested: float | None = None
        self._cold_requested: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._probe_loop, name="celery-recovery-consumer-watch", daemon=True
        )

    def start(self) -> ConsumerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def shutting_down(self) -> None:
        """The worker stops consuming on purpose (a warm shutdown waits for its tasks):
        no verdict from now on (a shutdown this watch asked for is still escalated)."""
        self._shutting_down = True

    # -- facts ---------------------------------------------------------------------

    def facts(self, now: float) -> ConsumerFacts:
        connected = getattr(self.consumer, "connection", None) is not None
        with self._lock:
            if connected != self._connected:
                self._connected, self._connection_since = connected, now
            since = self._connection_since
        reserved = len(worker_state.reserved_requests)
        return ConsumerFacts(
            connected=connected,
            connection_since=since,
            last_received=self.last_received,
            reserved=reserved,
            active=len(worker_state.active_requests),
            free_slots=max(0, self._concurrency() - reserved),
        )

    def _concurrency(self) -> int:
        pool = getattr(self.consumer, "pool", None)
        for value in (getattr(pool, "num_processes", None), getattr(pool, "limit", None)):
            if isinstance(value, int) and value > 0:
                return value
        controller = getattr(self.consumer, "controller", None)
        return int(getattr(controller, "concurrency", None) or 1)

    def queues(self) -> list[str]:
        consume_from = getattr(self.consumer.app.amqp.queues, "consume_from", None) or {}
        return sorted(consume_from)

    # -- probing (its own thread) ----------------------------------------------------

    def _probe_loop(self) -> None:
        pause = min(self.judge.interval, self.context.settings.heartbeat_interval)
        while not self._stop.wait(pause):
            try:
                self.probe_if_due()
                self._escalate_exit()
            except Exception:
                logger.exception("celery-recovery: checking the consumer failed; carrying on")

    def probe_if_due(self) -> None:
        now = time.monotonic()
        facts = self.facts(now)
        with self._lock:
            if not self.judge.probe_due(now, facts):
                return
            self.judge.probe_started(now)
        try:
            ready: int | None = ready_messages(
                self.consumer.app, self.queues(), self.judge.probe_timeout
            )
            error = None
        except Exception as exc:  # any transport's connection error, timeouts included
            ready, error = None, f"{type(exc).__name__}: {exc}"[:200]
        with self._lock:
            self.judge.probed(QueueProbe(time.monotonic(), ready, error), self.last_received)

    # -- judging (the heartbeat thread) -----------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The consumer's state to write with this heartbeat; judges it first."""
        now = time.monotonic()
        facts = self.facts(now)
        with self._lock:
            reason = None if self._shutting_down else self.judge.verdict(now, facts)
            probe = self.judge.last_probe
        self._transition(now, reason)
        wall = time.time() - now  # monotonic to wall clock

        def at(moment: float | None) -> str | None:
            return None if moment is None else from_timestamp(wall + moment).isoformat()

        return {
            "connected": facts.connected,
            "connection_since": at(facts.connection_since),
            "last_received": at(facts.last_received),
            "reserved": facts.reserved,
            "active": facts.active,
            "free_slots": facts.free_slots,
            "ready": probe.ready if probe else None,
            "probed_at": at(probe.at) if probe else None,
            "probe_error": probe.error if probe else None,
            "timeout": self.timeout,
            "stalled": reason is not None,
            "stalled_since": at(self._stalled_since),
            "stalled_reason": reason,
        }

    def _transition(self, now: float, reason: str | None) -> None:
        was = self._stalled_since is not None
        if reason is None:
            if was:
                self._stalled_since = None
                metrics.consumer_stalled(False)
                logger.info("celery-recovery: this worker is no longer stalled")
            return
        if was:
            return
        self._stalled_since = now
        self._report(reason)

    def _report(self, reason: str) -> None:
        exiting = self.context.settings.on_stalled_consumer == "exit"
        logger.warning(
            "celery-recovery: this worker is stalled: %s (recovery_stalled_consumer_timeout=%gs)%s",
            reason,
            self.timeout,
            "; shutting down warm (recovery_on_stalled_consumer='exit')" if exiting else "",
        )
        metrics.consumer_stalled(True)
        runtime = self.context.runtime
        decision = Decision(
            at=utcnow(),
            action=AuditAction.STALLED,
            reason=AuditReason.CONSUMER_STALLED,
            task_id=None,
            try_number=None,
            detail=f"stalled: {reason}",
            job_id=runtime.job_id,
            hostname=HOSTNAME,
            pid=os.getpid(),
            actor=f"{HOSTNAME}:{os.getpid()}",
        )
        runtime.write(WriteKind.AUDIT, decision)
        if exiting and self._exit_requested is None:
            # Celery's warm shutdown: running tasks finish, the supervisor starts it again.
            self._exit_requested = time.monotonic()
            self._bound_broker_sockets()
            os.kill(os.getpid(), signal.SIGTERM)

    def _bound_broker_sockets(self) -> None:
        """Give the consumer's open broker sockets a timeout: shutting down reads from
        them (a pending BRPOP, a cancel's reply), which on a frozen connection would
        never return.  Celery 5.7 has the helper; older versions go without."""
        try:
            from celery.utils.threads import bound_open_broker_sockets
        except ImportError:
            return
        for connection in (
            getattr(self.consumer, "connection", None),
            getattr(getattr(self.consumer, "event_dispatcher", None), "connection", None),
        ):
            if connection is not None:
                bound_open_broker_sockets(connection, self.judge.probe_timeout)

    def _escalate_exit(self) -> None:
        """A warm shutdown can hang on the stuck broker connection itself: the main
        thread blocked in a read that never returns sees the SIGTERM's flag only when
        the read ends.  A timeout after it (once no task runs, or 4 timeouts at most),
        shut down cold (SIGQUIT); a timeout after that, end the pool processes and the
        process itself (their tasks are recovered like those of any dead worker)."""
        requested = self._exit_requested
        if requested is None:
            return
        waited = time.monotonic() - requested
        if self._cold_requested is None:
            idle = not worker_state.active_requests
            if waited >= self.timeout and (idle or waited >= 4 * self.timeout):
                logger.warning(
                    "celery-recovery: the warm shutdown of this stalled worker has not "
                    "finished after %.0fs; shutting down cold",
                    waited,
                )
                self._cold_requested = time.monotonic()
                os.kill(os.getpid(), signal.SIGQUIT)
            return
        if time.monotonic() - self._cold_requested >= self.timeout:
            logger.critical(
                "celery-recovery: this stalled worker's main thread is stuck (its cold "
                "shutdown has not finished either); ending its pool and exiting"
            )
            self._stop.set()
            for pid in _pool_pids(self.consumer):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(EXIT_STUCK)


#: The watch of this process's worker, if it is a worker's main process.
_watch: ConsumerWatch | None = None


def start_watch(context: RecoveryContext, consumer: Any) -> ConsumerWatch:
    """Watch ``consumer`` from this process (a worker's main process), once."""
    global _watch
    if _watch is None or _watch.consumer is not consumer:
        if _watch is not None:
            _watch.stop()
        _watch = ConsumerWatch(context, consumer).start()
    return _watch


def on_shutting_down(**_: Any) -> None:
    """``worker_shutting_down``: a consumer that stops now is not stalled."""
    watch = _watch
    if watch is not None:
        watch.shutting_down()


def stop_watch() -> None:
    global _watch
    watch, _watch = _watch, None
    if watch is not None:
        watch.stop()


def on_received(**_: Any) -> None:
    """``task_received``: the consumer took a message (kept to one store of a float)."""
    watch = _watch
    if watch is not None:
        watch.last_received = time.monotonic()
