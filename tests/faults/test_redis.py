"""Redis (broker, result backend and lock store at once) restarted mid-run.

Workers reconnect and keep processing; an in-flight ``@recoverable`` charge
completes exactly once; every task ends ``success`` in the store.  Without
persistence the restart also forgets every queued message and stored result:
the lost-message sweep sends the forgotten messages again.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from celery_recovery import JobType, TaskState
from celery_recovery.store import Store
from celery_recovery.store.schema import reservations
from tests.faults.helpers import TaskStream, wait_all_succeeded
from tests.sweeps.helpers import count, ledger_lines
from tests.workers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def broker_urls(private_redis):
    """The test's app and workers use the private Redis for everything Redis does."""
    return f"{private_redis.url}/0", f"{private_redis.url}/1"


@pytest.mark.parametrize(
    "private_redis", [True, False], ids=["aof", "no-persistence"], indirect=True
)
def test_redis_restart_mid_run_loses_nothing_and_charges_once(
    private_redis, pg_url, make_client_app, start_worker, tmp_path
):
    # A short queued_timeout lets the test's sweeps re-send what a restart forgot.
    client = make_client_app(pg_url, queued_timeout=3)
    store = Store(pg_url)
    for i in (1, 2):
        start_worker(store_url=pg_url, name=f"w{i}")
    # Each worker's main process and two pool processes.
    wait_for(lambda: len(store.jobs.list_jobs(JobType.WORKER)) == 6, what="the workers' jobs")
    ledger = tmp_path / "ledger"
    charge = client.send_task("lifecycle.charge", (str(ledger), "o1", 3))
    wait_for(lambda: count(ledger, "run o1"), 15, what="the charge to start")

    with TaskStream(client) as stream:
        stream.wait_completed(20, 20, "tasks before the restart")
        down = private_redis.restart()
        stream.wait_completed(40, 40, f"workers to keep processing after a {down:.1f}s restart")
    ids = [charge.id, *(r.id for r in stream.results)]
    took = wait_all_succeeded(store, ids, 60, sweep_app=client)
    # A message a worker had fetched but not acknowledged when its connection broke
    # waits in Redis's unacked hash for the visibility timeout (an hour): the
    # lost-message sweep re-sends it (as it does every forgotten one).
    resent = sum(1 for task_id in ids if len(store.tries.history(task_id)) > 1)
    print(f"redis down {down:.1f}s; {len(ids)} tasks final {took:.1f}s later, {resent} re-sent")

    assert count(ledger, "run o1") == 1, ledger_lines(ledger)
    if private_redis.persistent:
        # The lock store kept the completed key: a duplicate returns the result unrun.
        again = client.send_task("lifecycle.charge", (str(ledger), "o1", 3))
        # Read the backend directly: the client's result subscription may not have
        # been renewed after the restart (Celery's concern, not ours).
        meta = wait_for(
            lambda: (m := client.backend.get_task_meta(again.id))["status"] == "SUCCESS" and m,
            15,
            what="the duplicate's result",
        )
        assert meta["result"]["order"] == "o1"
        assert count(ledger, "run o1") == 1, ledger_lines(ledger)
    assert store.tries.history(charge.id)[-1]["state"] == TaskState.SUCCESS
    store.dispose()


def test_messages_a_worker_held_when_its_connection_broke_are_not_taken_for_held(
    private_redis, pg_url, make_client_app, start_worker
):
    # Given one worker busy with a long task and a second task waiting in its prefetch
    # buffer (recorded as reserved by that live worker)
    client = make_client_app(pg_url, queued_timeout=3)
    store = Store(pg_url)
    worker = start_worker(store_url=pg_url, name="w1", concurrency=1)
    busy = client.send_task("lifecycle.sleep_for", (4,))
    waiting = client.send_task("lifecycle.add", (1, 2))

    def reserved() -> set[str]:
        with store.transaction() as conn:
            return {r.task_id for r in conn.execute(select(reservations))}

    wait_for(lambda: waiting.id in reserved(), 15, what="the waiting task's reservation")
    # When Redis restarts without persistence: the worker reconnects and forgets what
    # it held, and Redis forgot the messages
    private_redis.restart()
    # Then the worker's reservations go with its connection, and the lost-message sweep
    # sends the forgotten task again instead of taking it for one a live worker holds
    wait_for(lambda: not reserved(), 15, what="the reservations of the reconnected worker")
    wait_all_succeeded(store, [busy.id, waiting.id], 60, sweep_app=client)
    assert worker.proc.poll() is None, worker.log  # the same worker, reconnected
    assert store.tries.history(waiting.id)[-1]["state"] == TaskState.SUCCESS
    store.dispose()
