"""Publish a recorded task again, as the next try of the same task id.

This follows Celery's own retry convention: same task id, ``retries`` one
higher, the original queue or exchange and routing key, priority, ETA (while
it is still ahead), linked callbacks, chain, chord, ``ignore_result``, custom
headers, and the caller's reply route where the result backend needs it (``rpc://``).
The arguments come from the record's JSON; nothing is unpickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import Celery

from celery_recovery.core.timeutils import as_utc, utcnow
from celery_recovery.messages.dead_receives import delay_options
from celery_recovery.messages.headers import (
    PUBLISHED_AT_HEADER,
    RECEIVED_BEFORE_HEADER,
    RESERVED_AT_HEADER,
    ROUTE_KEYS,
)
from celery_recovery.messages.records import PROTOCOL_HEADERS
from celery_recovery.messages.result_backends import publish_options

#: What our handlers stamp on a message or a request: a new publish starts without them.
_STAMPS = (PUBLISHED_AT_HEADER, RESERVED_AT_HEADER, RECEIVED_BEFORE_HEADER)


def republish(
    app: Celery, record: Mapping[str, Any], try_number: int, broker_delay: int = 0
) -> Any:
    """Send ``record``'s task again as try ``try_number``; returns the AsyncResult.

    ``broker_delay`` seconds hold the message back on the broker (SQS only, see
    :mod:`celery_recovery.messages.dead_receives`)."""
    headers = dict(record.get("headers") or {})
    embed = (record.get("options") or {}).get("embed") or {}
    custom = {
        k: v
        for k, v in headers.items()
        if k not in PROTOCOL_HEADERS and k not in _STAMPS and k not in ROUTE_KEYS
    }
    timelimit = headers.get("timelimit") or (None, None)
    eta = as_utc(record.get("eta"))
    options: dict[str, Any] = {
        "task_id": record["task_id"],
        "retries": try_number - 1,
        "expires": as_utc(record.get("expires")),
        # An ETA or countdown task published again still waits for its time.
        "eta": eta if eta is not None and eta > utcnow() else None,
        "link": embed.get("callbacks"),
        "link_error": embed.get("errbacks"),
        "chain": embed.get("chain"),
        "chord": embed.get("chord"),
        "group_id": headers.get("group"),
        "group_index": headers.get("group_index"),
        "root_id": headers.get("root_id"),
        "parent_id": headers.get("parent_id"),
        "shadow": headers.get("shadow"),
        # As the caller published it (apply_async(ignore_result=True) stores no result).
        "ignore_result": headers.get("ignore_result"),
        "time_limit": timelimit[0],
        "soft_time_limit": timelimit[1],
        "priority": record.get("priority"),
        "headers": custom or None,
    }
    if record.get("queue"):
        options["queue"] = record["queue"]
    elif record.get("exchange") is not None and record.get("routing_key"):
        options["exchange"] = record["exchange"]
        options["routing_key"] = record["routing_key"]
    # Stamps travel as options named after their headers, as Celery's canvas sends them,
    # so a revoke by stamped header still reaches the message published again.
    stamped = [str(h) for h in headers.get("stamped_headers") or ()]
    if stamped:
        stamps = headers.get("stamps") or {}
        options.update({h: stamps.get(h) for h in stamped if h not in options})
        options["stamped_headers"] = stamped
    options = {k: v for k, v in options.items() if v is not None}
    # The caller's reply queue (rpc://): without it the result would go to this process.
    options.update(publish_options(headers))
    options.update(delay_options(broker_delay))
    return app.send_task(
        record["task_name"],
        args=record.get("args") or [],
        kwargs=record.get("kwargs") or {},
        **options,
    )
