"""``Recovery(app)``: the one call that installs celery-recovery into a Celery app."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import Celery

from celery_recovery import signals, task_heartbeats
from celery_recovery.core.records import SweepReport
from celery_recovery.core.settings import RecoverySettings
from celery_recovery.deliveries.canvas import install_chord_body_once
from celery_recovery.runtime.context import RecoveryContext, install, uninstall
from celery_recovery.runtime.process import ProcessRuntime
from celery_recovery.signals.reservations import ForgetReservationsOnReconnect
from celery_recovery.signals.tasks import hook_task_classes
from celery_recovery.store import Store
from celery_recovery.sweeps.fallback import SweepFallback
from celery_recovery.sweeps.marker_watch import MarkerWatch, start_marker_watch, stop_marker_watch
from celery_recovery.sweeps.retention import register_clean_task
from celery_recovery.sweeps.runner import run_sweep
from celery_recovery.sweeps.tasks import register_sweep_task

logger = logging.getLogger("celery_recovery")

_ATTRIBUTE = "_celery_recovery"


class Recovery:
    """Recovery guarantees for one Celery app.

    ``Recovery(app)`` reads and validates the ``recovery_*`` settings (see
    :mod:`celery_recovery.core.settings`; ``overrides`` take precedence over
    ``app.conf`` and ``CELERY_RECOVERY_*`` environment variables), and connects
    the signal handlers that record jobs, heartbeats and task lifecycles.
    Calling it again for the same app returns the instance already installed
    and changes nothing.

    Configure the app (``app.conf`` / ``config_from_object``) before calling it.
    """

    context: RecoveryContext

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
        settings = RecoverySettings.from_app(app, **overrides)
        self.context = context = RecoveryContext(
            app, settings, Store(settings.database_url, settings.database_pooler)
        )
        context.worker_beat_duty = functools.partial(SweepFallback, context)
        setattr(app, _ATTRIBUTE, self)
        install(context)
        signals.connect()
        task_heartbeats.connect()
        # A worker that loses its broker connection forgets the messages it reserved.
        app.steps["consumer"].add(ForgetReservationsOnReconnect)
        register_sweep_task(context)
        register_clean_task(context)
        hook_task_classes(context)
        install_chord_body_once(context)
        logger.debug("celery-recovery installed on app %r, store %s", app.main, context.store)

    def __repr__(self) -> str:
        return f"<Recovery app={self.app.main!r} store={self.settings.masked_database_url}>"

    @property
    def app(self) -> Celery:
        return self.context.app

    @property
    def settings(self) -> RecoverySettings:
        """The validated ``recovery_*`` settings of this installation."""
        return self.context.settings

    @property
    def store(self) -> Store:
        """The metadata store (PostgreSQL, or the embedded SQLite file)."""
        return self.context.store

    @property
    def runtime(self) -> ProcessRuntime:
        """This process's runtime (writer, store health, job); rebuilt after a fork."""
        return self.context.runtime

    @property
    def failure_listeners(self) -> list[Callable[..., Any]]:
        """Listeners registered with :meth:`add_failure_listener`."""
        return self.context.failure_listeners

    def sweep(self, now: datetime | None = None) -> SweepReport:
        """Run one recovery pass in this process and report what it found and did.

        Finds zombies (running tries whose worker stopped heartbeating), asks
        the result backend before touching them, retries or fails them,
        re-publishes lost messages, marks dead jobs and delivers the failure
        callbacks of tries it failed.  Safe to run in several processes at once.
        """
        return run_sweep(self.context, now)

    def watch_markers(self, on_deaths: Callable[[], Any] | None = None) -> MarkerWatch | None:
        """Start this process's marker watch (for a process that sweeps in a loop of its
        own; ``sweep --loop``, beat and the workers' fallback start theirs).

        Twice a second it checks every liveness marker it can (see
        :mod:`celery_recovery.sweeps.marker_watch`) and marks the jobs of dead processes
        failed; after a look that found one it calls ``on_deaths``, by default a
        :meth:`sweep` in its own thread.  None when ``recovery_liveness_markers`` is
        ``off``.
        """
        return start_marker_watch(self.context, on_deaths)

    def add_failure_listener(self, listener: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``listener(task_id=, task_name=, try_number=, kind=, exception=)``.

        It runs (from the sweep, under ``recovery_callback_timeout``) for every
        try a sweep failed (``kind="failure"``) or retried (``kind="retry"``)
        because its worker or message was lost, and for every try whose pool
        process died under a live worker (failed, or retried by Celery's
        ``task_retry_on_worker_lost``).  Usable as a decorator.
        """
        self.context.failure_listeners.append(listener)
        return listener

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until this process's buffered records are written; False on timeout."""
        return self.context.runtime.writer.flush(timeout)

    def close(self) -> None:
        """Stop this installation's marker watch, flush this process's records, end its
        job, and uninstall from the app."""
        stop_marker_watch(self.context)
        self.context.close_runtime()
        uninstall(self.context)
        if self.app.__dict__.get(_ATTRIBUTE) is self:
            delattr(self.app, _ATTRIBUTE)
        self.store.dispose()


def recovery_for_app(app: Any) -> Recovery | None:
    """The :class:`Recovery` installed on ``app``, if any."""
    found = getattr(app, "__dict__", {}).get(_ATTRIBUTE)
    return found if isinstance(found, Recovery) else None
