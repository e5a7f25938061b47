"""Amazon SQS as the broker (moto's server on this machine), beside Redis.

On SQS a dead worker's unacknowledged messages come back only after the
queue's visibility timeout, and a receive it left open takes the next message
that becomes visible (see :mod:`celery_recovery.messages.dead_receives`): the sweep
publishes a dead worker's tries with a delivery delay that outlasts it, so
they run once, on a live worker, within the wait of one receive; the originals
that come back later are dropped as redundant.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

import boto3
import pytest

from celery_recovery import TaskState
from celery_recovery.messages.dead_receives import MARGIN
from tests.apps.lifecycle import SQS_WAIT_TIME
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import (
    count,
    ledger_lines,
    reserved_ids,
    succeeded_tries,
    sweep_counting,
)
from tests.workers import wait_for

pytestmark = pytest.mark.slow

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]
#: The queue's visibility timeout: the dead worker's originals come back this long
#: after it received them.
VISIBILITY = 8
#: How long the sweep holds back a dead worker's tries on SQS (see
#: celery_recovery.messages.dead_receives).
SQS_HOLD = SQS_WAIT_TIME + MARGIN


@pytest.mark.parametrize(
    "store_url,broker,acks_late,pool",
    [
        ("postgresql", "sqs", False, "prefork"),
        ("postgresql", "sqs", True, "prefork"),
        ("postgresql", "sqs", False, "gevent"),
    ],
    indirect=["store_url"],
    ids=["early-ack", "acks-late", "gevent"],
)
def test_a_killed_workers_running_and_prefetched_tasks_run_once_elsewhere(
    client_app, store, start_worker, tmp_path, acks_late, pool
):
    # Concurrency 2, prefetch multiplier 4: two tasks run, two wait in the worker (one
    # on gevent, whose full pool stops its consumer: tests/sweeps/test_pools.py), and it still
    # asks the broker for more: on SQS a receive is open when it is killed.
    held = 1 if pool == "gevent" else 2
    env = {"RECOVERY_TEST_PREFETCH": "4"}
    if acks_late:
        env["RECOVERY_TEST_ACKS_LATE"] = "1"
    env["RECOVERY_TEST_VISIBILITY"] = str(VISIBILITY)
    doomed = start_worker(name="doomed", pool=pool, concurrency=2, env=env)
    ledgers = [tmp_path / f"ledger{i}" for i in range(2 + held)]
    # Long on their first try (killed), short once published again.
    results = [client_app.send_task("lifecycle.ledger_sleep", (str(p), 60, 0.2)) for p in ledgers]
    ids = {r.id for r in results}

    def running() -> set[str]:
        return {
            r.id
            for r in results
            if any(t["state"] == TaskState.RUNNING for t in store.tries.history(r.id))
        }

    wait_for(
        lambda: len(running()) == 2 and reserved_ids(store) >= ids - running(),
        20,
        what=f"two tasks running and {held} held",
    )
    prefetched = ids - running()
    survivor = start_worker(name="survivor", pool=pool, concurrency=2, env=env)
    doomed.kill()
    killed = time.monotonic()

    total, _ = sweep_counting(
        client_app,
        lambda: all(r.ready() for r in results),
        ZOMBIE + SWEEP + SQS_HOLD + 20,
        "every task to finish on the survivor",
    )
    took = time.monotonic() - killed
    print(f"\nsqs, {pool}, acks_late={acks_late}: kill to the last task done: {took:.1f}s")
    assert took <= ZOMBIE + 2 * SWEEP + SQS_HOLD + 4, took
    # Each published again once, as the next try: none went to a dead receive and
    # came back only as a lost message.
    assert total.lost_republished == 0 and total.lost_messages == 0, total
    assert total.republished + total.reserved_republished == 2 + held, total
    for result in results:
        tries = succeeded_tries(store, result.id)
        assert [(t["try_number"], t["state"]) for t in tries] == [
            (1, TaskState.UP_FOR_RETRY),
            (2, TaskState.SUCCESS),
        ], tries
    # SQS hands the dead worker's unacknowledged originals out again once the
    # visibility timeout passes (the prefetched ones; with acks_late the running
    # ones too): each is dropped, none runs a body again.
    originals = len(results) if acks_late else len(prefetched)
    wait_for(
        lambda: survivor.log.count("dropping stale delivery") >= originals,
        VISIBILITY + 15,
        what=f"{originals} originals to come back and be dropped",
    )
    for result, ledger in zip(results, ledgers, strict=True):
        starts = 1 if result.id in prefetched else 2
        assert count(ledger, "start") == starts, ledger_lines(ledger)
        assert count(ledger, "done") == 1, ledger_lines(ledger)


#: The receive wait of the test below: longer than the time the sweep takes to publish a
#: dead worker's tries again, so that the receive the worker left open is still waiting.
LONG_WAIT = 6


@pytest.mark.parametrize("store_url,broker", [("postgresql", "sqs")], indirect=["store_url"])
def test_tries_published_again_do_not_go_to_the_receive_the_dead_worker_left_open(
    client_app, store, start_worker, tmp_path
):
    # The sweeping app and the worker wait as long in each receive.
    client_app.conf.broker_transport_options = {
        **client_app.conf.broker_transport_options,
        "wait_time_seconds": LONG_WAIT,
    }
    env = {"RECOVERY_TEST_PREFETCH": "4", "RECOVERY_TEST_SQS_WAIT": str(LONG_WAIT)}
    doomed = start_worker(name="doomed", concurrency=1, env=env)
    ledgers = [tmp_path / "running", tmp_path / "prefetched"]
    results = [client_app.send_task("lifecycle.ledger_sleep", (str(p), 60, 0.2)) for p in ledgers]
    # Killed right after it took the second message: the worker had at once asked SQS
    # for more, and that receive waits on the server until LONG_WAIT is over.
    wait_for(lambda: results[1].id in reserved_ids(store), 20, what="the prefetched message")
    doomed.kill()
    killed = time.monotonic()
    sweep_counting(
        client_app,
        lambda: {t["try_number"] for r in results for t in store.tries.history(r.id)} == {1, 2},
        ZOMBIE + 2 * SWEEP + 5,
        "both tries to be published again",
    )
    assert time.monotonic() - killed < LONG_WAIT - 1, "published after the open receive ended"
    # Only now a live worker asks: whatever the dead worker's receive took, it would not get.
    start_worker(name="survivor", concurrency=2, env=env)
    total, _ = sweep_counting(
        client_app,
        lambda: all(r.ready() for r in results),
        LONG_WAIT + MARGIN + 15,
        "both tasks to run on the survivor, not later than the open receive's wait",
    )
    took = time.monotonic() - killed
    print(f"\nsqs, {LONG_WAIT}s receives: kill to both tasks finished: {took:.1f}s")
    assert total.lost_republished == 0, total
    for ledger in ledgers:
        assert count(ledger, "done") == 1, ledger_lines(ledger)


@pytest.mark.parametrize("store_url,broker", [("postgresql", "sqs")], indirect=["store_url"])
def test_a_message_taken_by_a_consumer_that_vanished_is_published_again(
    make_client_app, store_url, store, start_worker, tmp_path, queue, broker_urls
):
    # What a receive left open by a killed worker does to a message published just
    # then: it is in flight to nobody until the visibility timeout.  The lost-message
    # sweep publishes it again; the original, when it comes back, is dropped.
    client_app = make_client_app(store_url, queued_timeout=3)
    ledger = tmp_path / "ledger"
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 0.1))
    published = time.monotonic()
    sqs = boto3.client(
        "sqs", endpoint_url=f"http://{urlparse(broker_urls[0]).netloc.split('@')[-1]}"
    )
    queue_url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    taken = sqs.receive_message(
        QueueUrl=queue_url, WaitTimeSeconds=5, VisibilityTimeout=VISIBILITY
    ).get("Messages")
    assert taken, "the message was not in the queue"
    worker = start_worker(name="survivor", concurrency=1)

    total, _ = sweep_counting(client_app, result.ready, 20, "the lost message to run")
    print(f"\nsqs: a taken message ran {time.monotonic() - published:.1f}s after its publish")
    assert total.lost_republished == 1, total
    tries = succeeded_tries(store, result.id)
    assert [(t["try_number"], t["state"]) for t in tries] == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.SUCCESS),
    ]
    assert "message lost" in tries[0]["state_reason"]
    wait_for(
        lambda: "dropping stale delivery" in worker.log,
        VISIBILITY + 15,
        what="the original to come back and be dropped",
    )
    assert count(ledger, "start") == 1 and count(ledger, "done") == 1, ledger_lines(ledger)
