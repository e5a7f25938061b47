"""Worker and beat processes are jobs whose heartbeats advance until they die."""

from __future__ import annotations

import signal
import time

import pytest

from celery_recovery import JobState, JobType, TaskState
from tests.workers import wait_for

pytestmark = pytest.mark.slow


def heartbeats(store, job_type=JobType.WORKER):
    return {j["id"]: j["latest_heartbeat"] for j in store.jobs.list_jobs(job_type)}


def test_each_pool_process_is_a_job_whose_heartbeat_advances(store, start_worker):
    worker = start_worker(concurrency=2)
    first = wait_for(lambda: (h := heartbeats(store)) and len(h) == 3 and h, what="three jobs")
    jobs = store.jobs.list_jobs(JobType.WORKER)
    # Each pool process, and the main process that takes the messages.
    assert sorted(j["pid"] for j in jobs) == sorted([worker.proc.pid, *worker.child_pids()])
    # Heartbeat interval is 0.5 s: within a few seconds each job has moved on twice.
    for _ in range(2):
        previous = heartbeats(store)
        wait_for(
            lambda prev=previous: all(heartbeats(store)[k] > prev[k] for k in prev),
            5,
            what="every heartbeat to advance",
        )
    assert all(heartbeats(store)[k] > first[k] for k in first)


def test_sigkilled_worker_stops_beating_and_its_task_stays_running(client_app, store, start_worker):
    worker = start_worker(concurrency=1)
    result = client_app.send_task("lifecycle.sleep_for", (60,))
    (record,) = wait_for(
        lambda: [t for t in store.tries.history(result.id) if t["state"] == TaskState.RUNNING],
        what="the task to be running",
    )
    worker.kill()
    frozen = store.jobs.get_job(record["job_id"])["latest_heartbeat"]
    # Several heartbeat intervals later nothing has moved: detection is the sweep's job.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        assert store.jobs.get_job(record["job_id"])["latest_heartbeat"] == frozen
        time.sleep(0.25)
    job = store.jobs.get_job(record["job_id"])
    assert job["state"] == JobState.RUNNING and job["end_date"] is None
    assert store.tries.history(result.id)[0]["state"] == TaskState.RUNNING


def test_beat_is_a_job_with_a_heartbeat(store, start_beat):
    beat = start_beat(schedule_sweep=False)
    (job,) = wait_for(lambda: store.jobs.list_jobs(JobType.BEAT), 20, what="the beat job")
    wait_for(
        lambda: store.jobs.get_job(job["id"])["latest_heartbeat"] > job["latest_heartbeat"],
        5,
        what="beat's heartbeat to advance",
    )
    beat.send_signal(signal.SIGTERM)
    beat.wait(15)
    ended = wait_for(
        lambda: (j := store.jobs.get_job(job["id"]))["state"] == JobState.SUCCESS and j,
        10,
        what="beat's job to end",
    )
    assert ended["end_date"] is not None
