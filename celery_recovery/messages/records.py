"""Turn a published message or a running request into a task record.

Arguments are stored as JSON in kombu's encoding (the one Celery's default
serializer uses, so dates, UUIDs and decimals survive), never pickled.  A task
whose arguments cannot be stored is still published and run; its record says
why it cannot be published again.
"""

from __future__ import annotations

import json.encoder
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from kombu.utils.json import JSONEncoder as KombuJSONEncoder

from celery_recovery.core.process_id import HOSTNAME, current_pid
from celery_recovery.core.records import COMPLETE_WHEN_WRITTEN
from celery_recovery.core.states import TaskState
from celery_recovery.core.timeutils import as_utc, from_timestamp
from celery_recovery.messages.headers import (
    PUBLISHED_AT_HEADER,
    PUBLISHED_ON_HEADER,
    RESENT_HEADER,
    RESERVED_AT_HEADER,
)
from celery_recovery.messages.result_backends import route_of, routes_replies
from celery_recovery.store import EncodedJSON

#: Largest encoded argument payload kept for re-publishing, in bytes.
MAX_RECORDED_PAYLOAD = 1024 * 1024

#: Headers Celery sets itself on every publish; everything else is the user's own.
#: One of these at None says what its absence says (a republish reads them with
#: ``get()`` and leaves out options at None), so a record leaves it out: five of
#: the twelve headers a usual message keeps, encoded, sent and stored for every
#: task.  A custom header at None is kept (the task reads it from its request).
PROTOCOL_HEADERS = frozenset(
    {
        "lang",
        "task",
        "id",
        "shadow",
        "eta",
        "expires",
        "group",
        "group_index",
        "retries",
        "timelimit",
        "root_id",
        "parent_id",
        "argsrepr",
        "kwargsrepr",
        "origin",
        "ignore_result",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
    }
)
#: Headers that are columns of their own, or are rebuilt when the task is published again.
_HEADERS_NOT_KEPT = frozenset(
    {
        "id",
        "task",
        "retries",
        "argsrepr",
        "kwargsrepr",
        "eta",
        "expires",
        PUBLISHED_AT_HEADER,
        PUBLISHED_ON_HEADER,
        RESENT_HEADER,
        RESERVED_AT_HEADER,
    }
)
#: Request attributes kept as headers when a worker creates the record.
_REQUEST_HEADERS = ("root_id", "parent_id", "group", "group_index", "shadow", "origin")


#: kombu's encoder, as ``kombu.utils.json.dumps`` makes it on every call (with
#: defaults); made once, since encoding runs twice per task on the hot path.
#: ``encode`` keeps no state between calls, so threads may share it.
_ENCODER = KombuJSONEncoder()


def _one_shot_encoder() -> Callable[[Any], str]:
    """``_ENCODER.encode`` without its per-call set-up.

    ``JSONEncoder.encode`` builds a new C encoder on every call, which costs more
    than encoding a task's usual arguments.  This builds one, with the same
    settings and ``default``, and keeps it; without a circular-reference check
    it holds no state between calls, so threads may share it (a circular value
    fails with ``RecursionError`` instead of ``ValueError``).  Where the C
    encoder is missing or takes other arguments, ``_ENCODER.encode`` is used.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    try:
        iterencode = make(
            None,  # no circular check: no state kept between calls
            _ENCODER.default,
            json.encoder.encode_basestring_ascii,  # ensure_ascii, as kombu's default
            None,
            _ENCODER.key_separator,
            _ENCODER.item_separator,
            False,
            False,
            True,
        )
        if "".join(iterencode({"a": [1, 2.5, None, True]}, 0)) != _ENCODER.encode(
            {"a": [1, 2.5, None, True]}
        ):
            return _ENCODER.encode
    except TypeError:  # another Python's C encoder signature
        return _ENCODER.encode

    def encode(value: Any) -> str:
        return "".join(iterencode(value, 0))

    return encode


_encode = _one_shot_encoder()
#: The encoded ``{"embed": {...}}`` of messages without callbacks, chain or chord,
#: by their key order.
_EMPTY_EMBEDS: dict[tuple[str, ...], EncodedJSON] = {}
_EMPTY_KWARGS = EncodedJSON("{}")


def encode_json(value: Any) -> tuple[EncodedJSON | None, str | None]:
    """``value`` encoded as JSON in kombu's encoding, or ``(None, reason)``."""
    try:
        text = _encode(value)
    except (TypeError, ValueError) as exc:
        return None, f"not JSON-serialisable ({type(exc).__name__}: {exc})"
    except RecursionError:
        return None, "not JSON-serialisable (it refers to itself, or is nested too deeply)"
    if len(text) > MAX_RECORDED_PAYLOAD:
        return None, f"{len(text)} bytes, over the {MAX_RECORDED_PAYLOAD} bytes kept for re-publish"
    return EncodedJSON(text), None


