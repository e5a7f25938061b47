"""Claim: nothing read from the store is unpickled (docs/security.md, "Stored payloads").

Someone with write access to the database plants pickles where the package
keeps message payloads: a zombie's and a lost message's arguments, a failure
callback's payload, a trigger's keyword arguments.  Unpickling any of them
would create a marker file.  Every code path that reads them (re-publishing,
callback delivery, trigger loading) must leave the file absent, fail that one
item with a clear reason, and go on with the others.
"""

from __future__ import annotations

import pytest
from sqlalchemy import update

from celery_recovery import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store.schema import EncodedJSON, UnreadableJSON, callbacks, task_records
from celery_recovery.triggers.loading import TriggerLoadError, load_trigger
from tests.builders import make_queued, make_zombie
from tests.security.hostile import pickle_base64, pickle_text


def plant_args(store, task_id: str, text: str) -> None:
    with store.transaction() as conn:
        conn.execute(
            update(task_records)
            .where(task_records.c.task_id == task_id)
            .values(args=EncodedJSON(text), kwargs=EncodedJSON(text))
        )


def test_a_zombie_with_pickled_arguments_is_failed_not_unpickled(
    make_client_app, store_url, store, tmp_path
):
    recovery = recovery_for_app(make_client_app(store_url))
    marker = tmp_path / "unpickled"
    make_zombie(store, "pickled")
    make_zombie(store, "honest", job_id="deadjob2")
    plant_args(store, "pickled", pickle_text(marker))

    report = recovery.sweep()

    assert not marker.exists()
    pickled = store.tries.history("pickled")
    assert [t["state"] for t in pickled] == [TaskState.FAILED]
    assert "not valid JSON" in pickled[0]["state_reason"]
    assert isinstance(pickled[0]["args"], UnreadableJSON)
    # The bad row did not stop recovery of the good one.
    assert [t["state"] for t in store.tries.history("honest")] == [
        TaskState.UP_FOR_RETRY,
        TaskState.QUEUED,
    ]
    assert report.zombies == 2 and report.errors == 0


def test_a_lost_message_with_pickled_arguments_is_failed_not_republished(
    make_client_app, store_url, store, tmp_path
):
    recovery = recovery_for_app(make_client_app(store_url, queued_timeout=1.0))
    marker = tmp_path / "unpickled"
    make_queued(store, "pickled")
    plant_args(store, "pickled", pickle_text(marker))

    recovery.sweep()

    assert not marker.exists()
    [only] = store.tries.history("pickled")
    assert only["state"] == TaskState.FAILED and "not valid JSON" in only["state_reason"]


@pytest.mark.parametrize(
    "planted",
    ["protocol 0 pickle text", "kombu bytes holding a pickle"],
)
def test_a_pickled_callback_payload_is_dropped_without_running_anything(
    make_client_app, store_url, store, tmp_path, planted
):
    recovery = recovery_for_app(make_client_app(store_url))
    marker = tmp_path / "unpickled"
    calls = []
    recovery.add_failure_listener(lambda **event: calls.append(event))
    text = (
        pickle_text(marker)
        if planted.startswith("protocol")
        else f'{{"args": {{"__type__": "bytes", "__value__": "{pickle_base64(marker)}"}}}}'
    )
    with store.transaction() as conn:
        conn.execute(
            callbacks.insert().values(
                task_id="planted",
                try_number=1,
                kind="failure",
                payload=EncodedJSON(text),
                created_at=utcnow(),
            )
        )

    report = recovery.sweep()

    assert not marker.exists()
    assert store.outbox.pending_callbacks() == []
    if planted.startswith("protocol"):
        # Not JSON: nobody is called with it.
        assert report.callbacks_failed == 1 and calls == []
    else:
        # JSON whose "args" decode to bytes: delivered as bytes, never unpickled.
        assert report.callbacks_delivered == 1 and calls[0]["task_id"] == "planted"


@pytest.mark.parametrize("kind", ["pickle text", "kombu bytes", "unknown kombu type"])
def test_trigger_kwargs_holding_a_pickle_are_refused_never_unpickled(kind, tmp_path):
    marker = tmp_path / "unpickled"
    planted = {
        "pickle text": pickle_text(marker),
        "kombu bytes": {"__type__": "bytes", "__value__": pickle_base64(marker)},
        "unknown kombu type": {"__type__": "pickle", "__value__": pickle_base64(marker)},
    }[kind]
    with pytest.raises(TriggerLoadError, match="cannot rebuild trigger"):
        load_trigger(
            "celery_recovery.triggers.temporal.DateTimeTrigger",
            {"moment": planted},
            ("celery_recovery",),
        )
    assert not marker.exists()
