"""What each kind of result backend lets recovery know, and how its results reach the caller.

**Asking.**  A sweep asks the result backend what became of a try whose worker
died (:mod:`celery_recovery.messages.backend_probe`).  Two kinds cannot answer for a task that
another process sent or ran: no backend at all (Celery's default, a
``DisabledBackend``), and ``rpc://``, which keeps no shared state (each result
is a message in the caller's own reply queue: anyone else reads PENDING).
Recovery then goes on from what the store knows, and says so.

**Answering.**  Most result backends store a result under its task id, where any process finds
it: a try published again by another process needs nothing more.  The
``rpc://`` backend instead sends each state and result as a message to the
caller's own reply queue, named by the message's ``reply_to`` property and
matched by its ``correlation_id``.  A publish from a sweep, a triggerer or
beat would otherwise carry that process's own reply queue, and the caller's
``AsyncResult.get()`` would wait for ever; the same holds for a state the
sweep or the triggerer stores for the caller (a failure, a trigger's result).

So, where the app's backend routes results this way, a try's record keeps the
two properties (under names no message header uses), and every process that
publishes the try again or stores its outcome sends them along.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery.app.task import Context
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend

from celery_recovery.messages.headers import CORRELATION_ID_KEY, REPLY_TO_KEY


def unaskable_because(backend: Any) -> str | None:
    """Why ``backend`` cannot tell another process what became of a task; None when it can."""
    if isinstance(backend, DisabledBackend):
        return "no result backend is configured"
    if isinstance(backend, RPCBackend):
        return "the rpc:// result backend answers only the process that sent the task"
    return None


def routes_replies(backend: Any) -> bool:
    """Whether ``backend`` sends results to the caller's reply queue (``rpc://``)."""
    return isinstance(backend, RPCBackend)


def route_of(reply_to: Any, correlation_id: Any, task_id: str) -> dict[str, str]:
    """The record keys that keep a message's reply route (none when it has none)."""
    route: dict[str, str] = {}
    if reply_to:
        route[REPLY_TO_KEY] = str(reply_to)
    if correlation_id and correlation_id != task_id:
        route[CORRELATION_ID_KEY] = str(correlation_id)
    return route


def publish_options(headers: Mapping[str, Any]) -> dict[str, str]:
    """The ``send_task`` options that send a try published again along its caller's route."""
    options: dict[str, str] = {}
    if headers.get(REPLY_TO_KEY):
        options["reply_to"] = str(headers[REPLY_TO_KEY])
    if headers.get(CORRELATION_ID_KEY):
        options["correlation_id"] = str(headers[CORRELATION_ID_KEY])
    return options


def caller_request(task_id: str, headers: Mapping[str, Any] | None) -> Context | None:
    """A request that makes ``backend.store_result`` (or ``mark_as_failure``), called from
    a process that is not running the task, reach the caller; None when the record
    keeps no route (a backend that stores by task id needs no request)."""
    if not headers or not headers.get(REPLY_TO_KEY):
        return None
    return Context(
        id=task_id,
        reply_to=str(headers[REPLY_TO_KEY]),
        correlation_id=str(headers.get(CORRELATION_ID_KEY) or task_id),
    )