def _encode_payload(
    args: Any, kwargs: Any, embed: Any
) -> tuple[tuple[EncodedJSON, EncodedJSON, EncodedJSON] | None, str | None]:
    """``args`` (a list or tuple), ``kwargs`` and ``embed`` encoded, or ``(None, reason)``;
    the usual empty ``kwargs`` and ``embed`` without encoding them again."""
    if not isinstance(args, list | tuple):
        args = list(args or ())
    encoded_args, reason = encode_json(args)
    if encoded_args is None:
        return None, reason
    if kwargs:
        encoded_kwargs, reason = encode_json(kwargs if isinstance(kwargs, dict) else dict(kwargs))
        if encoded_kwargs is None:
            return None, reason
    else:
        encoded_kwargs = _EMPTY_KWARGS
    encoded_embed, reason = _encode_embed(embed)
    if encoded_embed is None:
        return None, reason
    size = len(encoded_args) + len(encoded_kwargs) + len(encoded_embed)
    if size > MAX_RECORDED_PAYLOAD:
        return None, f"{size} bytes, over the {MAX_RECORDED_PAYLOAD} bytes kept for re-publish"
    return (encoded_args, encoded_kwargs, encoded_embed), None


def _encode_embed(value: Any) -> tuple[EncodedJSON | None, str | None]:
    """``{"embed": value}`` encoded; one without callbacks, chain or chord from a cache."""
    if isinstance(value, dict) and all(v is None for v in value.values()):
        key = tuple(value)
        encoded = _EMPTY_EMBEDS.get(key)
        if encoded is None and len(_EMPTY_EMBEDS) < 16:
            encoded, _ = encode_json({"embed": value})
            if encoded is not None:
                _EMPTY_EMBEDS[key] = encoded
        if encoded is not None:
            return encoded, None
    return encode_json({"embed": value})


#: What a publish handler keeps of a message as it is published (see :func:`capture_publish`):
#: (task id, task name, retries, payload or None, why not, headers, exchange,
#: routing key, queue, priority, published at as a POSIX timestamp).
PublishCapture = tuple[
    str, str, int, Any, "str | None", dict, "str | None", "str | None", "str | None", Any, float
]


def capture_publish(
    headers: Mapping[str, Any],
    body: Any,
    exchange: str | None,
    routing_key: str | None,
    declare: Sequence[Any] | None,
    properties: Mapping[str, Any] | None,
    published: float,
    keep_route: bool = False,
) -> PublishCapture | None:
    """What the ``queued`` record of a message about to be published needs (protocol 2),
    taken while the publisher waits: the arguments are encoded now, since the caller may
    change them once ``apply_async`` returns, and the headers are copied; the record is
    built from this later by :func:`record_from_capture`, in the writer's thread.

    ``keep_route``: the result backend replies to the caller's queue (``rpc://``), so
    the copy also keeps the message's ``reply_to`` and ``correlation_id``."""
    task_id, name = headers.get("id"), headers.get("task")
    if not task_id or not name or not isinstance(body, tuple | list) or len(body) != 3:
        return None
    args, kwargs, embed = body
    payload, reason = _encode_payload(args, kwargs, embed)
    kept = dict(headers)
    if keep_route and properties:
        kept.update(route_of(properties.get("reply_to"), properties.get("correlation_id"), task_id))
    return (
        task_id,
        name,
        int(headers.get("retries") or 0),
        payload,
        reason,
        kept,
        exchange,
        routing_key,
        _queue_name(declare, exchange, routing_key),
        properties.get("priority") if properties else None,
        published,
    )


