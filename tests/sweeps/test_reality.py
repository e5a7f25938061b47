"""The sweep asks reality first: backend outcomes win, lost messages are sent again."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from celery_recovery import JobType, TaskState
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store import Store
from tests.proxy import TcpProxy
from tests.sweeps.helpers import sweep_until
from tests.workers import wait_for

pytestmark = pytest.mark.slow


def test_success_whose_write_was_lost_is_reconciled_not_rerun(
    pg_url, make_client_app, start_worker, tmp_path
):
    proxy = TcpProxy("127.0.0.1", 5432).start()
    worker_url = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    client = make_client_app(pg_url)
    store = Store(pg_url)
    worker = start_worker(store_url=worker_url, concurrency=1)
    result = client.send_task("lifecycle.sleep_for", (2,))
    wait_for(
        lambda: any(t["state"] == TaskState.RUNNING for t in store.tries.history(result.id)),
        15,
        what="the claim",
    )
    proxy.cut()  # the store goes away while the task runs: its success write is buffered
    assert result.get(timeout=15) == 2  # the result backend has SUCCESS
    worker.kill()  # ...and the buffered write dies with the worker

    report = sweep_until(
        client,
        lambda: store.tries.history(result.id)[0]["state"] != TaskState.RUNNING,
        20,
        "the zombie to be reconciled",
    )
    (record,) = store.tries.history(result.id)
    assert record["state"] == TaskState.SUCCESS
    assert "result backend reports SUCCESS" in record["state_reason"]
    assert report is True
    store.dispose()


def delete_queued_messages(broker: str, url: str, queue: str) -> int:
    """Make the broker lose every message waiting in ``queue``; how many it had."""
    if broker == "redis":
        return redis.Redis.from_url(url).delete(queue)
    with Connection(url) as conn:
        return conn.default_channel.queue_purge(queue)


@pytest.mark.parametrize(
    "store_url,broker",
    [("sqlite", "redis"), ("postgresql", "redis"), ("postgresql", "rabbitmq")],
    indirect=["store_url"],
)
def test_message_deleted_from_the_broker_is_published_again_and_completes(
    make_client_app, store_url, store, start_worker, broker, broker_urls, queue
):
    client = make_client_app(store_url, queued_timeout=2)
    result = client.send_task("lifecycle.add", (20, 22))
    assert recovery_for_app(client).flush()
    # The message vanishes between publisher and worker.
    assert delete_queued_messages(broker, broker_urls[0], queue) == 1
    start_worker()

    sweep_until(client, result.ready, 20, "the lost message to be re-sent and run")
    assert result.get(timeout=5) == 42
    tries = wait_for(
        lambda: (t := store.tries.history(result.id)) and t[-1]["state"] == TaskState.SUCCESS and t,
        10,
        what="try 2 to succeed",
    )
    assert [(t["try_number"], t["state"]) for t in tries] == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.SUCCESS),
    ]
    assert "message lost" in tries[0]["state_reason"]
    assert tries[1]["publish_count"] == 2


@pytest.mark.parametrize("left_behind", ["RETRY", "STARTED"])
def test_lost_message_of_a_later_try_is_published_again(
    left_behind, make_client_app, pg_url, start_worker, broker_urls, queue
):
    """Found by the chaos run: a retry's message (or a reset's) prefetched by a worker
    that was then SIGKILLed stayed queued forever, because the backend still showed what
    the earlier try left there: RETRY, or STARTED by the dead process."""
    store = Store(pg_url)
    client = make_client_app(pg_url, queued_timeout=2)
    result = client.send_task("lifecycle.add", (20, 22))
    assert recovery_for_app(client).flush()
    # Given a queued try whose message vanished, while the result backend still shows
    # the earlier try's state
    assert redis.Redis.from_url(broker_urls[0]).delete(queue) == 1
    meta = {"hostname": "w9@gone", "pid": 999999} if left_behind == "STARTED" else None
    client.backend.store_result(result.id, meta, left_behind)
    start_worker(store_url=pg_url)

    # When the sweep runs, Then the try is published again and completes
    sweep_until(client, result.ready, 20, "the lost message to be re-sent and run")
    assert result.get(timeout=5) == 42
    tries = wait_for(
        lambda: (t := store.tries.history(result.id)) and t[-1]["state"] == TaskState.SUCCESS and t,
        10,
        what="try 2 to succeed",
    )
    assert "message lost" in tries[0]["state_reason"]
    store.dispose()


def lose_until(client, store, queue_url: str, queue: str, task_id: str, done, what: str) -> list:
    """Delete the queue's messages and sweep until ``done(tries)``; the task's tries."""
    recovery = recovery_for_app(client)
    assert recovery.flush()
    broker = redis.Redis.from_url(queue_url)

    def lose_and_sweep():
        broker.delete(queue)
        recovery.sweep()
        return done(store.tries.history(task_id))

    wait_for(lose_and_sweep, 15, interval=0.5, what=what)
    return store.tries.history(task_id)


def test_lost_messages_are_failed_after_the_republish_bound(
    make_client_app, store_url, store, broker_urls, queue
):
    client = make_client_app(store_url, queued_timeout=1, max_republish=1)
    result = client.send_task("lifecycle.add", (1, 1))
    tries = lose_until(
        client,
        store,
        broker_urls[0],
        queue,
        result.id,
        lambda tries: tries[-1]["state"] == TaskState.FAILED,
        "the task to be failed as lost",
    )
    assert [t["state"] for t in tries] == [TaskState.UP_FOR_RETRY, TaskState.FAILED]
    assert "never started" in tries[-1]["state_reason"]


def test_lost_delayed_task_says_its_timeout_ran_from_the_eta(
    make_client_app, store_url, store, broker_urls, queue
):
    client = make_client_app(store_url, queued_timeout=1)
    result = client.send_task("lifecycle.add", (1, 1), countdown=2)
    first, *_ = lose_until(
        client,
        store,
        broker_urls[0],
        queue,
        result.id,
        lambda tries: tries[0]["state"] != TaskState.QUEUED,
        "the delayed task to be found lost",
    )
    assert "not started within 1s of its ETA 20" in first["state_reason"], first["state_reason"]
    assert "of being queued" not in first["state_reason"]


# Store-independent behaviour: one store keeps the suite's time for the cases that differ.
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_live_jobs_are_not_zombies(client_app, store, start_worker):
    start_worker()
    result = client_app.send_task("lifecycle.sleep_for", (4,))
    wait_for(
        lambda: any(t["state"] == TaskState.RUNNING for t in store.tries.history(result.id)),
        15,
        what="the task to run",
    )
    recovery = recovery_for_app(client_app)
    for _ in range(3):
        report = recovery.sweep()
        assert report.zombies == 0 and report.republished == 0
    assert result.get(timeout=15) == 4
    assert len(store.jobs.list_jobs(JobType.WORKER)) == 3  # the main process and two pool processes
