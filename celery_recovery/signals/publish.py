"""Publisher side: a published task becomes a ``queued`` try.

``before_task_publish`` sees the queue and message properties; the record is
only handed to the writer at ``after_task_publish``, so a publish that fails
(the caller sees the exception) leaves no record to re-send.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from celery.signals import after_task_publish, before_task_publish

from celery_recovery.context import context_for_task_name
from celery_recovery.core.records import WriteKind
from celery_recovery.core.timeutils import from_timestamp
from celery_recovery.messages import record_from_publish
from celery_recovery.republish import PUBLISHED_AT_HEADER
from celery_recovery.signals.guard import never_raises

_staged = threading.local()


@never_raises
def on_before_publish(
    sender: str | None = None,
    body: Any = None,
    exchange: str | None = None,
    routing_key: str | None = None,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    declare: Any = None,
    **_: Any,
) -> None:
    _staged.record = None
    if not headers or context_for_task_name(str(sender)) is None:
        return
    published = time.time()
    # The record's queued_at is the header's instant to the microsecond, as a worker that
    # creates the try first also records it: the publisher's later update then leaves
    # every indexed column as it was, so PostgreSQL can make it a HOT update.
    record = record_from_publish(
        headers, body, exchange, routing_key, declare, properties, from_timestamp(published)
    )
    if record is None:
        return  # not a message we can record (protocol 1): no stamp either
    # Lets a worker tell an old message (maybe one the sweep replaced) from a fresh one
    # without asking the store on every task, and tells it that this publisher records
    # the message, so its claim need not send the message again.
    headers[PUBLISHED_AT_HEADER] = published
    _staged.record = record


@never_raises
def on_after_publish(sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any):
    record = getattr(_staged, "record", None)
    _staged.record = None
    if record is None or not headers or headers.get("id") != record["task_id"]:
        return
    context = context_for_task_name(str(sender))
    if context is not None:
        context.runtime.write(WriteKind.QUEUED, record)


def connect() -> None:
    before_task_publish.connect(on_before_publish, weak=False, dispatch_uid=__name__ + ".before")
    after_task_publish.connect(on_after_publish, weak=False, dispatch_uid=__name__ + ".after")
