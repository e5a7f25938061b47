"""Task heartbeats with real workers: a hung try is stopped and run again, and the
next try resumes from the last details; a killed worker's try resumes too."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from celery_recovery.core.states import TaskState
from celery_recovery.recovery import recovery_for_app
from celery_recovery.store.schema import audit_log
from tests.sweeps.helpers import count, ledger_lines, sweep_until
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def _resumed(ledger: Path, try_number: int):
    for line in ledger_lines(ledger):
        found = re.match(rf"start try={try_number} resumed=(.*) pid=", line)
        if found:
            return json.loads(found.group(1))
    raise AssertionError(f"try {try_number} did not start: {ledger_lines(ledger)}")


def _wait_failed(store, task_id: str, timeout: float) -> list:
    """The task's tries once its latest one is failed."""

    def failed():
        tries = store.tries.history(task_id)
        return tries if tries and tries[-1]["state"] == TaskState.FAILED else None

    return wait_for(failed, timeout, what=f"{task_id}'s last try to fail")


def test_a_try_that_stops_beating_is_stopped_and_retried_and_resumes(
    start_worker, client_app, store_url, tmp_path
):
    # Given a worker, and a task (recovery_heartbeat_timeout=3) that beats twice then hangs
    worker = start_worker(store_url)
    ledger = tmp_path / "ledger.txt"
    began = time.monotonic()
    result = client_app.send_task("lifecycle.beats_then_hangs", (str(ledger),))

    # Then its first try is stopped and the task runs again, within the timeout and a sweep
    assert result.get(timeout=30) == {"step": 2}
    took = time.monotonic() - began
    print(f"hung try stopped and retried: result after {took:.1f}s")
    assert took < 3 + 6, took
    # ... the retry read the last details of the hung try
    assert _resumed(ledger, 2) == {"step": 2}
    assert count(ledger, "done try=1") == 0
    # ... the hung try is recorded with its reason, and on_retry ran once
    tries = recovery_for_app(client_app).store.tries.history(result.id)
    assert tries[0]["state"] == TaskState.UP_FOR_RETRY
    assert tries[0]["state_reason"].startswith("hung: no heartbeat for 3 s"), tries[0]
    wait_for(lambda: count(ledger, "on_retry") == 1, 15, what="on_retry from the outbox")
    assert count(ledger, "on_failure") == 0
    # ... and the worker lives on with a fresh pool process
    assert client_app.send_task("lifecycle.add", (1, 2)).get(timeout=10) == 3
    assert "Traceback" not in worker.log


def test_a_hung_try_with_no_retries_left_fails_once_with_on_failure(
    start_worker, client_app, store_url, tmp_path
):
    start_worker(store_url)
    ledger = tmp_path / "ledger.txt"
    result = client_app.send_task("lifecycle.beats_then_hangs_once", (str(ledger),))
    store = recovery_for_app(client_app).store

    tries = _wait_failed(store, result.id, 20)
    assert len(tries) == 1 and "max_retries (0) exceeded" in tries[0]["state_reason"], tries
    wait_for(lambda: count(ledger, "on_failure") == 1, 15, what="on_failure from the outbox")
    assert count(ledger, "start") == 1 and count(ledger, "on_retry") == 0


def test_a_task_that_hangs_every_time_with_no_max_retries_is_failed_after_the_poison_bound(
    start_worker, client_app, store_url, tmp_path
):
    # Given a worker allowing two runs of a try whose task has max_retries=None
    start_worker(store_url, env={"CELERY_RECOVERY_MAX_LOST_RUNS": "2"})
    ledger = tmp_path / "ledger.txt"
    result = client_app.send_task("lifecycle.always_hangs", (str(ledger),))
    store = recovery_for_app(client_app).store

    # When every try hangs: Then the second is failed, not retried for ever
    tries = _wait_failed(store, result.id, 30)
    assert [t["state"] for t in tries] == [TaskState.UP_FOR_RETRY, TaskState.FAILED], tries
    assert "the poison bound (1 retries) exceeded" in tries[-1]["state_reason"], tries[-1]
    # Each callback once. Not necessarily in order: the fallback sweep runs in a pool
    # process, and the one that claimed try 1's on_retry may be the one stopped for
    # hanging in try 2; its claim is taken over once a sweep judges that process dead.
    wait_for(
        lambda: count(ledger, "on_failure") == 1 and count(ledger, "on_retry") == 1,
        15,
        what="on_retry and on_failure from the outbox",
    )
    assert count(ledger, "start") == 2
    # A delivered callback's row is deleted right after it ran: by then, or a moment later.
    outbox = recovery_for_app(client_app).store.outbox
    wait_for(lambda: outbox.pending_callbacks() == [], 10, what="the outbox emptied")
    assert (count(ledger, "on_failure"), count(ledger, "on_retry")) == (1, 1), "ran again"
    assert (count(ledger, "on_failure"), count(ledger, "on_retry")) == (1, 1)


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_killed_workers_try_resumes_from_its_last_durable_step(
    start_worker, make_client_app, sqlite_url, broker, tmp_path
):
    store_url = sqlite_url
    app = make_client_app(store_url)
    # Given a 20-step task beating its progress on a worker
    victim = start_worker(store_url, name="victim")
    ledger = tmp_path / "ledger.txt"
    result = app.send_task("lifecycle.steps", (str(ledger),))
    wait_for(lambda: count(ledger, "step ") >= 8, 20, what="eight steps")

    # When its whole worker is SIGKILLed mid-way
    victim.kill()
    done_before = count(ledger, "step ")
    start_worker(store_url, name="survivor")

    # Then the recovered try resumes after the last durable step, not from zero
    sweep_until(app, lambda: result.ready(), 60, "the task to finish on the survivor")
    start = result.get(timeout=5)
    print(f"killed after {done_before} steps; the next try resumed from step {start}")
    assert 0 < start <= done_before
    # Beats are written every half second (0.2 s a step): a few steps at most are redone
    assert done_before - start <= 5
    assert count(ledger, "step 19 ") == 1


def test_an_acks_late_hung_trys_message_comes_back_and_is_dropped(
    start_worker, client_app, store_url, tmp_path
):
    # Given acks_late tasks, and a broker that gives unacknowledged messages back after 4 s
    start_worker(store_url, env={"RECOVERY_TEST_ACKS_LATE": "1", "RECOVERY_TEST_VISIBILITY": "4"})
    ledger = tmp_path / "ledger.txt"
    result = client_app.send_task("lifecycle.beats_then_hangs", (str(ledger),))
    assert result.get(timeout=30) == {"step": 2}
    store = recovery_for_app(client_app).store

    # When the hung try's message (never acknowledged: its process was killed) comes back
    def dropped():
        with store.transaction() as conn:
            rows = conn.execute(
                select(audit_log).where(
                    audit_log.c.task_id == result.id, audit_log.c.action == "dropped"
                )
            )
            return [dict(r) for r in rows.mappings()]

    rows = wait_for(dropped, 30, what="the hung try's redelivery to be dropped")

    # Then it is dropped as a delivery of a superseded try, and the task ran twice in all
    assert rows[0]["try_number"] == 1, rows
    assert count(ledger, "start") == 2 and count(ledger, "done") == 1
