"""``heartbeat(details)`` and ``heartbeat_details()``: a task says it is alive, and resumes.

``heartbeat()`` is cheap enough to call in a loop: it encodes the details,
keeps the newest beat of each try in memory and returns; a thread of the
process writes the pending beats every :data:`FLUSH_INTERVAL` seconds, one
fenced write per try that beat (see :mod:`celery_recovery.store.task_heartbeats`).
A write refused because a later try replaced this one marks the try stale, and
its next ``heartbeat()`` raises :class:`~celery_recovery.core.errors.StaleTryError`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery._state import get_current_worker_task
from kombu.utils.json import dumps

from celery_recovery.core.errors import HeartbeatDetailsError, StaleTryError, StoreError
from celery_recovery.core.process_id import current_pid
from celery_recovery.core.timeutils import utcnow
from celery_recovery.runtime.context import RecoveryContext, context_for_app
from celery_recovery.store import EncodedJSON

logger = logging.getLogger("celery_recovery.task_heartbeats")

#: Seconds between two writes of a process's pending beats: a beat is durable
#: within about this long.
FLUSH_INTERVAL = 0.5
#: Largest details, as encoded JSON, that ``heartbeat()`` accepts.
MAX_DETAILS_BYTES = 64 * 1024

_NO_DETAILS: Any = object()


class TaskHeartbeatBuffer:
    """One process's pending beats, written by a thread of its own."""

    def __init__(self, context: RecoveryContext) -> None:
        self.context = context
        self.pid = current_pid()
        self._pending: dict[tuple[str, int], tuple[Any, EncodedJSON | None]] = {}
        self._stale: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="celery-recovery-task-beats", daemon=True).start()

    def beat(self, key: tuple[str, int], details: EncodedJSON | None) -> None:
        if key in self._stale:
            raise StaleTryError(
                f"try {key[1]} of task {key[0]} was replaced by a later try (it was taken for "
                "hung or dead): stop, its progress belongs to the later try"
            )
        now = utcnow()
        with self._lock:
            if details is None and key in self._pending:
                details = self._pending[key][1]  # keep the newest details not yet written
            self._pending[key] = (now, details)

    def flush(self) -> None:
        """Write the pending beats now (the thread does every :data:`FLUSH_INTERVAL`)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        store = self.context.store
        for key, (at, details) in pending.items():
            try:
                written = store.task_heartbeats.beat(key[0], key[1], at, details)
            except StoreError as exc:
                self.context.runtime.health.record_failure(exc, f"recording a beat of {key}")
                written = None
            if written is False:
                self._stale.add(key)
            elif written is None:
                with self._lock:  # again at the next flush, unless a newer beat replaced it
                    self._pending.setdefault(key, (at, details))

    def _run(self) -> None:
        while True:
            self._wake.wait(FLUSH_INTERVAL)
            try:
                self.flush()
            except Exception:
                logger.exception("celery-recovery: writing task heartbeats failed; carrying on")


_buffers: dict[int, TaskHeartbeatBuffer] = {}
_buffers_lock = threading.Lock()


def _buffer(context: RecoveryContext) -> TaskHeartbeatBuffer:
    """This process's buffer for ``context`` (a new one after a fork)."""
    found = _buffers.get(id(context))
    if found is None or found.pid != current_pid():
        with _buffers_lock:
            found = _buffers.get(id(context))
            if found is None or found.pid != current_pid():
                found = _buffers[id(context)] = TaskHeartbeatBuffer(context)
    return found


def _current() -> tuple[RecoveryContext, tuple[str, int]] | None:
    task = get_current_worker_task()
    if task is None:
        raise RuntimeError(
            "heartbeat() and heartbeat_details() are called from inside a task a worker runs"
        )
    request = task.request
    context = context_for_app(task.app)
    if context is None or request.is_eager or request.id is None:
        return None  # celery-recovery not installed, or run in-process: nothing to record
    return context, (str(request.id), int(request.retries or 0) + 1)


def _encoded(details: Any) -> EncodedJSON:
    try:
        text = dumps(details)
    except (TypeError, ValueError) as exc:
        raise HeartbeatDetailsError(
            f"heartbeat(details) takes JSON (dicts, lists, strings, numbers...): {exc}"
        ) from None
    size = len(text.encode())
    if size > MAX_DETAILS_BYTES:
        raise HeartbeatDetailsError(
            f"heartbeat(details) got {size} bytes of JSON; at most {MAX_DETAILS_BYTES} are "
            "kept (record where to resume, not the data itself)"
        )
    return EncodedJSON(text)


def heartbeat(details: Any = _NO_DETAILS) -> None:
    """Say that this try of the running task is alive, optionally with ``details``
    (JSON, at most 64 KiB encoded) that a later try reads with :func:`heartbeat_details`.

    Never waits on the store: beats are written within about half a second, the
    newest per try.  Raises :class:`StaleTryError` once the try is known to have
    been replaced by a later one (it was taken for hung or dead), and
    :class:`HeartbeatDetailsError` for details that are not JSON or too large.
    Outside a worker (eager runs) or without celery-recovery installed it does nothing.
    """
    encoded = None if details is _NO_DETAILS else _encoded(details)
    found = _current()
    if found is None:
        return
    context, key = found
    _buffer(context).beat(key, encoded)


def heartbeat_details() -> Any:
    """The details last recorded by ``heartbeat()`` for this task (by an earlier try,
    or an earlier run of this one), or None: where to resume.  One store read."""
    found = _current()
    if found is None:
        return None
    context, (task_id, try_number) = found
    return context.store.task_heartbeats.last_details(task_id, try_number)