def record_from_capture(capture: PublishCapture) -> dict[str, Any]:
    """The ``queued`` record of a captured publish."""
    (task_id, name, retries, payload, reason, headers, exchange, routing_key, queue, priority,
     published) = capture  # fmt: skip
    kept_headers, header_reason = encode_json(
        {
            k: v
            for k, v in headers.items()
            if k not in _HEADERS_NOT_KEPT and (v is not None or k not in PROTOCOL_HEADERS)
        }
    )
    why = f"arguments are {reason}" if reason else None
    if why is None and header_reason:
        payload, why = None, f"headers are {header_reason}"
    # The header's instant to the microsecond, as a worker that creates the try first
    # also records it: the publisher's later update then leaves every indexed column
    # as it was, so PostgreSQL can make it a HOT update.
    now = from_timestamp(published)
    eta, expires = headers.get("eta"), headers.get("expires")
    record = _base(task_id, retries + 1, name, TaskState.QUEUED, now)
    record.update(
        queue=queue,
        exchange=exchange,
        routing_key=routing_key,
        priority=priority,
        headers=kept_headers,
        eta=None if eta is None else as_utc(eta),
        expires=None if expires is None else as_utc(expires),
        queued_at=now,
    )
    _set_payload(record, payload, why)
    return record


def record_from_request(
    task: Any, now: datetime, job_id: str | None, request: Any = None
) -> dict[str, Any]:
    """The ``running`` record of a request a worker is about to execute (``request`` is
    ``task.request``, passed by a caller that already read it)."""
    if request is None:
        request = task.request
    record = _running(task, request, now, job_id)
    published = getattr(request, PUBLISHED_AT_HEADER, None)
    if isinstance(published, int | float):
        # The publisher's queued_at, to the microsecond: when this claim creates the try,
        # the publisher's later write changes no indexed column (a HOT update).
        record["queued_at"] = from_timestamp(published)
    _set_request_message(record, request, routes_replies(getattr(task, "backend", None)))
    return record


def _running(task: Any, request: Any, now: datetime, job_id: str | None) -> dict[str, Any]:
    """What every ``running`` record of a request holds: the try, and who runs it since when."""
    record = _base(request.id, (request.retries or 0) + 1, task.name, TaskState.RUNNING, now)
    record.update(
        job_id=job_id,
        worker_hostname=request.hostname,
        worker_pid=current_pid(),
        started_at=now,
    )
    return record


def _set_request_message(record: dict[str, Any], request: Any, keep_route: bool) -> None:
    """Set on ``record`` the message a running request came in: what publishes it again
    (with ``keep_route``, also where its result goes: see :func:`capture_publish`)."""
    delivery = request.delivery_info or {}
    payload, reason = _encode_payload(
        request.args,
        request.kwargs,
        {
            "callbacks": request.callbacks,
            "errbacks": request.errbacks,
            "chain": request.chain,
            "chord": request.chord,
        },
    )
    headers = {
        name: value
        for name in _REQUEST_HEADERS
        if (value := getattr(request, name, None)) is not None
    }
    if keep_route:
        headers.update(
            route_of(
                getattr(request, "reply_to", None),
                getattr(request, "correlation_id", None),
                request.id,
            )
        )
    kept_headers, _ = encode_json(headers)
    routing_key = delivery.get("routing_key")
    exchange = delivery.get("exchange")
    eta, expires = request.eta, request.expires
    record.update(
        queue=routing_key if not exchange else None,
        exchange=exchange,
        routing_key=routing_key,
        priority=delivery.get("priority"),
        headers=kept_headers,
        eta=None if eta is None else as_utc(eta),
        expires=None if expires is None else as_utc(expires),
    )
    _set_payload(record, payload, reason and f"arguments are {reason}")


#: Why a try created by a worker's narrow claim cannot be published again (until the
#: publisher's record, which carries the message, reaches the store).
AWAITING_PUBLISHER = (
    "cannot be published again: the publisher's record of its message has not reached the store"
)


#: Seconds after its publish from which a delivery's claim leaves the message out.
#: A publisher's record waits up to its writer's flush interval (0.15 s) before it
#: is committed, and a worker that publishes tasks (a chord body, a chain's next
#: step) and runs them may die with that record still in its buffer: a claim made
#: sooner carries the message, so the try stays publishable again.
NARROW_CLAIM_AFTER = 1.0


