"""Publisher side: a published task becomes a ``queued`` try.

``before_task_publish`` sees the queue and message properties; the record is
only handed to the writer at ``after_task_publish``, so a publish that fails
(the caller sees the exception) leaves no record to re-send.  The handlers
run while the caller waits for ``apply_async``, so they only take what must be
taken then (the arguments, encoded before the caller can change them, and a
copy of the headers); the writer's thread builds the record.  Each catches its
own errors (:func:`~celery_recovery.signals.guard.handler_failed`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from celery.signals import after_task_publish, before_task_publish

from celery_recovery.core.process_id import HOSTNAME
from celery_recovery.core.records import WriteKind
from celery_recovery.messages.headers import (
    PUBLISHED_AT_HEADER,
    PUBLISHED_ON_HEADER,
    RESENT_HEADER,
)
from celery_recovery.messages.records import capture_publish, record_from_capture
from celery_recovery.messages.resends import resent_hops
from celery_recovery.runtime.context import context_for_task_name
from celery_recovery.signals.guard import handler_failed

_staged = threading.local()


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
    try:
        _stage(sender, body, exchange, routing_key, headers, properties, declare)
    except Exception:
        _staged.capture = None
        handler_failed("on_before_publish")


def _stage(
    sender: str | None,
    body: Any,
    exchange: str | None,
    routing_key: str | None,
    headers: dict[str, Any] | None,
    properties: dict[str, Any] | None,
    declare: Any,
) -> None:
    _staged.capture = None
    if not headers:
        return
    context = context_for_task_name(str(sender))
    if context is None:
        return
    exclusions = context.exclusions
    if exclusions and exclusions.message(str(sender), _routed_to(routing_key, declare)):
        return
    published = time.time()
    capture = capture_publish(
        headers,
        body,
        exchange,
        routing_key,
        declare,
        properties,
        published,
        keep_route=context.routes_replies,
    )
    if capture is None:
        return  # not a message we can record (protocol 1): no stamp either
    # Lets a worker tell an old message (maybe one the sweep replaced) from a fresh one
    # without asking the store on every task, and tells it that this publisher records
    # the message, so its claim need not send the message again.
    headers[PUBLISHED_AT_HEADER] = published
    if context.runtime.job_id is not None:
        # A worker process, beat or a triggerer: this host's loss takes its buffered
        # record, so a delivery started here soon after claims before its body.
        headers[PUBLISHED_ON_HEADER] = HOSTNAME
    else:
        # Stamps copied with another message's headers are not this publisher's.
        headers.pop(PUBLISHED_ON_HEADER, None)
    # Sent by a run that may repeat an earlier one (or a beat sending a run again):
    # its worker checks it first.  A mark copied from another message is dropped.
    hops = resent_hops(context.app, headers.get("id"))
    if hops is None:
        headers.pop(RESENT_HEADER, None)
    else:
        headers[RESENT_HEADER] = hops
    _staged.capture = (capture, context.runtime.writer)


def _routed_to(routing_key: str | None, declare: Any) -> list[str | None]:
    """Where a message goes: its routing key and the queues declared for it."""
    return [routing_key, *(getattr(queue, "name", None) for queue in declare or ())]


def on_after_publish(sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any):
    try:
        staged = getattr(_staged, "capture", None)
        if staged is None:
            return
        _staged.capture = None
        capture, writer = staged
        if headers and headers.get("id") == capture[0]:
            writer.submit_built(WriteKind.QUEUED, record_from_capture, capture)
    except Exception:
        handler_failed("on_after_publish")


def connect() -> None:
    before_task_publish.connect(on_before_publish, weak=False, dispatch_uid=__name__ + ".before")
    after_task_publish.connect(on_after_publish, weak=False, dispatch_uid=__name__ + ".after")
