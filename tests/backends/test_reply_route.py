"""A try published again, or failed by a sweep, keeps the route its result takes to the
caller when the result backend replies to the caller's queue (``rpc://``).

The publish goes through real Redis and is read back from the queue, as a worker
would receive it.
"""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from kombu.utils.json import loads as kombu_loads

from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.records import capture_publish, record_from_capture
from celery_recovery.messages.republish import republish
from celery_recovery.messages.result_backends import (
    CORRELATION_ID_KEY,
    REPLY_TO_KEY,
    caller_request,
    unaskable_because,
)
from tests.apps.lifecycle import create_app

EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def _captured_headers(properties: dict, keep_route: bool) -> dict:
    headers = {"id": "t1", "task": "app.add", "retries": 0, "lang": "py"}
    capture = capture_publish(
        headers, ((1,), {}, EMBED), "", "celery", None, properties, utcnow().timestamp(),
        keep_route=keep_route,
    )  # fmt: skip
    assert capture is not None
    return kombu_loads(record_from_capture(capture)["headers"])


def test_a_published_record_keeps_the_reply_route_only_where_results_take_it():
    properties = {"reply_to": "caller-queue", "correlation_id": "t1", "priority": 0}
    assert _captured_headers(properties, keep_route=True) == {
        "lang": "py",
        REPLY_TO_KEY: "caller-queue",  # the correlation id is the task id: not kept
    }
    assert _captured_headers({**properties, "correlation_id": "c9"}, keep_route=True) == {
        "lang": "py",
        REPLY_TO_KEY: "caller-queue",
        CORRELATION_ID_KEY: "c9",
    }
    # A backend that stores by task id: every message has a reply_to, none is kept.
    assert _captured_headers(properties, keep_route=False) == {"lang": "py"}


def _received(client: redis.Redis, queue: str) -> dict:
    (raw,) = client.lrange(queue, 0, -1)
    return json.loads(raw)


@pytest.mark.parametrize("kept", [{}, {CORRELATION_ID_KEY: "c9"}])
def test_a_try_published_again_goes_back_along_the_callers_route(redis_service, kept):
    queue = f"test-{uuid.uuid4().hex[:10]}"
    app = create_app(f"{redis_service}/9", "rpc://", queue)
    client = redis.Redis.from_url(f"{redis_service}/9")
    record = {
        "task_id": "t1",
        "task_name": "lifecycle.add",
        "args": [1, 2],
        "kwargs": {},
        "queue": queue,
        "headers": {"lang": "py", "tenant": "a", REPLY_TO_KEY: "caller-queue", **kept},
        "options": {"embed": EMBED},
    }
    try:
        republish(app, record, 2)
        message = _received(client, queue)
    finally:
        client.delete(queue)
        app.close()
    assert message["properties"]["reply_to"] == "caller-queue"
    assert message["properties"]["correlation_id"] == kept.get(CORRELATION_ID_KEY, "t1")
    # The route travels as properties, never as headers of the task's request.
    assert message["headers"]["tenant"] == "a"
    assert REPLY_TO_KEY not in message["headers"] and CORRELATION_ID_KEY not in message["headers"]
    assert message["headers"]["retries"] == 1


def test_a_result_stored_from_another_process_names_the_callers_queue():
    request = caller_request("t1", {REPLY_TO_KEY: "caller-queue"})
    assert request is not None
    assert (request.id, request.reply_to, request.correlation_id) == ("t1", "caller-queue", "t1")
    assert caller_request("t1", {CORRELATION_ID_KEY: "c9"}) is None  # no queue: nothing to name
    assert caller_request("t1", None) is None


@pytest.mark.parametrize(
    "backend,why",
    [
        ("", "no result backend is configured"),
        ("rpc://", "the rpc:// result backend answers only the process that sent the task"),
        ("redis://127.0.0.1:6379/10", None),
        ("db+sqlite:///{tmp}/results.sqlite3", None),
    ],
)
def test_which_backends_can_answer_for_another_process(backend, why, tmp_path):
    app = create_app("memory://", backend.format(tmp=tmp_path), "celery")
    try:
        assert unaskable_because(app.backend) == why
    finally:
        app.close()
