"""An unreachable result backend at a task's start: Celery gives up before the body.

With ``task_track_started`` Celery stores ``STARTED`` before the body; when
that store fails it reports an internal error and acknowledges the message,
so plain Celery loses the task without having run it.  The try goes back to
``queued`` and the lost-message sweep sends it again once the backend answers,
also when Celery managed to store the failure of that start in the meantime.
"""

from __future__ import annotations

import pytest

from celery_recovery import TaskState
from celery_recovery.store import Store
from tests.conftest import BROKER_DB
from tests.sweeps.helpers import count, ledger_lines, sweep_until
from tests.workers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def broker_urls(redis_service, private_redis):
    """The shared Redis as broker; the private one, which the test stops, as backend."""
    return f"{redis_service}/{BROKER_DB}", f"{private_redis.url}/1"


@pytest.mark.parametrize(
    "celery_stored_its_failure", [False, True], ids=["failure-not-stored", "failure-stored"]
)
def test_a_task_celery_gave_up_on_before_its_body_runs_once_later(
    private_redis, pg_url, make_client_app, start_worker, tmp_path, celery_stored_its_failure
):
    client = make_client_app(pg_url, queued_timeout=3)
    store = Store(pg_url)
    ledger = tmp_path / "ledger"
    result = client.send_task("lifecycle.ledger_sleep", (str(ledger), 0))
    private_redis.stop()
    worker = start_worker(
        store_url=pg_url, name="w1", concurrency=1, env={"RECOVERY_TEST_BACKEND_RETRIES": "1"}
    )

    first = wait_for(
        lambda: (h := store.tries.history(result.id)) and h[0]["state_reason"] and h[0],
        30,
        what="the worker to give up on the try",
    )
    assert first["state"] == TaskState.QUEUED, first
    assert "not run: Celery failed before the body started" in first["state_reason"]
    assert "Exception raised outside body" in worker.log
    assert count(ledger, "start") == 0

    private_redis.start()
    if celery_stored_its_failure:
        # A worker whose backend answers again while Celery still retries storing the
        # failure of its own start leaves FAILURE for a body that never ran.
        client.backend.mark_as_failure(result.id, RuntimeError("the backend refused STARTED"))
    sweep_until(
        client,
        lambda: store.tries.history(result.id)[-1]["state"] == TaskState.SUCCESS,
        30,
        "the try sent again to succeed",
    )
    tries = store.tries.history(result.id)
    assert [(t["try_number"], t["state"]) for t in tries] == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.SUCCESS),
    ]
    assert "message lost" in tries[0]["state_reason"]
    assert count(ledger, "start") == 1, ledger_lines(ledger)
    assert client.backend.get_task_meta(result.id)["status"] == "SUCCESS"
    store.dispose()