def published_alongside(request: Any, now: float) -> bool:
    """True when the delivery's publisher is a job on this host and published it less
    than :data:`NARROW_CLAIM_AFTER` ago: its record may still be in a buffer that
    dies with this host, and so may this delivery's buffered claim.

    A worker that publishes a task (a chain's next step, a chord's header) often
    starts it at once in a sibling process; if the worker dies a moment later, the
    message is acknowledged (early ack), the claim waits in the writer (20 ms) and
    the publisher's record in its own (150 ms): nothing would know of the try.
    Such a claim is committed before the body runs.
    """
    if getattr(request, PUBLISHED_ON_HEADER, None) != HOSTNAME:
        return False
    published = getattr(request, PUBLISHED_AT_HEADER, None)
    return isinstance(published, int | float) and now - published < NARROW_CLAIM_AFTER


#: States in which a try is never published again: a claim that already holds one
#: when it is written needs no message.
_ENDED_FOR_GOOD = frozenset({TaskState.SUCCESS, TaskState.FAILED})


def claim_from_request(
    task: Any,
    now: datetime,
    job_id: str | None,
    request: Any = None,
    *,
    message_when_written: bool = False,
) -> dict[str, Any]:
    """The ``running`` claim of a request a worker is about to execute.

    A message stamped with our published-at header has a publisher that records
    it (see :mod:`celery_recovery.signals.publish`); once it is older than
    :data:`NARROW_CLAIM_AFTER` that record has been committed (unless its
    publisher died or the store is failing), so the claim carries only what
    the worker knows: the message is sent to the store once, by its publisher.
    A narrow claim that still finds no try creates it without its message, not
    publishable again until the publisher's record lands.  An unstamped message
    (a publisher without celery-recovery) is claimed with the whole message, and
    so is a fresher one, unless ``message_when_written``: the claim is then
    narrow and the write-behind writer adds the message when it writes the claim,
    only if the try has not ended for good by then (see :func:`_add_message`).

    ``request`` is ``task.request``, passed by a caller that already read it.
    """
    if request is None:
        request = task.request
    published = getattr(request, PUBLISHED_AT_HEADER, None)
    if not isinstance(published, int | float):
        return record_from_request(task, now, job_id, request)
    fresh = now.timestamp() - published < NARROW_CLAIM_AFTER
    if fresh and not message_when_written:
        return record_from_request(task, now, job_id, request)
    record = _running(task, request, now, job_id)
    record.update(
        # The publisher's queued_at, to the microsecond (see record_from_request).
        queued_at=from_timestamp(published),
        republishable=False,
        republish_error=AWAITING_PUBLISHER,
    )
    if fresh:
        record[COMPLETE_WHEN_WRITTEN] = partial(
            _add_message, request, routes_replies(getattr(task, "backend", None))
        )
    return record


def _add_message(request: Any, keep_route: bool, claim: dict[str, Any]) -> None:
    """Give a fresh delivery's narrow claim its message, as the writer's thread takes it.

    Most tasks have ended by then (their outcome is folded into the claim): a try
    that succeeded or failed is never published again, so its row needs no message
    and none is encoded, sent or parsed; its publisher's record brings it.  A try
    still running (or sent back to the queue) keeps what it needs to be published
    again should its process and its publisher's buffered record both be lost.  The
    arguments are then read while the body may run: a body that changes an
    argument's contents in place within the claim interval (20 ms) leaves that
    change in this copy, which only a republish after both losses would use.
    """
    if claim["state"] not in _ENDED_FOR_GOOD:
        _set_request_message(claim, request, keep_route)


def try_number_of(request: Any) -> int:
    """Celery's ``retries`` counter as our 1-based try number."""
    return int(getattr(request, "retries", 0) or 0) + 1


def _base(task_id: str, try_number: int, name: str, state: TaskState, now: datetime) -> dict:
    return {
        "task_id": task_id,
        "try_number": try_number,
        "task_name": name,
        "state": state,
        "external_executor_id": task_id,
        "updated_at": now,
    }


def _set_payload(record: dict[str, Any], payload: Any, why: str | None) -> None:
    if payload is None:
        record.update(
            args=None,
            kwargs=None,
            options=None,
            republishable=False,
            republish_error=f"cannot be published again: {why}",
        )
        return
    record.update(
        args=payload[0],
        kwargs=payload[1],
        options=payload[2],
        republishable=True,
        republish_error=None,
    )


def _queue_name(
    declare: Sequence[Any] | None, exchange: str | None, routing_key: str | None
) -> str | None:
    for queue in declare or ():
        name = getattr(queue, "name", None)
        if name:
            return str(name)
    # Celery publishes to a queue through the default exchange with its name as key.
    return routing_key if not exchange else None
