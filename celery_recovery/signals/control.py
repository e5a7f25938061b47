"""Publisher side: revokes and purges made through an app's control object are recorded.

Celery sends no signal for them, so :func:`connect` wraps the methods of
:class:`celery.app.control.Control` (``revoke``, ``revoke_by_stamped_headers``,
``purge``) and the ``celery purge`` command, once per process.  The rows are
written after the call succeeded; the lost-message sweep reads them (see
:mod:`celery_recovery.sweeps.revocations`).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from kombu.utils.functional import maybe_list

from celery_recovery.core.errors import StoreError
from celery_recovery.core.patching import wrap_once
from celery_recovery.core.timeutils import utcnow
from celery_recovery.runtime.context import context_for_app, installed

logger = logging.getLogger("celery_recovery.signals")


def connect() -> None:
    """Record revokes and purges made through any app's control object (idempotent)."""
    from celery.app.control import Control

    _wrap(Control, "revoke", _revoke_rows)
    _wrap(Control, "revoke_by_stamped_headers", _stamp_rows)
    _wrap(Control, "purge", _purge_rows)
    _wrap_purge_command()


def _wrap(cls: type, name: str, rows: Callable[..., list[dict[str, Any]]]) -> None:
    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            _record(self.app, lambda: rows(self, *args, **kwargs), name)
            return result

        return recorded

    wrap_once(cls, name, wrap)


def _revoke_rows(control: Any, task_id: Any, *_: Any, **__: Any) -> list[dict[str, Any]]:
    return [{"kind": "task", "task_id": str(t)} for t in maybe_list(task_id) or ()]


def _stamp_rows(control: Any, headers: Any, *_: Any, **__: Any) -> list[dict[str, Any]]:
    if isinstance(headers, list):  # Celery accepts ["name=value", ...] too
        headers = dict(h.split("=", 1) for h in headers)
    return [
        {"kind": "stamp", "header": str(header), "value": values}
        for header, values in dict(headers or {}).items()
    ]


def _purge_rows(control: Any, *_: Any, **__: Any) -> list[dict[str, Any]]:
    # Control.purge empties the queues the app consumes from (``TaskConsumer``'s default).
    names = control.app.amqp.queues.consume_from.keys()
    return [{"kind": "purge", "queue": str(name)} for name in names]


def _wrap_purge_command() -> None:
    """``celery purge`` empties queues through the connection, not the control object.

    Only where Celery's command line is loaded: ``celery -A app purge`` imports its
    commands before it loads the app (and so installs this).  Importing it here
    would bring Click, Pygments and Celery's commands (about 10,000 objects) into
    every process that publishes tasks, for a command it never runs.
    """
    command_module = sys.modules.get("celery.bin.purge")
    if command_module is None:
        return
    command = command_module.purge
    if command.callback is None:
        return

    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            import click

            result = original(*args, **kwargs)
            app = click.get_current_context().find_root().obj.app
            names = set(kwargs.get("queues") or app.amqp.queues.keys())
            names -= set(kwargs.get("exclude_queues") or ())

            def rows() -> list[dict[str, Any]]:
                return [{"kind": "purge", "queue": str(n)} for n in sorted(names)]

            _record(app, rows, "purge")
            return result

        return recorded

    wrap_once(command, "callback", wrap)


def _record(app: Any, rows: Callable[[], list[dict[str, Any]]], what: str) -> None:
    """Store the rows for the installation that records this app's broker; never raises."""
    context = _recovery_for(app)
    if context is None:
        return
    try:
        now = utcnow()
        context.store.revocations.record_revocations([{**row, "created_at": now} for row in rows()])
    except StoreError as exc:
        # The revoke or purge itself happened: only its record is missing, and a
        # worker that heard the revoke still discards a message published again.
        context.runtime.health.record_failure(exc, f"recording a {what}")
    except Exception:
        logger.exception("celery-recovery: could not record a %s", what)


def _recovery_for(app: Any) -> Any:
    """The installation of ``app``, else the one for an app on the same broker.

    A process may build a second app object from the same configuration (test
    fixtures, scripts); its tasks' publishes are recorded by the one
    installation too (see :func:`~celery_recovery.runtime.context.context_for_task_name`).
    """
    found = context_for_app(app)
    if found is not None:
        return found
    broker = _broker_of(app)
    for context in installed():
        if broker is not None and _broker_of(context.app) == broker:
            return context
    return None


def _broker_of(app: Any) -> str | None:
    try:
        return str(app.conf.broker_url or "")
    except Exception:
        return None
