"""A fresh delivery's claim, written by the real write-behind writer on both stores.

A pool process claims a delivery published moments ago narrow and lets its
writer add the message when the batch is taken: a try that ended for good by
then is written without it (its publisher's record brings it), one still
running or sent back to the queue carries it, in case its process and its
publisher's buffered record are both lost.  The kill tests (tests/deliveries/test_canvas.py)
run the same path in real workers.
"""

from __future__ import annotations

import time
import uuid

from celery_recovery.core.records import Transition, WriteKind
from celery_recovery.core.states import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.records import AWAITING_PUBLISHER, claim_from_request
from celery_recovery.runtime.health import StoreHealth
from celery_recovery.runtime.write_behind import WriteBehindWriter
from tests.builders import queued
from tests.messages.test_claim_records import task_with_request


def _fresh_task(task_id: str):
    """A task whose request its publisher stamped just now."""
    return task_with_request(time.time(), task_id)


def _claim(writer: WriteBehindWriter, task) -> str:
    claim = claim_from_request(task, utcnow(), "job-a", message_when_written=True)
    writer.submit(WriteKind.RUNNING, claim)
    return task.request.id


def _ended(state: TaskState) -> dict:
    now = utcnow()
    return {"state": state, "ended_at": now, "updated_at": now}


def _writer(store) -> WriteBehindWriter:
    return WriteBehindWriter(store.tries, StoreHealth("test"), flush_interval=30, claim_interval=30)


def test_a_try_that_succeeded_before_its_claim_was_written_is_written_without_its_message(store):
    writer = _writer(store)
    task_id = _claim(writer, _fresh_task(uuid.uuid4().hex))
    writer.finish(task_id, 1, _ended(TaskState.SUCCESS))
    assert writer.flush(10)
    (row,) = store.tries.history(task_id)
    assert row["state"] == TaskState.SUCCESS and row["job_id"] == "job-a"
    assert row["args"] is None and row["kwargs"] is None and row["headers"] is None
    assert row["republish_error"] == AWAITING_PUBLISHER
    # Its publisher's record brings the message, the outcome stays.
    store.tries.apply_writes(
        [("queued", queued(task_id, args=[1, 2], republishable=True, republish_error=None))]
    )
    (row,) = store.tries.history(task_id)
    assert row["state"] == TaskState.SUCCESS and row["args"] == [1, 2] and row["republishable"]


def test_a_try_still_running_when_its_claim_is_written_carries_its_message(store):
    writer = _writer(store)
    task_id = _claim(writer, _fresh_task(uuid.uuid4().hex))
    assert writer.flush(10)
    (row,) = store.tries.history(task_id)
    assert row["state"] == TaskState.RUNNING and row["job_id"] == "job-a"
    assert row["args"] == [1, 2] and row["kwargs"] == {"k": "v"}
    assert row["queue"] == "celery" and row["republishable"] and row["republish_error"] is None
    writer.finish(task_id, 1, _ended(TaskState.SUCCESS))
    assert writer.flush(10)
    (row,) = store.tries.history(task_id)
    assert row["state"] == TaskState.SUCCESS and row["args"] == [1, 2]


def test_a_try_sent_back_to_the_queue_before_its_claim_is_written_carries_its_message(store):
    writer = _writer(store)
    task_id = _claim(writer, _fresh_task(uuid.uuid4().hex))
    now = utcnow()
    writer.submit(
        WriteKind.TRANSITION,
        Transition(
            task_id,
            1,
            (TaskState.RUNNING,),
            {"state": TaskState.QUEUED, "job_id": None, "queued_at": now, "updated_at": now},
        ),
    )
    assert writer.flush(10)
    (row,) = store.tries.history(task_id)
    # The lost-message sweep can publish it again from this row alone.
    assert row["state"] == TaskState.QUEUED and row["args"] == [1, 2] and row["republishable"]


def test_a_claim_whose_message_cannot_be_read_is_written_as_it_stands(store):
    writer = _writer(store)
    broken = _fresh_task(uuid.uuid4().hex)
    del broken.request.delivery_info  # reading the message raises in the writer's thread
    task_id = _claim(writer, broken)
    fine_id = _claim(writer, _fresh_task(uuid.uuid4().hex))
    assert writer.flush(10)
    (row,) = store.tries.history(task_id)
    assert row["state"] == TaskState.RUNNING and row["job_id"] == "job-a"
    assert row["args"] is None and row["republish_error"] == AWAITING_PUBLISHER
    (fine,) = store.tries.history(fine_id)
    assert fine["args"] == [1, 2] and fine["republishable"]
