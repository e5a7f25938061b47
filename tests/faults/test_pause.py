"""A worker paused past the zombie threshold (SIGSTOP), then resumed (SIGCONT).

tests/sweeps/test_races.py covers the store side of a late outcome and
tests/locks/test_fencing.py a paused lock holder; this is the whole story with
real workers, as docs/failure-modes.md ("Long GC pause") tells it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from celery_recovery import JobState, JobType, TaskState
from celery_recovery.store import Store
from tests.conftest import FAST_SETTINGS
from tests.faults.helpers import worker_running
from tests.sweeps.helpers import count, ledger_lines, sweep_until
from tests.workers import wait_for

pytestmark = pytest.mark.slow

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]


def try_delivered(store, task_id: str, try_number: int) -> bool:
    """The try reached a worker: it runs, or it waits for the paused attempt's lock
    (postponed back to queued, not counted as a retry)."""
    return any(
        t["try_number"] == try_number
        and (t["state"] != "queued" or (t["state_reason"] or "").startswith("postponed"))
        for t in store.tries.history(task_id)
    )


def test_paused_worker_is_recovered_and_its_late_outcome_does_not_overwrite(
    pg_url, make_client_app, start_worker, tmp_path
):
    client = make_client_app(pg_url)
    store = Store(pg_url)
    workers = [start_worker(store_url=pg_url, name=f"w{i}", concurrency=1) for i in (1, 2)]
    # Each worker's main process and its pool process.
    wait_for(lambda: len(store.jobs.list_jobs(JobType.WORKER)) == 4, what="the workers' jobs")
    ledger = tmp_path / "ledger"
    # The first try sleeps 6 s; its lease (lock_ttl 10 s) outlives the pause.
    result = client.send_task("lifecycle.charge", (str(ledger), "p1", 6))
    paused = worker_running(store, result.id, workers)
    first = store.tries.history(result.id)[0]
    paused_pid = store.jobs.get_job(first["job_id"])["pid"]

    os.killpg(paused.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        sweep_until(
            client, lambda: try_delivered(store, result.id, 2), ZOMBIE + SWEEP + 15, "try 2"
        )
        recovered_after = time.monotonic() - stopped
    finally:
        os.killpg(paused.proc.pid, signal.SIGCONT)
    assert recovered_after <= ZOMBIE + SWEEP + 5, recovered_after
    assert store.jobs.get_job(first["job_id"])["state"] == JobState.FAILED

    # The new try finds the key still held by the paused attempt and waits for it;
    # the paused attempt finishes and the new try returns its stored result.
    outcome = result.get(timeout=30)
    assert outcome["order"] == "p1"
    assert count(ledger, "run p1") == 1, ledger_lines(ledger)

    def settled():
        tries = store.tries.history(result.id)
        return tries[0]["late_state"] and tries[-1]["state"] == TaskState.SUCCESS and tries

    tries = wait_for(settled, 15, what="the late outcome and the final try")
    # The late success is kept beside the recovery; it did not overwrite it.
    assert tries[0]["state"] == TaskState.UP_FOR_RETRY and tries[0]["late_state"] == "success"
    assert "worker lost" in tries[0]["state_reason"]
    assert all(t["late_state"] is None for t in tries[1:])
    assert len(tries) >= 2 and tries[-1]["job_id"] != first["job_id"]

    # The paused process's heartbeat carries on under a new job.
    def new_job():
        return [
            j
            for j in store.jobs.list_jobs(JobType.WORKER)
            if j["pid"] == paused_pid and j["state"] == JobState.RUNNING
        ]

    (again,) = wait_for(new_job, 10, what="the paused process to register a new job")
    assert again["id"] != first["job_id"]
    assert "continuing as job" in paused.log
    print(f"pause recovered {recovered_after:.1f}s after SIGSTOP; {len(tries)} tries")
    store.dispose()
