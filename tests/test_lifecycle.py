"""A real worker records every try's lifecycle in the store (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from celery_recovery import JobState, JobType, TaskState
from celery_recovery.store import Store
from tests.workers import flush_publisher, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.compat]


def final_tries(store: Store, task_id: str, count: int = 1, timeout: float = 15.0):
    """The task's tries once ``count`` of them have reached a finished state."""

    def finished():
        tries = store.tries.history(task_id)
        done = [t for t in tries if t["state"] not in (TaskState.QUEUED, TaskState.RUNNING)]
        return tries if len(done) >= count else None

    return wait_for(finished, timeout, what=f"{count} finished tries of {task_id}")


@pytest.mark.parametrize(
    "store_url,pool",
    [
        ("sqlite", "prefork"),
        ("sqlite", "solo"),
        ("postgresql", "prefork"),
        ("postgresql", "solo"),
        ("pgbouncer", "prefork"),  # the store through PgBouncer in transaction mode
    ],
    indirect=["store_url"],
)
def test_successful_task_goes_queued_running_success(client_app, store, start_worker, pool):
    worker = start_worker(pool=pool, concurrency=1 if pool == "solo" else 2)
    result = client_app.send_task("lifecycle.add", (2, 3))
    assert result.get(timeout=15) == 5
    flush_publisher(client_app)

    (record,) = final_tries(store, result.id)
    assert record["state"] == TaskState.SUCCESS
    assert record["try_number"] == 1
    assert record["task_name"] == "lifecycle.add"
    assert record["args"] == [2, 3] and record["republishable"] is True
    assert record["queue"] == client_app.conf.task_default_queue
    assert record["queued_at"] <= record["started_at"] <= record["ended_at"]
    job = store.jobs.get_job(record["job_id"])
    assert job is not None, "the record names the job that ran it"
    assert job["job_type"] == JobType.WORKER and worker.owns(job["node_name"])
    pids = worker.child_pids() if pool == "prefork" else [worker.proc.pid]
    assert job["pid"] in pids and record["worker_pid"] == job["pid"]


def test_raising_task_ends_failed_with_its_error(client_app, store, start_worker):
    start_worker()
    result = client_app.send_task("lifecycle.boom", ("it broke",))
    with pytest.raises(ValueError):
        result.get(timeout=15)
    (record,) = final_tries(store, result.id)
    assert record["state"] == TaskState.FAILED
    assert record["error"] == "ValueError: it broke"


def test_celery_retry_keeps_each_try_as_history(client_app, store, start_worker):
    start_worker()
    result = client_app.send_task("lifecycle.retry_once")
    assert result.get(timeout=15) == 1
    first, second = final_tries(store, result.id, count=2)
    assert (first["try_number"], first["state"]) == (1, TaskState.UP_FOR_RETRY)
    assert "first try always fails" in first["state_reason"]
    assert (second["try_number"], second["state"]) == (2, TaskState.SUCCESS)
    assert second["queued_at"] is not None, "the retry's publish was recorded by the worker"


def test_tasks_published_without_recovery_are_recorded_at_start(
    make_client_app, store, start_worker
):
    start_worker()
    plain = make_client_app(None)
    result = plain.send_task("lifecycle.add", (1, 1))
    assert result.get(timeout=15) == 2
    (record,) = final_tries(store, result.id)
    assert record["state"] == TaskState.SUCCESS and record["queued_at"] is None
    assert record["args"] == [1, 1] and record["queue"] == plain.conf.task_default_queue


def test_non_json_arguments_still_run_and_say_they_cannot_be_republished(
    client_app, store, start_worker
):
    start_worker()
    result = client_app.send_task("lifecycle.describe", (frozenset({1}),), serializer="pickle")
    assert result.get(timeout=15) == "frozenset({1})"
    flush_publisher(client_app)
    (record,) = final_tries(store, result.id)
    assert record["state"] == TaskState.SUCCESS
    assert record["republishable"] is False
    assert "not JSON-serialisable" in record["republish_error"]


def test_revoked_running_task_is_recorded_revoked(client_app, store, start_worker):
    start_worker()
    result = client_app.send_task("lifecycle.sleep_for", (30,))
    wait_for(lambda: result.state == "STARTED", 15, what="the task to start")
    client_app.control.revoke(result.id, terminate=True)
    # The killed pool process may report a failure first; the revoke overrides it.
    (record,) = wait_for(
        lambda: [t for t in store.tries.history(result.id) if t["state"] == TaskState.REVOKED],
        15,
        what="the try to be revoked",
    )
    assert "terminated" in record["state_reason"]


def test_warm_shutdown_ends_worker_jobs_as_success(client_app, store, start_worker):
    worker = start_worker()
    client_app.send_task("lifecycle.add", (1, 2)).get(timeout=15)
    # The main process (it takes the messages) and the two pool processes.
    wait_for(lambda: len(store.jobs.list_jobs(JobType.WORKER)) == 3, what="three worker jobs")
    assert worker.stop() == 0
    jobs = wait_for(
        lambda: (
            (
                ended := [
                    j
                    for j in store.jobs.list_jobs(JobType.WORKER)
                    if j["state"] == JobState.SUCCESS
                ]
            )
            and len(ended) == 3
            and ended
        ),
        what="jobs to end",
    )
    assert all(j["end_date"] is not None for j in jobs)
