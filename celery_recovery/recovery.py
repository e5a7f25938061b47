"""``Recovery(app)``: the one call that installs celery-recovery into a Celery app."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import Celery

from .runtime import ProcessRuntime
from .settings import RecoverySettings
from .store import Store

if TYPE_CHECKING:
    from .sweeps.context import SweepReport

logger = logging.getLogger("celery_recovery")

_ATTRIBUTE = "_celery_recovery"
_installed: list[Recovery] = []
_install_lock = threading.Lock()


class Recovery:
    """Recovery guarantees for one Celery app.

    ``Recovery(app)`` reads and validates the ``recovery_*`` settings (see
    :mod:`celery_recovery.settings`; ``overrides`` take precedence over
    ``app.conf`` and ``CELERY_RECOVERY_*`` environment variables), and connects
    the signal handlers that record jobs, heartbeats and task lifecycles.
    Calling it again for the same app returns the instance already installed
    and changes nothing.

    Configure the app (``app.conf`` / ``config_from_object``) before calling it.
    """

    app: Celery
    settings: RecoverySettings
    store: Store

    def __new__(cls, app: Celery, **overrides: Any) -> Recovery:
        existing = app.__dict__.get(_ATTRIBUTE)
        if isinstance(existing, cls):
            return existing
        return super().__new__(cls)

    def __init__(self, app: Celery, **overrides: Any) -> None:
        if app.__dict__.get(_ATTRIBUTE) is self:
            if overrides and RecoverySettings.from_app(app, **overrides) != self.settings:
                logger.warning(
                    "celery-recovery is already installed on app %r; the new settings "
                    "passed to Recovery() are ignored",
                    app.main,
                )
            return
        self.app = app
        self.settings = RecoverySettings.from_app(app, **overrides)
        self.store = Store(self.settings.database_url)
        self._runtime: ProcessRuntime | None = None
        self._runtime_lock = threading.Lock()
        #: Called for every try a sweep fails or retries (see add_failure_listener).
        self.failure_listeners: list[Callable[..., Any]] = []
        from . import signals
        from .canvas import install_chord_body_once
        from .execution import install_stale_delivery_guard
        from .retention import register_clean_task
        from .sweeps.tasks import register_sweep_task

        with _install_lock:
            setattr(app, _ATTRIBUTE, self)
            _installed.append(self)
            signals.connect()
        register_sweep_task(self)
        register_clean_task(self)
        install_stale_delivery_guard(self)
        install_chord_body_once(self)
        logger.debug("celery-recovery installed on app %r, store %s", app.main, self.store)

    def __repr__(self) -> str:
        return f"<Recovery app={self.app.main!r} store={self.settings.masked_database_url}>"

    @property
    def runtime(self) -> ProcessRuntime:
        """This process's runtime (writer, store health, job); rebuilt after a fork."""
        runtime = self._runtime
        if runtime is None or runtime.pid != os.getpid():
            with self._runtime_lock:
                runtime = self._runtime
                if runtime is None or runtime.pid != os.getpid():
                    runtime = self._runtime = ProcessRuntime(self.store, self.settings)
        return runtime

    def sweep(self, now: datetime | None = None) -> SweepReport:
        """Run one recovery pass in this process and report what it found and did.

        Finds zombies (running tries whose worker stopped heartbeating), asks
        the result backend before touching them, retries or fails them,
        re-publishes lost messages, marks dead jobs and delivers the failure
        callbacks of tries it failed.  Safe to run in several processes at once.
        """
        from .sweeps.runner import run_sweep

        return run_sweep(self, now)

    def add_failure_listener(self, listener: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``listener(task_id=, task_name=, try_number=, kind=, exception=)``.

        It runs (from the sweep, under ``recovery_callback_timeout``) for every
        try a sweep failed (``kind="failure"``) or retried (``kind="retry"``)
        because its worker or message was lost, and for every try whose pool
        process died under a live worker (failed, or retried by Celery's
        ``task_retry_on_worker_lost``).  Usable as a decorator.
        """
        self.failure_listeners.append(listener)
        return listener

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until this process's buffered records are written; False on timeout."""
        return self.runtime.writer.flush(timeout)

    def close(self) -> None:
        """Flush this process's records, end its job, and uninstall from the app."""
        runtime = self._runtime
        if runtime is not None and runtime.pid == os.getpid():
            runtime.close()
        with _install_lock:
            if self in _installed:
                _installed.remove(self)
            if self.app.__dict__.get(_ATTRIBUTE) is self:
                delattr(self.app, _ATTRIBUTE)
        self.store.dispose()


def recovery_for_app(app: Any) -> Recovery | None:
    """The :class:`Recovery` installed on ``app``, if any."""
    found = getattr(app, "__dict__", {}).get(_ATTRIBUTE)
    return found if isinstance(found, Recovery) else None


def recovery_for_task_name(name: str) -> Recovery | None:
    """The installation that should record a publish of task ``name``.

    Publish signals do not say which app sent them.  With one installed app
    (the usual case) that is the answer; otherwise the app that registers the
    task name, else the current app.
    """
    installed = _installed
    if len(installed) == 1:
        return installed[0]
    for recovery in installed:
        if name in recovery.app.tasks:
            return recovery
    from celery import current_app

    return recovery_for_app(current_app._get_current_object())


def installed() -> list[Recovery]:
    """Every installation in this process."""
    return list(_installed)
