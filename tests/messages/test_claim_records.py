"""What a worker's claim carries: the message only when its publisher's record may be missing.

Pure logic of :func:`celery_recovery.messages.records.claim_from_request`; the store side
(a narrow claim landing before or after the publisher's row) is in
tests/store/test_store.py, and the canvas kill tests exercise a worker that
publishes a chord body and dies with it running.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from celery_recovery.core.process_id import HOSTNAME
from celery_recovery.core.records import COMPLETE_WHEN_WRITTEN
from celery_recovery.core.states import TaskState
from celery_recovery.core.timeutils import utcnow
from celery_recovery.messages.headers import PUBLISHED_ON_HEADER
from celery_recovery.messages.records import (
    AWAITING_PUBLISHER,
    NARROW_CLAIM_AFTER,
    claim_from_request,
    published_alongside,
)


def task_with_request(published_at: float | None, task_id: str = "t1") -> SimpleNamespace:
    """A task whose ``request`` holds what a pool process's does for ``proj.add(1, 2, k="v")``,
    stamped by its publisher at ``published_at`` (None: unstamped)."""
    request = SimpleNamespace(
        id=task_id,
        retries=0,
        args=[1, 2],
        kwargs={"k": "v"},
        callbacks=None,
        errbacks=None,
        chain=None,
        chord=None,
        root_id=task_id,
        parent_id=None,
        group=None,
        group_index=None,
        shadow=None,
        origin="gen@host",
        delivery_info={"exchange": "", "routing_key": "celery", "priority": 0},
        eta=None,
        expires=None,
        hostname="celery@host",
    )
    if published_at is not None:
        request.recovery_published_at = published_at
    return SimpleNamespace(name="proj.add", request=request)


def test_a_delivery_older_than_the_publishers_flush_is_claimed_without_its_message():
    task = task_with_request(time.time() - NARROW_CLAIM_AFTER - 1)
    record = claim_from_request(task, utcnow(), "job-a")
    assert record["state"] == TaskState.RUNNING and record["job_id"] == "job-a"
    assert "args" not in record and "kwargs" not in record and "headers" not in record
    # Should the claim create the try, it must not be published again from nothing.
    assert record["republishable"] is False and record["republish_error"] == AWAITING_PUBLISHER
    assert abs(record["queued_at"].timestamp() - task.request.recovery_published_at) < 1e-5


def test_a_fresh_delivery_carries_its_message_as_its_publisher_may_not_have_written_it():
    record = claim_from_request(task_with_request(time.time()), utcnow(), "job-a")
    assert record["args"] == "[1, 2]" and record["kwargs"] == '{"k": "v"}'
    assert record["republishable"] is True


def test_a_message_from_a_publisher_without_celery_recovery_carries_its_message():
    record = claim_from_request(task_with_request(None), utcnow(), "job-a")
    assert record["args"] == "[1, 2]" and record["republishable"] is True


def test_a_fresh_delivery_run_in_a_pool_leaves_its_message_for_the_writer_to_decide():
    record = claim_from_request(
        task_with_request(time.time()), utcnow(), "job-a", message_when_written=True
    )
    assert "args" not in record and record["republishable"] is False
    complete = record.pop(COMPLETE_WHEN_WRITTEN)
    still_running = dict(record)
    complete(still_running)
    assert still_running["args"] == "[1, 2]" and still_running["kwargs"] == '{"k": "v"}'
    assert still_running["republishable"] is True and still_running["republish_error"] is None
    assert still_running["state"] == TaskState.RUNNING and still_running["job_id"] == "job-a"


def _fresh_claim_written_in(state: TaskState) -> dict:
    """A fresh delivery's claim as the writer writes it, its try by then in ``state``."""
    record = claim_from_request(
        task_with_request(time.time()), utcnow(), "job-a", message_when_written=True
    )
    complete = record.pop(COMPLETE_WHEN_WRITTEN)
    record["state"] = state
    complete(record)
    return record


@pytest.mark.parametrize("ended", [TaskState.SUCCESS, TaskState.FAILED])
def test_a_try_that_ended_for_good_before_its_claim_is_written_gets_no_message(ended):
    record = _fresh_claim_written_in(ended)
    assert "args" not in record and record["republish_error"] == AWAITING_PUBLISHER


@pytest.mark.parametrize("state", [TaskState.QUEUED, TaskState.UP_FOR_RETRY])
def test_a_try_that_may_be_published_again_gets_its_message_when_written(state):
    record = _fresh_claim_written_in(state)
    assert record["args"] == "[1, 2]" and record["republishable"] is True


def test_an_old_or_unstamped_delivery_is_decided_at_once_whatever_the_caller_asks():
    old = task_with_request(time.time() - NARROW_CLAIM_AFTER - 1)
    record = claim_from_request(old, utcnow(), "job-a", message_when_written=True)
    assert COMPLETE_WHEN_WRITTEN not in record and "args" not in record
    record = claim_from_request(
        task_with_request(None), utcnow(), "job-a", message_when_written=True
    )
    assert COMPLETE_WHEN_WRITTEN not in record and record["args"] == "[1, 2]"


def test_only_a_fresh_delivery_from_a_job_on_this_host_is_claimed_before_its_body():
    now = time.time()

    def request(**headers):
        return SimpleNamespace(**headers)

    here = {PUBLISHED_ON_HEADER: HOSTNAME}
    assert published_alongside(request(recovery_published_at=now - 0.01, **here), now)
    old = now - NARROW_CLAIM_AFTER - 0.1
    assert not published_alongside(request(recovery_published_at=old, **here), now)
    elsewhere = {PUBLISHED_ON_HEADER: "another-host"}
    assert not published_alongside(request(recovery_published_at=now, **elsewhere), now)
    # A publisher that is not a job (a web process, a script) stamps no host.
    assert not published_alongside(request(recovery_published_at=now), now)
    assert not published_alongside(request(**here), now)  # no publish time: not ours
