"""A task whose worker is SIGKILLed is recovered on another worker, exactly once."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest
import redis

from celery_recovery import JobState, TaskState
from celery_recovery.recovery import recovery_for_app
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import (
    count,
    ledger_lines,
    restore_unacked,
    run_concurrently,
    running_try,
    sweep_until,
    try_started,
)
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.compat]

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]


# The two brokers lose and redeliver differently: Redis restores an unacknowledged
# message only after its visibility timeout, RabbitMQ requeues it as soon as the
# dead worker's connection closes.
# RabbitMQ runs on the PostgreSQL store only, to keep the suite short; so does the store
# through PgBouncer in transaction mode.
BOTH_BROKERS = pytest.mark.parametrize(
    "store_url,broker",
    [
        ("sqlite", "redis"),
        ("postgresql", "redis"),
        ("postgresql", "rabbitmq"),
        ("pgbouncer", "redis"),
    ],
    indirect=["store_url"],
)


@BOTH_BROKERS
def test_sigkilled_task_completes_on_another_worker_exactly_once(
    client_app, store, start_worker, tmp_path
):
    ledger = tmp_path / "ledger"
    doomed = start_worker(name="doomed", concurrency=1)
    # Long enough to be killed while it runs; short once recovered.
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 6, 0.1))
    first = running_try(store, result.id)
    start_worker(name="survivor", concurrency=1)
    doomed.kill()
    killed = time.monotonic()

    sweep_until(
        client_app, lambda: try_started(store, result.id, 2), ZOMBIE + SWEEP + 15, "try 2 to start"
    )
    recovered_after = time.monotonic() - killed
    assert recovered_after <= ZOMBIE + SWEEP + 5, recovered_after
    assert result.get(timeout=30) == 6

    tries = wait_for(
        lambda: (t := store.tries.history(result.id)) and t[-1]["state"] == TaskState.SUCCESS and t,
        10,
        what="try 2 to succeed",
    )
    assert [(t["try_number"], t["state"]) for t in tries] == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.SUCCESS),
    ]
    assert "worker lost" in tries[0]["state_reason"] and tries[0]["recovered_at"]
    assert tries[1]["job_id"] != first["job_id"]
    assert store.jobs.get_job(first["job_id"])["state"] == JobState.FAILED
    assert count(ledger, "start") == 2 and count(ledger, "done") == 1, ledger_lines(ledger)


def test_exhausted_retries_fail_the_task_and_run_on_failure_once(
    client_app, store, start_worker, tmp_path
):
    ledger = tmp_path / "ledger"
    doomed = start_worker(name="doomed", concurrency=1)
    result = client_app.send_task("lifecycle.ledger_sleep_once", (str(ledger), 30))
    running_try(store, result.id)
    doomed.kill()
    recovery = recovery_for_app(client_app)
    wait_for(lambda: store.try_recovery.find_zombies(_now(), ZOMBIE), ZOMBIE + 5, what="the zombie")

    # Two sweeps at once, as two beats or a beat and a worker fallback would.
    reports = run_concurrently(recovery.sweep)

    (only,) = store.tries.history(result.id)
    assert only["state"] == TaskState.FAILED and "max_retries (0) exceeded" in only["state_reason"]
    assert sum(r.failed for r in reports) == 1
    assert sum(r.errors for r in reports) == 0
    recovery.sweep()  # a later pass delivers nothing more
    failures = [line for line in ledger_lines(ledger) if line.startswith("on_failure")]
    assert failures == [f"on_failure LostWorkerError pid={_pid()}"]
    assert store.outbox.pending_callbacks() == []
    # Found by the chaos run: the result backend used to say STARTED forever.
    assert result.state == "FAILURE"
    with pytest.raises(Exception, match="max_retries") as raised:
        result.get(timeout=5)
    assert type(raised.value).__name__ == "LostWorkerError"


def _now():
    from celery_recovery.core.timeutils import utcnow

    return utcnow()


def _pid():
    import os

    return os.getpid()


def _redis_holds_a_copy(app, queue: str) -> bool:
    """A message for ``queue`` waits in it, or is delivered but unacknowledged (kombu keeps
    those in the ``unacked`` hash as ``[message, exchange, routing_key]`` and restores them
    to the queue after the visibility timeout)."""
    client = redis.Redis.from_url(app.conf.broker_url)
    if client.llen(queue):
        return True
    return any(json.loads(held)[2] == queue for held in client.hvals("unacked"))


def _unfinished_tries(store, task_id: str) -> list:
    """Tries a sweep could still act on (queued or running)."""
    return [
        t
        for t in store.tries.history(task_id)
        if t["state"] in (TaskState.QUEUED, TaskState.RUNNING)
    ]


# Redis's visibility-timeout restore, on one store (the behaviour does not depend
# on it); RabbitMQ's immediate requeue is tested in test_redelivery_owner.py.
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_redelivered_original_of_a_recovered_try_does_not_run_again(
    client_app, store, start_worker, tmp_path, broker, queue
):
    # acks_late: Redis restores the killed worker's message after the visibility
    # timeout, while the sweep may already have published try 2; RabbitMQ requeues
    # it at once, before any sweep.  Whichever runs
    # first, the body completes once; every later delivery is dropped.
    visibility = 4
    env = {"RECOVERY_TEST_ACKS_LATE": "1", "RECOVERY_TEST_VISIBILITY": str(visibility)}
    ledger = tmp_path / "ledger"
    doomed = start_worker(name="doomed", concurrency=1, env=env)
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 8))
    running_try(store, result.id)
    survivor = start_worker(name="survivor", concurrency=1, env=env)
    doomed.kill()

    sweep_until(client_app, result.ready, ZOMBIE + SWEEP + 30, "the recovered task")
    # Watch until Redis holds no copy of the message any more, neither queued nor
    # unacknowledged (the killed worker's original, and try 2's own message once it
    # ran past the visibility timeout, are restored and delivered again): every
    # restored copy must have been delivered and must not have run again.
    # (RabbitMQ has no such timeout: its one redelivery came when the worker died.)
    quiet_since: float | None = None
    deadline = time.monotonic() + visibility * 4 + 30
    while True:
        assert count(ledger, "done") == 1, ledger_lines(ledger)
        restore_unacked(client_app, visibility)
        recovery_for_app(client_app).sweep()
        now = time.monotonic()
        quiet = broker != "redis" or not (
            _redis_holds_a_copy(client_app, queue) or _unfinished_tries(store, result.id)
        )
        quiet_since = (quiet_since or now) if quiet else None
        # Quiet for a while: no message was between the queue and the unacked hash.
        if quiet_since is not None and now - quiet_since >= 2:
            break
        assert now < deadline, f"a copy still held: {ledger_lines(ledger)}"
        time.sleep(0.5)
    tries = [(t["try_number"], t["state"]) for t in store.tries.history(result.id)]
    assert tries in (
        [(1, TaskState.SUCCESS)],  # the broker's redelivery claimed the try first
        [(1, TaskState.UP_FOR_RETRY), (2, TaskState.SUCCESS)],  # the sweep did
    ), tries
    assert count(ledger, "start") == 2
    assert "dropping stale delivery" in survivor.log or tries == [(1, TaskState.SUCCESS)]


@BOTH_BROKERS
def test_a_killed_pool_process_requeued_by_its_worker_runs_again_at_once(
    client_app, store, start_worker, tmp_path
):
    # acks_late + task_reject_on_worker_lost: the worker requeues the message of a
    # pool process killed mid-task, and it comes straight back while the dead
    # process's heartbeat is still fresh.  That redelivery is the recovery: it runs.
    env = {"RECOVERY_TEST_ACKS_LATE": "1", "RECOVERY_TEST_REJECT_ON_LOST": "1"}
    ledger = tmp_path / "ledger"
    worker = start_worker(concurrency=1, env=env)
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 2))
    running_try(store, result.id)
    # The try is recorded running just before its body writes 'start': kill it after.
    wait_for(lambda: count(ledger, "start"), 10, what="the first run to start")
    [child] = worker.child_pids()
    os.kill(child, signal.SIGKILL)
    # Dropped as stale, it would be adopted by the sweep and rerun only after
    # zombie_threshold + adoption_timeout (12 s here).
    assert result.get(timeout=FAST_SETTINGS["adoption_timeout"]) == 2
    assert count(ledger, "start") == 2 and count(ledger, "done") == 1
    assert "dropping stale delivery" not in worker.log


@pytest.mark.parametrize("store_url,broker", [("postgresql", "rabbitmq")], indirect=["store_url"])
def test_a_dead_workers_task_requeued_by_rabbitmq_runs_once_on_another_host(
    client_app, store, start_worker, tmp_path
):
    # acks_late: RabbitMQ requeues the message the moment the dead worker's connection
    # closes, while that worker's job still has a fresh heartbeat.  On another host the
    # survivor cannot see that the process is gone (as it can on its own host).
    ack_late = {"RECOVERY_TEST_ACKS_LATE": "1"}
    ledger = tmp_path / "ledger"
    doomed = start_worker(
        name="doomed", concurrency=1, env={**ack_late, "RECOVERY_TEST_HOSTNAME": "host-a"}
    )
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 3))
    running_try(store, result.id)
    survivor = start_worker(
        name="survivor", concurrency=1, env={**ack_late, "RECOVERY_TEST_HOSTNAME": "host-b"}
    )
    doomed.kill()
    killed = time.monotonic()

    sweep_until(client_app, result.ready, ZOMBIE + FAST_SETTINGS["adoption_timeout"] + 30, "it")
    took = time.monotonic() - killed
    # The redelivery waits for the dead job's heartbeat to go stale (two intervals)
    # and runs: no zombie sweep, no adoption timeout (zombie_threshold +
    # adoption_timeout, 10 minutes by default, when it was dropped instead).
    assert "dropping stale delivery" not in survivor.log
    assert took < ZOMBIE + 3, took
    assert result.get(timeout=5) == 3
    assert count(ledger, "start") == 2 and count(ledger, "done") == 1, ledger_lines(ledger)


@pytest.mark.parametrize(
    "store_url,broker", [("sqlite", "redis"), ("postgresql", "rabbitmq")], indirect=["store_url"]
)
def test_a_task_whose_worker_dies_as_it_starts_is_recovered_though_that_worker_published_it(
    client_app, store, start_worker, tmp_path
):
    """A task publishes a child, which a sibling process starts at once and whose start
    kills the whole worker: the child's message is acknowledged (early ack) and its
    publisher's record was still buffered in a process that died too.  The child's
    claim is committed before its body runs, so the zombie sweep recovers it."""
    ledger = tmp_path / "ledger"
    doomed = start_worker(name="doomed", concurrency=2)
    child_id = f"child-{uuid.uuid4().hex}"
    client_app.send_task("lifecycle.spawn", (str(ledger), child_id))
    wait_for(lambda: doomed.proc.poll() is not None, 20, what="the child to end its worker")
    start_worker(name="survivor", concurrency=1)
    child = client_app.AsyncResult(child_id)
    sweep_until(client_app, child.ready, ZOMBIE + SWEEP + 20, "the child to be recovered")
    assert child.get(timeout=5) == 2
    # Each try ran once: the first died as it started, the second was the sweep's.
    assert [line.split()[1] for line in ledger_lines(ledger)] == ["try=1", "try=2"]
    tries = store.tries.history(child_id)
    assert [(t["try_number"], t["state"]) for t in tries][:1] == [(1, TaskState.UP_FOR_RETRY)]
    assert "worker lost" in tries[0]["state_reason"], tries[0]["state_reason"]
