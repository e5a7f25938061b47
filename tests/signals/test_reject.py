"""Celery's ``Reject``: with requeue the message goes back to the queue, and so does the try;
without, the try ends failed, on every Celery version (5.7 also stores FAILURE and sends
``task_failure`` from the worker's main process; 5.5 and 5.6 store nothing)."""

from __future__ import annotations

import pytest

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from tests.sweeps.helpers import count, ledger_lines, sweep_for
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


@pytest.mark.slow
def test_a_message_rejected_without_requeue_ends_its_try_failed_and_is_not_run_again(
    make_client_app, sqlite_url, start_worker, tmp_path
):
    client = make_client_app(sqlite_url)
    start_worker(store_url=sqlite_url, concurrency=1)
    ledger = tmp_path / "ledger"

    result = client.send_task("lifecycle.reject_for_good", (str(ledger),))

    store = recovery_for_app(client).store
    wait_for(
        lambda: (
            [(t["try_number"], t["state"]) for t in store.tries.history(result.id)]
            == [(1, TaskState.FAILED)]
        ),
        20,
        what="the rejected try to be recorded failed",
    )
    [only] = store.tries.history(result.id)
    assert only["state_reason"] == "the task rejected its message", only
    sweep_for(client, 4)  # nothing brings it back: no sweep, no redelivery
    assert count(ledger, "start") == 1, ledger_lines(ledger)
    assert count(ledger, "on_failure") == 0, ledger_lines(ledger)  # Celery calls none
    assert [t["state"] for t in store.tries.history(result.id)] == [TaskState.FAILED]
