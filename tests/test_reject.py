"""Celery's ``Reject(requeue=True)``: the message goes back to the queue, and so does the try."""

from __future__ import annotations

import pytest

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from tests.workers import wait_for

pytestmark = pytest.mark.compat


@pytest.mark.slow
def test_a_message_rejected_with_requeue_runs_again_as_the_same_try(
    make_client_app, sqlite_url, start_worker
):
    client = make_client_app(sqlite_url)
    start_worker(store_url=sqlite_url, concurrency=1)

    result = client.send_task("lifecycle.reject_once")

    assert result.get(timeout=20) == "second delivery"
    store = recovery_for_app(client).store
    wait_for(
        lambda: (
            [(t["try_number"], t["state"]) for t in store.tries.history(result.id)]
            == [(1, TaskState.SUCCESS)]
        ),
        10,
        what="the try to be recorded as succeeded",
    )
