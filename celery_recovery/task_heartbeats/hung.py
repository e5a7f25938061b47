"""Hung tries: a worker's main process stops the tries of its own that stopped beating.

A task with ``recovery_heartbeat_timeout`` (``@app.task(recovery_heartbeat_timeout=30)``
or ``@recoverable(recovery_heartbeat_timeout=30)``) promises to call
``heartbeat()`` at least that often.  The worker's main process, which knows
which pool process runs which try, looks at its running tries of such tasks
every second: one read of their last beats, and none at all while no such try
runs.  A try silent for its timeout since its last beat (or since the main
process saw it start) is hung:

1. it is reset like a zombie (:func:`celery_recovery.sweeps.resets.reset`): one
   compare-and-set from ``running`` gives it up, ``up_for_retry`` and published
   again as the next try while ``max_retries`` allows (``recovery_max_lost_runs``
   runs in all when it is None), else ``failed``, with its
   ``on_retry`` / ``on_failure`` row in the outbox (run once by the sweep) and an
   audit row, reason ``hung: no heartbeat for N s``;
2. only when that change won, its pool process is killed (SIGKILL), on the
   worker's event loop, as Celery cancels a task (no result stored, no revoke:
   the task id must stay runnable for the next try).

Why here and not in the sweep: the sweep could only ask the worker over the
broker, and Celery's ``revoke(terminate=True)`` also marks the task id revoked
on every worker, which would drop the next try (same id).  The main process
needs no message and knows the pool process; if the main process itself is
stuck, its consumer watch and heartbeat say so (docs/stuck.md).

Pools that run tasks in threads (solo, threads, gevent, eventlet) cannot kill
one: the try is given up and run again, and the hung thread is abandoned.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from celery.worker import state as worker_state

from celery_recovery.core.audit import AuditReason
from celery_recovery.core.durations import positive_seconds
from celery_recovery.core.errors import ConfigurationError
from celery_recovery.core.log_once import LogOnce
from celery_recovery.core.process_id import HOSTNAME
from celery_recovery.core.records import SweepOutcome, SweepReport
from celery_recovery.core.states import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.runtime.context import RecoveryContext
from celery_recovery.sweeps.context import SweepContext
from celery_recovery.sweeps.resets import reset

logger = logging.getLogger("celery_recovery.task_heartbeats")

#: The task attribute (and ``@recoverable`` option) that asks for heartbeats.
ATTRIBUTE = "recovery_heartbeat_timeout"
#: Longest wait between two looks at the running tries.
CHECK_INTERVAL = 1.0

_bad = LogOnce()


def heartbeat_timeout_of(task: Any) -> float | None:
    """The task's ``recovery_heartbeat_timeout`` in seconds, or None; a bad value is
    logged once and ignored (the task then has none)."""
    value = getattr(task, ATTRIBUTE, None)
    if value is None:
        value = getattr(getattr(task, "run", None), ATTRIBUTE, None)
    if value is None:
        return None
    name = f"{getattr(task, 'name', task)}.{ATTRIBUTE}"
    try:
        return positive_seconds(name, value, timedelta_ok=True)
    except ConfigurationError as exc:
        if _bad.first(name):
            logger.error("celery-recovery: %s; the task is not watched for hangs", exc)
        return None


class HungTries:
    """The running tries of one worker that promised to beat, watched from its main process."""

    def __init__(self, context: RecoveryContext, consumer: Any, kills: bool) -> None:
        self.context = context
        self.consumer = consumer
        self.kills = kills
        #: (task id, try) -> [monotonic time of its start or last new beat, that beat]
        self._seen: dict[tuple[str, int], list[Any]] = {}
        self._given_up: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self.interval = min(CHECK_INTERVAL, context.settings.heartbeat_interval)

    def start(self) -> HungTries:
        threading.Thread(target=self._run, name="celery-recovery-hung-tries", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:
                logger.exception("celery-recovery: looking for hung tries failed; carrying on")

    def check(self) -> None:
        watched = []
        for request in list(worker_state.active_requests):
            timeout = heartbeat_timeout_of(request.task)
            if timeout is not None and request.time_start:
                retries = request.request_dict.get("retries") or 0
                watched.append((request, (str(request.id), int(retries) + 1), timeout))
        keys = {key for _, key, _ in watched}
        self._seen = {key: seen for key, seen in self._seen.items() if key in keys}
        self._given_up &= keys
        if not watched:
            return
        beats = self.context.store.task_heartbeats.last_beats(key for _, key, _ in watched)
        now = time.monotonic()
        for request, key, timeout in watched:
            seen = self._seen.setdefault(key, [now, None])
            beat = beats.get(key)
            if beat is not None and beat != seen[1]:
                seen[0], seen[1] = now, beat
            if now - seen[0] >= timeout and key not in self._given_up:
                self._given_up.add(key)
                self._give_up(request, key, timeout)

    def _give_up(self, request: Any, key: tuple[str, int], timeout: float) -> None:
        task_id, try_number = key
        record = next(
            (r for r in self.context.store.tries.history(task_id) if r["try_number"] == try_number),
            None,
        )
        if record is None or record["state"] != TaskState.RUNNING.value:
            return  # finished meanwhile, or recovered by someone else
        ctx = SweepContext(self.context, utcnow(), SweepReport(), f"{HOSTNAME}:{os.getpid()}")
        why = f"hung: no heartbeat for {timeout:g} s"
        outcome = reset(
            ctx,
            record,
            expected_state=TaskState.RUNNING,
            why=why,
            cause=AuditReason.HUNG,
            # A task that hangs every time, with max_retries=None, is a poison task.
            retry_limit=self.context.settings.max_lost_runs - 1,
        )
        if outcome == SweepOutcome.LOST_RACE:
            return
        if not self.kills:
            logger.warning(
                "celery-recovery: task %s[%s] try %d is hung; this pool cannot stop a thread, "
                "so it is abandoned (the try is given up and run again)",
                request.task.name,
                task_id,
                try_number,
            )
            return
        pool, hub = self.consumer.pool, getattr(self.consumer, "hub", None)
        if hub is not None:
            # On the event loop: Celery's request and pool are the main thread's.
            hub.call_soon(request.cancel, pool, signal.SIGKILL, False)
        else:  # a transport without an event loop: no other way in
            request.cancel(pool, signal.SIGKILL, False)
