"""A pool process killed under a live worker (the OOM killer's usual victim).

Celery sees the death from the worker's main process.  The try is recorded at
once, the task's callbacks run once through the outbox, no sweep runs it again,
and a task that keeps killing its process stops being redelivered.
"""

from __future__ import annotations

import os
import re
import signal
import time

import celery
import pytest

from celery_recovery import TaskState
from celery_recovery.recovery import recovery_for_app
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import count, ledger_lines, sweep_for, sweep_until
from tests.workers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.compat]

#: Long enough for the killed children's jobs to be judged dead by a sweep.
JUDGED = FAST_SETTINGS["zombie_threshold"] + FAST_SETTINGS["sweep_interval"] + 1

#: Celery 5.7 added ``task_retry_on_worker_lost``; before, the option does nothing.
RETRIES_ON_WORKER_LOST = celery.VERSION >= (5, 7)

#: What each variant of lifecycle.killable leaves its first try in once its process is killed.
KILLED_TRY_ENDS = {
    "killable": TaskState.FAILED,
    "killable_quiet": TaskState.FAILED,  # ignore_result: no FAILURE stored to reconcile from
    # task_retry_on_worker_lost
    "killable_retried": TaskState.UP_FOR_RETRY if RETRIES_ON_WORKER_LOST else TaskState.FAILED,
}


def _first_pid(ledger) -> int | None:
    for line in ledger_lines(ledger):
        found = re.match(r"start try=1 pid=(\d+)", line)
        if found:
            return int(found.group(1))
    return None


def _states(store, task_id: str) -> list[tuple[int, str]]:
    return [(t["try_number"], t["state"]) for t in store.tries.history(task_id)]


def test_a_killed_pool_process_fails_its_try_at_once_and_its_callbacks_run_once(
    client_app, store, start_worker, tmp_path
):
    start_worker(concurrency=len(KILLED_TRY_ENDS))
    ledgers = {name: tmp_path / name for name in KILLED_TRY_ENDS}
    results = {
        name: client_app.send_task(f"lifecycle.{name}", (str(ledgers[name]), 60))
        for name in KILLED_TRY_ENDS
    }
    pids = {
        name: wait_for(lambda n=name: _first_pid(ledgers[n]), 20, what=f"{name} to start")
        for name in KILLED_TRY_ENDS
    }
    # A process killed within its claim's first 20 ms leaves the try queued, for the
    # lost-message sweep (docs/recovery.md); this test is about a try known to run.
    wait_for(
        lambda: all((1, "running") in _states(store, r.id) for r in results.values()),
        10,
        interval=0.01,
        what="the claims to be committed",
    )
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    killed_wall = time.time()

    recorded: dict[str, float] = {}

    def all_recorded() -> bool:
        for name, expected in KILLED_TRY_ENDS.items():
            if name not in recorded and (1, expected) in _states(store, results[name].id):
                recorded[name] = time.monotonic() - killed
        return len(recorded) == len(KILLED_TRY_ENDS)

    wait_for(all_recorded, 10, interval=0.02, what="the killed tries to be recorded")
    print(f"\nkill -> try recorded: {recorded}")
    decided = {
        name: store.tries.history(result.id)[0]["ended_at"].timestamp() - killed_wall
        for name, result in results.items()
    }
    print(f"kill -> try's recorded end: {decided}")
    # Recorded by the worker's main process as Celery reported the death, not found
    # later by a sweep.  Celery's own detection takes 0.05-1 s (idle machine); the
    # buffered write lands within the writer's flush.
    for name, result in results.items():
        first = store.tries.history(result.id)[0]
        assert first["recovered_at"] is None, (name, first["state_reason"])
        assert first["state_reason"].startswith("its pool process died"), first["state_reason"]

    failed = ["killable", "killable_quiet"]
    if RETRIES_ON_WORKER_LOST:
        # task_retry_on_worker_lost: Celery retried it and called on_retry; try 2 runs.
        assert results["killable_retried"].get(timeout=20) == 2
    else:
        failed.append("killable_retried")
    # on_failure (never called by Celery on this path) runs from the outbox.
    sweep_until(
        client_app,
        lambda: all(count(ledgers[n], "on_failure") for n in failed),
        20,
        "on_failure of the killed tasks",
    )
    sweep_for(client_app, JUDGED)

    for name in failed:
        lines = ledger_lines(ledgers[name])
        assert _states(store, results[name].id) == [(1, TaskState.FAILED)], name
        assert count(ledgers[name], "start") == 1, lines  # never run again by a sweep
        assert count(ledgers[name], "on_failure WorkerLostError") == 1, lines
    assert results["killable"].state == "FAILURE"
    # ignore_result: Celery 5.5 and 5.7 store nothing; 5.6 stores the failure all the same.
    quiet = "FAILURE" if celery.VERSION[:2] == (5, 6) else "PENDING"
    assert results["killable_quiet"].state == quiet
    if not RETRIES_ON_WORKER_LOST:
        return
    retried = ledgers["killable_retried"]
    assert _states(store, results["killable_retried"].id) == [
        (1, TaskState.UP_FOR_RETRY),
        (2, TaskState.SUCCESS),
    ]
    assert count(retried, "on_retry WorkerLostError") == 1, ledger_lines(retried)
    assert count(retried, "on_failure") == 0, ledger_lines(retried)
    assert count(retried, "start") == 2, ledger_lines(retried)


# Each store once, and each broker's requeue (Redis restores the rejected message,
# RabbitMQ requeues it), within the suite's time budget.
@pytest.mark.parametrize(
    "store_url,broker", [("sqlite", "redis"), ("postgresql", "rabbitmq")], indirect=["store_url"]
)
def test_a_task_that_kills_its_process_runs_max_retries_plus_one_times_then_fails(
    client_app, store, start_worker, tmp_path
):
    # acks_late + task_reject_on_worker_lost: Celery requeues the message of each
    # killed run, with retries=0 each time; plain Celery runs it for ever.
    ledger = tmp_path / "poison"
    start_worker(concurrency=1)
    started = time.monotonic()
    result = client_app.send_task("lifecycle.poison", (str(ledger),))  # max_retries=2

    wait_for(lambda: result.state == "FAILURE", 30, what="FAILURE in the result backend")
    failed_after = time.monotonic() - started
    assert "WorkerLostError" in repr(result.result)
    sweep_until(client_app, lambda: count(ledger, "on_failure"), 20, "on_failure to run")
    # A few seconds more: the message was acknowledged and does not come back.
    sweep_for(client_app, 3)

    runs = count(ledger, "start")
    print(f"\npoison task: {runs} runs, FAILURE {failed_after:.1f}s after it was sent")
    assert runs == 3, ledger_lines(ledger)
    assert count(ledger, "on_failure WorkerLostError") == 1, ledger_lines(ledger)
    [only] = store.tries.history(result.id)
    assert (only["state"], only["deaths"]) == (TaskState.FAILED, 3), only
    assert "max_retries (2) exceeded" in only["state_reason"]
    assert recovery_for_app(client_app).store.outbox.pending_callbacks() == []
