"""Revoked, expired and purged tasks: never published again by the lost-message sweep.

Celery's revoke is a broadcast kept in the memory of the workers alive at that
moment, and a purge deletes waiting messages from the broker: neither leaves
anything in our store.  A worker that meets a revoked or expired message
discards it and sends ``task_revoked`` (recorded as ``revoked``), but a message
no worker meets again (purged, or still queued when the workers stop) would
leave its try ``queued``, and the lost-message sweep would publish it again
once overdue.

So the app's control object records (:mod:`celery_recovery.signals.control`),
after the broadcast or purge succeeded, every ``revoke`` (by id, so also ``AsyncResult.revoke``),
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

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from kombu.utils.functional import maybe_list


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
