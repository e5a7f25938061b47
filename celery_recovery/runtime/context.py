"""What every mechanism is given: the app, its settings, the store, this process's runtime, a clock.

Signals, sweeps, locks, deferral, the triggerer and metrics receive a
:class:`RecoveryContext`, never :class:`~celery_recovery.Recovery`: that class
only wires them together.  Signal handlers, which Celery calls without saying
which installation they belong to, find it here by app (:func:`context_for_app`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import Celery

from celery_recovery.core.exclusions import Exclusions
from celery_recovery.core.process_id import current_pid
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.result_backends import routes_replies
from celery_recovery.runtime.process import ProcessRuntime
from celery_recovery.store import Store

#: Where an app keeps the context installed on it.
_ATTRIBUTE = "_celery_recovery_context"
_installed: list[RecoveryContext] = []
_install_lock = threading.Lock()


class RecoveryContext:
    """One installation's app, settings and store, this process's runtime, and a clock."""

    def __init__(
        self,
        app: Celery,
        settings: RecoverySettings,
        store: Store,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.app = app
        self.settings = settings
        self.store = store
        #: Tasks and queues left alone (``recovery_exclude_tasks``, ``recovery_exclude_queues``).
        self.exclusions = Exclusions(settings.exclude_tasks, settings.exclude_queues)
        #: The current time (UTC, aware); sweeps take ``now`` from it when not given one.
        self.clock = clock
        #: Called for every try a sweep fails or retries, and for every pool-process death.
        self.failure_listeners: list[Callable[..., Any]] = []
        #: Given a worker process's holder name, what it does on each of its heartbeats
        #: (the fallback sweep); wired by :class:`~celery_recovery.Recovery`.
        self.worker_beat_duty: Callable[[str], Callable[[], None]] | None = None
        self._runtime: ProcessRuntime | None = None
        self._runtime_lock = threading.Lock()
        self._routes_replies: bool | None = None

    @property
    def routes_replies(self) -> bool:
        """Whether the app's result backend sends results to the caller's reply queue
        (``rpc://``): a try's record then keeps that route (see
        :mod:`celery_recovery.messages.result_backends`).  Read once: the backend is set up
        before tasks are published."""
        routes = self._routes_replies
        if routes is None:
            routes = self._routes_replies = routes_replies(self.app.backend)
        return routes

    @property
    def runtime(self) -> ProcessRuntime:
        """This process's runtime (writer, store health, job); rebuilt after a fork."""
        runtime = self._runtime
        if runtime is None or runtime.pid != current_pid():
            with self._runtime_lock:
                runtime = self._runtime
                if runtime is None or runtime.pid != current_pid():
                    runtime = self._runtime = ProcessRuntime(self.store, self.settings)
        return runtime

    def close_runtime(self) -> None:
        """Flush this process's records and end its job, if this process built the runtime."""
        runtime = self._runtime
        if runtime is not None and runtime.pid == current_pid():
            runtime.close()


def install(context: RecoveryContext) -> None:
    """Make ``context`` the one signal handlers find for its app."""
    with _install_lock:
        setattr(context.app, _ATTRIBUTE, context)
        _installed.append(context)


def uninstall(context: RecoveryContext) -> None:
    with _install_lock:
        if context in _installed:
            _installed.remove(context)
        if context.app.__dict__.get(_ATTRIBUTE) is context:
            delattr(context.app, _ATTRIBUTE)


def context_for_app(app: Any) -> RecoveryContext | None:
    """The context installed on ``app``, if any."""
    found = getattr(app, "__dict__", {}).get(_ATTRIBUTE)
    return found if isinstance(found, RecoveryContext) else None


def context_for_task_name(name: str) -> RecoveryContext | None:
    """The installation that should record a publish of task ``name``.

    Publish signals do not say which app sent them.  With one installed app
    (the usual case) that is the answer; otherwise the app that registers the
    task name, else the current app.
    """
    installed = _installed
    if len(installed) == 1:
        return installed[0]
    for context in installed:
        if name in context.app.tasks:
            return context
    from celery import current_app

    return context_for_app(current_app._get_current_object())


def installed() -> list[RecoveryContext]:
    """Every installation in this process."""
    return list(_installed)
