"""Celery signal handlers (and the task-class hook that claims a try, in
:mod:`.tasks`): each turns one event into one store call and never raises.

Handlers are connected once per process, for every installed app; each finds
the :class:`~celery_recovery.Recovery` of the app that sent the signal.
"""

from __future__ import annotations

import threading

from celery_recovery import stalls
from celery_recovery.signals import control, doctor, processes, publish, reservations, tasks
from celery_recovery.signals.dispatch import PER_TASK_SIGNALS, cache_receivers

_connected = False
_lock = threading.Lock()


def connect() -> None:
    """Connect every handler (idempotent)."""
    global _connected
    with _lock:
        if _connected:
            return
        publish.connect()
        tasks.connect()
        processes.connect()
        control.connect()
        reservations.connect()
        doctor.connect()
        stalls.connect()
        for signal in PER_TASK_SIGNALS:
            cache_receivers(signal)
        _connected = True


__all__ = ["connect"]
