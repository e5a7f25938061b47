"""A task with 10 MB of arguments: recorded without them, with the reason, and never
a crashed signal handler (docs/security.md, "Oversized and unserialisable arguments")."""

from __future__ import annotations

import pytest

from celery_recovery import TaskState
from celery_recovery.messages.records import MAX_RECORDED_PAYLOAD
from tests.sweeps.helpers import sweep_until
from tests.workers import flush_publisher, wait_for

pytestmark = pytest.mark.slow

BLOB = "x" * (10 * 1024 * 1024)


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_task_with_10_mb_of_arguments_runs_and_a_sweep_fails_it_with_the_reason(
    client_app, store, start_worker
):
    worker = start_worker(concurrency=1)

    # It runs and succeeds; its record says why it cannot be published again.
    done = client_app.send_task("lifecycle.measure", (BLOB,))
    assert done.get(timeout=60) == len(BLOB)
    flush_publisher(client_app)
    [record] = wait_for(
        lambda: [t for t in store.tries.history(done.id) if t["state"] == TaskState.SUCCESS],
        20,
        what="the recorded success",
    )
    assert record["republishable"] is False
    assert record["args"] is None and record["kwargs"] is None
    assert (
        f"over the {MAX_RECORDED_PAYLOAD} bytes kept for re-publish" in (record["republish_error"])
    )
    assert record["republish_error"].startswith("cannot be published again: arguments are")

    # Its worker dies while it runs: the sweep fails it with that reason.
    killed = client_app.send_task("lifecycle.measure", (BLOB, 60))
    wait_for(
        lambda: [t["state"] for t in store.tries.history(killed.id)] == [TaskState.RUNNING],
        30,
        what="the second task to start",
    )
    log = worker.log
    assert "Traceback" not in log and "raised" not in log, log[-4000:]
    worker.kill()
    [failed] = sweep_until(
        client_app,
        lambda: [t for t in store.tries.history(killed.id) if t["state"] == TaskState.FAILED],
        30,
        "the zombie to be failed",
    )
    assert "worker lost" in failed["state_reason"]
    assert "cannot be published again: arguments are" in failed["state_reason"]
    assert len(store.tries.history(killed.id)) == 1  # never published again
