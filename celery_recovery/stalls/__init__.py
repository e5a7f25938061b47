"""Stuck, not dead: a worker that lives, heartbeats, and takes no messages.

:mod:`.watch` is the worker main process's watch over its consumer,
:mod:`.broker` asks the broker for the ready messages of its queues; the
judgement itself is :mod:`celery_recovery.core.consumer`.  docs/stuck.md
says what a user gets.
"""

from __future__ import annotations

from celery.signals import task_received, worker_shutting_down

from celery_recovery.stalls.watch import (
    ConsumerWatch,
    on_received,
    on_shutting_down,
    start_watch,
    stop_watch,
)


def connect() -> None:
    """Connect the ``task_received`` receiver that dates the last message taken, and the
    one that stops judging a worker that is shutting down."""
    task_received.connect(on_received, weak=False, dispatch_uid=__name__ + ".received")
    worker_shutting_down.connect(
        on_shutting_down, weak=False, dispatch_uid=__name__ + ".shutting_down"
    )


__all__ = ["ConsumerWatch", "connect", "start_watch", "stop_watch"]
