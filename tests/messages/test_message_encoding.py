"""Arguments and headers are stored in kombu's JSON encoding, exactly.

:func:`celery_recovery.messages.records.encode_json` keeps one C encoder instead of
building one per call (the hot path encodes twice per task); what it writes
must stay what ``kombu.utils.json.dumps`` writes, since a re-publish decodes
it with kombu.  Pure logic: the worker tests record real messages.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.records import capture_publish, encode_json, record_from_capture
from celery_recovery.messages.republish import republish


class _Reduced:
    def __json__(self) -> dict[str, int]:
        return {"reduced": 1}


VALUES: list[Any] = [
    [],
    [1, 2.5, -0.0, 1e300, None, True, False, "text"],
    ("a", "tuple"),
    {"kwarg": "value", "nested": {"list": [1, {"deep": [None]}]}},
    {"unicode": "naïve — ✓ 漢字", "escape": 'quote " and \\ and \n'},
    [datetime(2026, 12, 1, 10, 0, tzinfo=UTC), datetime(2026, 12, 1, 10, 0, 0, 1)],
    [datetime(2026, 12, 1, 10, 0, tzinfo=timezone(timedelta(hours=-5)))],
    [date(2026, 12, 1), time(10, 30, 1)],
    [uuid.UUID("12345678-1234-5678-1234-567812345678"), Decimal("1.10")],
    [b"utf-8 bytes", b"\xff\xfe not utf-8"],
    [_Reduced()],
    [float("nan"), float("inf")],
    {"embed": {"callbacks": None, "errbacks": None, "chain": None, "chord": None}},
    "a bare string",
    42,
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_encoded_as_kombu_encodes_it(value: Any) -> None:
    encoded, reason = encode_json(value)
    assert reason is None
    assert encoded == kombu_dumps(value)


def test_a_value_that_refers_to_itself_is_refused_with_a_reason() -> None:
    value: list[Any] = [1]
    value.append(value)
    encoded, reason = encode_json(value)
    assert encoded is None
    assert reason is not None and "refers to itself" in reason
    # The encoder keeps no state from the failure: the next value encodes as usual.
    assert encode_json({"after": [1]}) == ('{"after": [1]}', None)


def test_a_value_json_cannot_hold_is_refused_with_its_type() -> None:
    encoded, reason = encode_json([frozenset({1})])
    assert encoded is None
    assert reason is not None and "not JSON-serialisable (TypeError" in reason


class _Kwargs(Mapping[str, Any]):
    """A mapping that is not a dict, as a caller may pass for kwargs."""

    def __init__(self, **values: Any) -> None:
        self._values = values

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _publish_record(args: Any, kwargs: Any) -> dict[str, Any]:
    headers = {"id": "t1", "task": "app.add", "retries": 0, "lang": "py", "root_id": "t1"}
    body = (args, kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    capture = capture_publish(headers, body, "", "celery", None, None, utcnow().timestamp())
    assert capture is not None
    return record_from_capture(capture)


def test_a_published_record_keeps_arguments_whatever_their_container() -> None:
    expected = _publish_record([1, 2], {"k": "v"})
    for args, kwargs in (((1, 2), {"k": "v"}), ([1, 2], _Kwargs(k="v"))):
        record = _publish_record(args, kwargs)
        assert (record["args"], record["kwargs"]) == (expected["args"], expected["kwargs"])
        assert kombu_loads(record["args"]) == [1, 2]
        assert kombu_loads(record["kwargs"]) == {"k": "v"}
    empty = _publish_record(None, None)
    assert (empty["args"], empty["kwargs"], empty["republishable"]) == ("[]", "{}", True)
    assert kombu_loads(empty["options"]) == {
        "embed": {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    }
    assert kombu_loads(empty["headers"]) == {"lang": "py", "root_id": "t1"}


def test_celery_headers_at_none_are_left_out_and_the_task_republishes_the_same() -> None:
    # None says what a missing header says to a republish; a custom header at None is
    # the user's own and is kept (the task reads it from its request).
    headers = {
        "id": "t1",
        "task": "app.add",
        "retries": 0,
        "lang": "py",
        "root_id": "r1",
        "parent_id": None,
        "group": None,
        "group_index": None,
        "shadow": None,
        "stamped_headers": None,
        "timelimit": [None, None],
        "ignore_result": True,
        "custom": None,
        "tenant": "a",
    }
    body = ((1,), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    capture = capture_publish(headers, body, "", "celery", None, None, utcnow().timestamp())
    assert capture is not None
    record = record_from_capture(capture)
    stored = kombu_loads(record["headers"])
    assert stored == {
        "lang": "py",
        "root_id": "r1",
        "timelimit": [None, None],
        "ignore_result": True,
        "custom": None,
        "tenant": "a",
    }
    full = {k: v for k, v in headers.items() if k not in ("id", "task", "retries")}
    sent = [_republished({**record, "headers": stored}), _republished({**record, "headers": full})]
    assert sent[0] == sent[1]
    assert sent[0]["headers"] == {"custom": None, "tenant": "a"}
    assert sent[0]["ignore_result"] is True  # as the caller published it


def _republished(record: dict[str, Any]) -> dict[str, Any]:
    sent: dict[str, Any] = {}

    class _App:
        def send_task(self, name: str, **options: Any) -> None:
            sent.update(options, name=name)

    decoded = {key: kombu_loads(record[key]) for key in ("args", "kwargs", "options")}
    republish(_App(), {**record, **decoded}, 2)  # type: ignore[arg-type]
    return sent
