"""Beat runs the sweep; when beat dies, the workers take over, one process at a time."""

from __future__ import annotations

import os
import signal
import time

import pytest

from celery_recovery import JobState, JobType, TaskState
from tests.conftest import FAST_SETTINGS
from tests.sweeps.helpers import count, ledger_lines, running_try, try_started
from tests.workers import wait_for

pytestmark = pytest.mark.slow

ZOMBIE = FAST_SETTINGS["zombie_threshold"]
SWEEP = FAST_SETTINGS["sweep_interval"]


def test_beat_scheduled_sweep_recovers_a_killed_worker(
    client_app, store, start_worker, start_beat, tmp_path
):
    ledger = tmp_path / "ledger"
    start_beat()
    doomed = start_worker(name="doomed", concurrency=1)
    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 5, 0.1))
    running_try(store, result.id)
    start_worker(name="survivor", concurrency=1)
    doomed.kill()
    # No sweep from the test: beat's schedule sends the sweep task to the survivor.
    assert result.get(timeout=ZOMBIE + SWEEP + 20) == 5
    assert count(ledger, "done") == 1, ledger_lines(ledger)
    assert store.tries.history(result.id)[0]["state"] == TaskState.UP_FOR_RETRY


# Store-independent behaviour: one store keeps the suite's time for the cases that differ.
@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_with_beat_killed_workers_sweep_one_at_a_time(
    client_app, store, start_worker, start_beat, tmp_path
):
    ledger = tmp_path / "ledger"
    beat = start_beat()
    doomed = start_worker(name="doomed", concurrency=1)
    wait_for(lambda: store.checkins.last_completed("sweep"), 20, what="beat's first sweep")
    (beat_job,) = wait_for(lambda: store.jobs.list_jobs(JobType.BEAT), 10, what="beat's job")
    os.killpg(beat.pid, signal.SIGKILL)
    beat.wait(10)

    result = client_app.send_task("lifecycle.ledger_sleep", (str(ledger), 30))
    running_try(store, result.id)
    others = [start_worker(name=f"other{i}", concurrency=2) for i in range(2)]
    doomed.kill()
    killed = time.monotonic()

    wait_for(
        lambda: try_started(store, result.id, 2),
        3 * SWEEP + ZOMBIE + 15,
        interval=0.1,
        what="fallback recovery",
    )
    assert time.monotonic() - killed <= 3 * SWEEP + ZOMBIE + 5
    # The dead beat is itself detected from its heartbeat.
    wait_for(
        lambda: store.jobs.get_job(beat_job["id"])["state"] == JobState.FAILED,
        10,
        what="beat's job to be marked failed",
    )
    # One fallback holder at a time: a single process announced it took over.
    takeovers = [
        w.name for w in others for line in w.log.splitlines() if "this worker sweeps every" in line
    ]
    assert len(takeovers) == 1, takeovers
    assert count(ledger, "start") == 2
