"""Revoked, expired and purged tasks: never published again by the lost-message sweep.

Celery's revoke is a broadcast kept in the memory of the workers alive at that
moment, and a purge deletes waiting messages from the broker: neither leaves
anything in our store.  A worker that meets a revoked or expired message
discards it and sends ``task_revoked`` (recorded as ``revoked``), but a message
no worker meets again (purged, or still queued when the workers stop) would
leave its try ``queued``, and the lost-message sweep would publish it again
once overdue.

So the app's control object records, after the broadcast or purge succeeded,
every ``revoke`` (by id, so also ``AsyncResult.revoke``),
``revoke_by_stamped_headers`` and ``purge``; the ``celery purge`` command
records the queues it purged.  Before publishing an overdue try again the sweep
asks :func:`revoked_because`: a try that is revoked, stamped with a revoked
header, past its ``expires``, or was waiting in a queue when it was purged is
moved ``queued`` → ``revoked`` (compare-and-set) instead.  Such a "revoked by
the sweep" try stays claimable: if a worker does get the message after all
(reserved by a worker when the purge ran, or a worker that never heard the
revoke), the delivery runs and is recorded as usual, as Celery would run it.

What we cannot see: revokes and purges made by a process without Recovery
installed for that broker, purges made outside Celery (``redis-cli DEL``,
``rabbitmqctl purge_queue``), and messages a broker dropped on its own.  Those
tries are still published again after ``recovery_queued_timeout``; a worker that
still holds the revoke in memory discards the new message.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from kombu.utils.functional import maybe_list

from .errors import StoreError
from .recovery import installed, recovery_for_app
from .timeutils import utcnow

logger = logging.getLogger("celery_recovery.revocations")

_WRAPPED = "_celery_recovery_wrapped"


def install_control_hooks() -> None:
    """Record revokes and purges made through any app's control object (once per process)."""
    from celery.app.control import Control

    _wrap(Control, "revoke", _revoke_rows)
    _wrap(Control, "revoke_by_stamped_headers", _stamp_rows)
    _wrap(Control, "purge", _purge_rows)
    _wrap_purge_command()


def revoked_because(
    record: Mapping[str, Any], revocations: Iterable[Mapping[str, Any]], now: datetime
) -> str | None:
    """Why an overdue queued try must not be published again, or None.

    Mirrors what a worker checks before running a message (``Request.revoked``):
    its ``expires``, its id, its stamped headers; plus the purges of its queue
    made after it was published.
    """
    expires = record.get("expires")
    if expires is not None and expires <= now:
        return f"expired at {_at(expires)} before it ran"
    headers = record.get("headers")
    headers = headers if isinstance(headers, dict) else {}
    for row in revocations:
        kind = row["kind"]
        if kind == "task" and row["task_id"] == record["task_id"]:
            return f"revoked at {_at(row['created_at'])} (app.control.revoke)"
        if kind == "stamp" and _stamp_matches(headers, row["header"], row["value"]):
            return (
                f"revoked at {_at(row['created_at'])} by stamped header "
                f"{row['header']}={row['value']!r} (app.control.revoke_by_stamped_headers)"
            )
        queued_at = record.get("queued_at")
        if (
            kind == "purge"
            and row["queue"] == record.get("queue")
            and queued_at is not None
            and queued_at < row["created_at"]
        ):
            return f"purged from queue {row['queue']!r} at {_at(row['created_at'])}"
    return None


def _stamp_matches(headers: Mapping[str, Any], header: str, revoked: Any) -> bool:
    if header not in (headers.get("stamped_headers") or ()):
        return False
    stamped = (headers.get("stamps") or {}).get(header)
    if stamped is None:
        return False
    revoked_values = maybe_list(revoked) or []
    if isinstance(stamped, list | tuple):
        return any(value in revoked_values for value in stamped)
    return stamped in revoked_values or stamped == revoked


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


# -- recording ------------------------------------------------------------------------------


def _wrap(cls: type, name: str, rows: Callable[..., list[dict[str, Any]]]) -> None:
    original = getattr(cls, name)
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _record(self.app, lambda: rows(self, *args, **kwargs), name)
        return result

    setattr(recorded, _WRAPPED, True)
    setattr(cls, name, recorded)


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
    """``celery purge`` empties queues through the connection, not the control object."""
    try:
        from celery.bin.purge import purge as command
    except ImportError:  # pragma: no cover - Celery without its command line
        return
    original = command.callback
    if original is None or getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        import click

        result = original(*args, **kwargs)
        app = click.get_current_context().find_root().obj.app
        names = set(kwargs.get("queues") or app.amqp.queues.keys())
        names -= set(kwargs.get("exclude_queues") or ())
        _record(app, lambda: [{"kind": "purge", "queue": str(n)} for n in sorted(names)], "purge")
        return result

    setattr(recorded, _WRAPPED, True)
    command.callback = recorded


def _record(app: Any, rows: Callable[[], list[dict[str, Any]]], what: str) -> None:
    """Store the rows for the installation that records this app's broker; never raises."""
    recovery = _recovery_for(app)
    if recovery is None:
        return
    try:
        now = utcnow()
        recovery.store.record_revocations([{**row, "created_at": now} for row in rows()])
    except StoreError as exc:
        # The revoke or purge itself happened: only its record is missing, and a
        # worker that heard the revoke still discards a message published again.
        recovery.runtime.health.record_failure(exc, f"recording a {what}")
    except Exception:
        logger.exception("celery-recovery: could not record a %s", what)


def _recovery_for(app: Any) -> Any:
    """The installation of ``app``, else the one for an app on the same broker.

    A process may build a second app object from the same configuration (test
    fixtures, scripts); its tasks' publishes are recorded by the one
    installation too (see :func:`~celery_recovery.recovery.recovery_for_task_name`).
    """
    found = recovery_for_app(app)
    if found is not None:
        return found
    broker = _broker_of(app)
    for recovery in installed():
        if broker is not None and _broker_of(recovery.app) == broker:
            return recovery
    return None


def _broker_of(app: Any) -> str | None:
    try:
        return str(app.conf.broker_url or "")
    except Exception:
        return None
