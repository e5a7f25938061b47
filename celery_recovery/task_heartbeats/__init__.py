"""Task heartbeats: a task says it is alive (``heartbeat(details)``), a try that stops
beating for its ``recovery_heartbeat_timeout`` is stopped and run again, and the
next try resumes from the last details (``heartbeat_details()``).  See docs/stuck.md."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_ready, worker_shutdown

from celery_recovery.runtime.context import context_for_app
from celery_recovery.task_heartbeats.buffer import (
    MAX_DETAILS_BYTES,
    heartbeat,
    heartbeat_details,
)
from celery_recovery.task_heartbeats.hung import ATTRIBUTE, HungTries, heartbeat_timeout_of

_watch: HungTries | None = None


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    global _watch
    context = context_for_app(getattr(sender, "app", None))
    if context is None or _watch is not None:
        return
    kills = type(getattr(sender, "pool", None)).__module__ == "celery.concurrency.prefork"
    _watch = HungTries(context, sender, kills).start()


def _on_worker_shutdown(**_: Any) -> None:
    global _watch
    watch, _watch = _watch, None
    if watch is not None:
        watch.stop()


def connect() -> None:
    """Watch the worker's hung tries from its main process once it is ready."""
    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid=__name__ + ".ready")
    worker_shutdown.connect(_on_worker_shutdown, weak=False, dispatch_uid=__name__ + ".shutdown")


__all__ = [
    "ATTRIBUTE",
    "MAX_DETAILS_BYTES",
    "HungTries",
    "connect",
    "heartbeat",
    "heartbeat_details",
    "heartbeat_timeout_of",
]
